"""The MiniWoB++ tasks this text interface supports, and their deterministic seeds.

A task id is ``"<task>/seed=<n>"`` (e.g. ``"click-button/seed=7"``). Three disjoint splits of
every task's seeds:

* dev: seeds ``DEV_SEEDS`` (950 .. 999), carved out of the training seeds and held out of training,
  for ablations and recipe choices (MiniWoB's own data mode is "train" for them: the training
  distribution);
* train: seeds ``0 .. train_seeds-1`` less the dev seeds (950 per task by default);
* test: seeds ``TEST_SEED_BASE .. TEST_SEED_BASE+test_seeds-1``.

``split_of_seed`` says which split a seed is in (the environment reports it in ``info["split"]``).
Ids are interleaved across tasks (index ``i`` is task ``i % T`` with the ``i // T``-th seed of the
split), so any prefix of a split covers every task.

Only tasks whose goal can be reached with ``click`` / ``type`` / ``select`` / ``press`` on elements
of the text observation are listed (no drawing, dragging, colours, shapes or pixel positions); the
rule-based expert (``expert.py``) solves each of them from the observation text alone.
"""

from __future__ import annotations

import re
from typing import Sequence

from environments.core.base import InvalidTaskError, TaskCatalog

SUPPORTED_TASKS: tuple[str, ...] = (
    "click-test",
    "click-test-2",
    "click-button",
    "click-button-sequence",
    "click-link",
    "click-dialog",
    "click-dialog-2",
    "click-checkboxes",
    "click-option",
    "click-tab",
    "click-tab-2",
    "click-widget",
    "click-collapsible-nodelay",
    "choose-list",
    "enter-text",
    "enter-text-2",
    "enter-text-dynamic",
    "enter-password",
    "focus-text",
    "focus-text-2",
    "login-user",
    "unicode-test",
)
TEST_SEED_BASE = 1_000_000
DEFAULT_TRAIN_SEEDS = 1000  # the training seed range 0..999, of which DEV_SEEDS are held out
DEFAULT_TEST_SEEDS = 50
#: every task's dev seeds: a fixed block of the training range, never a train or test seed
DEV_SEEDS = range(950, 1000)
SPLITS = ("train", "dev", "test")

# ASCII digits only, at most 18 (int() of thousands of digits raises, and non-ASCII digits are not an id)
_TASK_ID = re.compile(r"^\s*(?P<task>(?:miniwob/)?[a-z0-9-]+)\s*(?:/\s*seed\s*=\s*(?P<seed>[0-9]{1,18})\s*)?$", re.ASCII)


def parse_task_id(task_id: str, seed: int | None = None, tasks: Sequence[str] = SUPPORTED_TASKS) -> tuple[str, int]:
    """``"click-button/seed=7" -> ("click-button", 7)``; a bare task name takes ``seed`` (default 0)."""
    match = _TASK_ID.match(task_id) if isinstance(task_id, str) else None
    if match is None:
        raise InvalidTaskError(f"bad MiniWoB task id {task_id!r}; expected '<task>/seed=<n>', e.g. 'click-button/seed=7'")
    task = match["task"].removeprefix("miniwob/").removesuffix("-v1")
    if task not in tasks:
        raise InvalidTaskError(f"unsupported MiniWoB task {task!r}; supported: {list(tasks)}")
    if match["seed"] is not None:
        return task, int(match["seed"])
    if seed is not None and seed < 0:
        raise InvalidTaskError(f"seeds are >= 0, got {seed}")
    return task, 0 if seed is None else int(seed)


def make_task_id(task: str, seed: int) -> str:
    return f"{task}/seed={seed}"


def split_of_seed(seed: int) -> str:
    """``"test"`` for seeds >= ``TEST_SEED_BASE``, ``"dev"`` for ``DEV_SEEDS``, else ``"train"``."""
    if seed >= TEST_SEED_BASE:
        return "test"
    return "dev" if seed in DEV_SEEDS else "train"


def data_mode_of_seed(seed: int) -> str:
    """MiniWoB++'s own data mode for an episode (``core.setDataMode``): ``"test"`` for test seeds,
    ``"train"`` for train and dev seeds (dev is a carve of the training distribution)."""
    return "test" if split_of_seed(seed) == "test" else "train"


class MiniWoBCatalog(TaskCatalog):
    """Per supported task: the seeds ``0 .. train_seeds-1`` that are not dev seeds (train), the
    ``DEV_SEEDS`` (dev) and ``test_seeds`` seeds from ``TEST_SEED_BASE`` (test)."""

    splits = SPLITS

    def __init__(
        self,
        tasks: Sequence[str] | None = None,
        train_seeds: int = DEFAULT_TRAIN_SEEDS,
        test_seeds: int = DEFAULT_TEST_SEEDS,
    ) -> None:
        self.tasks = tuple(tasks) if tasks else SUPPORTED_TASKS
        unknown = [t for t in self.tasks if t not in SUPPORTED_TASKS]
        if unknown:
            raise InvalidTaskError(f"unsupported MiniWoB tasks {unknown}")
        if not 0 <= train_seeds <= TEST_SEED_BASE or not 0 <= test_seeds:
            raise InvalidTaskError(f"train_seeds must be in 0..{TEST_SEED_BASE} and test_seeds >= 0, "
                                   f"got {train_seeds} and {test_seeds}")
        self._seeds: dict[str, Sequence[int]] = {
            "train": tuple(s for s in range(train_seeds) if s not in DEV_SEEDS),
            "dev": DEV_SEEDS,
            "test": range(TEST_SEED_BASE, TEST_SEED_BASE + test_seeds),
        }
        self.counts = {split: len(seeds) for split, seeds in self._seeds.items()}
        self._ids: dict[str, tuple[str, ...]] = {}

    def seeds(self, split: str) -> Sequence[int]:
        """The seeds of ``split``, ascending (each one's ``split_of_seed`` is ``split``)."""
        if split not in self._seeds:
            raise InvalidTaskError(f"unknown split {split!r}; MiniWoB has {list(self._seeds)}")
        return self._seeds[split]

    def task_ids(self, split: str) -> Sequence[str]:
        if split not in self._ids:
            self._ids[split] = tuple(make_task_id(task, seed) for seed in self.seeds(split) for task in self.tasks)
        return self._ids[split]
