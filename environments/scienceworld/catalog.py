"""ScienceWorld task ids and their official train / dev / test split.

A task id is ``"<task name>/var=<variation>"`` with the package's task name, e.g.
``"boil/var=21"`` or ``"find-animal/var=225"``. ``parse_task_id`` also accepts the package's other
spellings of the task part (``"1-1"``, ``"task-1-boil"``, the paper's long names) and returns the
canonical id. Splits are the simulator's own variation splits (``splits.json``); ids are listed
task by task in the package's task order, variations ascending.
"""

from __future__ import annotations

import functools
import re
from typing import Sequence

from environments.core.base import InvalidTaskError, TaskCatalog
from environments.scienceworld.splits import SPLIT_NAMES, load_splits

# ASCII digits only, at most 9 (int() of thousands of digits raises, and non-ASCII digits are not an id)
_TASK_ID = re.compile(r"^\s*(?P<task>[^/]+?)\s*/\s*var\s*=\s*(?P<var>[0-9]{1,9})\s*$")


def canonical_task_name(name: str) -> str:
    """The package's name for ``name`` (also "1-1", "task-1-boil", "Matter Changes of State (Boiling)")."""
    try:
        from scienceworld.utils import infer_task
    except ImportError:  # the catalog itself does not need the simulator
        infer_task = None
    candidate = infer_task(name) if infer_task is not None else name
    if candidate not in load_splits():
        raise InvalidTaskError(f"unknown ScienceWorld task {name!r}; known: {sorted(load_splits())}")
    return candidate


def parse_task_id(task_id: str) -> tuple[str, int]:
    """``"boil/var=21" -> ("boil", 21)``; raises ``InvalidTaskError`` for unknown tasks or variations."""
    match = _TASK_ID.match(task_id) if isinstance(task_id, str) else None
    if match is None:
        raise InvalidTaskError(f"bad ScienceWorld task id {task_id!r}; expected '<task>/var=<n>', e.g. 'boil/var=21'")
    name = canonical_task_name(match["task"])
    variation = int(match["var"])
    limit = load_splits()[name]["max_variations"]
    if not 0 <= variation < limit:
        raise InvalidTaskError(f"task {name!r} has variations 0..{limit - 1}, not {variation}")
    return name, variation


def make_task_id(name: str, variation: int) -> str:
    return f"{name}/var={variation}"


def split_of(name: str, variation: int) -> str:
    """Which official split a variation belongs to."""
    entry = load_splits()[name]
    for split in SPLIT_NAMES:
        if variation in entry[split]:
            return split
    raise InvalidTaskError(f"variation {variation} of {name!r} is in no split")  # pragma: no cover


class ScienceWorldCatalog(TaskCatalog):
    """All 30 tasks x their official variation splits (3,592 train / 1,796 dev / 1,819 test ids).

    tasks: restrict to these task names (default: all).
    """

    splits = SPLIT_NAMES

    def __init__(self, tasks: Sequence[str] | None = None) -> None:
        self.tasks = [canonical_task_name(t) for t in tasks] if tasks else list(load_splits())

    @functools.lru_cache(maxsize=None)
    def task_ids(self, split: str) -> Sequence[str]:
        if split not in SPLIT_NAMES:
            raise InvalidTaskError(f"unknown split {split!r}; ScienceWorld has {list(SPLIT_NAMES)}")
        table = load_splits()
        return tuple(make_task_id(name, v) for name in self.tasks for v in table[name][split])
