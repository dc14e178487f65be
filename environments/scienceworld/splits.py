"""The official ScienceWorld train / dev / test variation splits, stored as a small JSON file.

The splits come from the package's API (``get_variations_train/dev/test`` after ``load`` of each
task). Asking the simulator needs a JVM (seconds for the 30 tasks), so the answer is stored in
``splits.json`` next to this module as ranges, and ``tests/test_env_scienceworld.py`` checks it
against the live API. Regenerate it after a ``scienceworld`` upgrade with::

    python -m environments.scienceworld.splits
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

SPLITS_PATH = Path(__file__).with_name("splits.json")
SPLIT_NAMES = ("train", "dev", "test")


def to_ranges(values: list[int]) -> list[list[int]]:
    """Sorted integers as half-open ``[start, stop)`` runs: ``[0,1,2,5] -> [[0,3],[5,6]]``."""
    ranges: list[list[int]] = []
    for v in sorted(values):
        if ranges and ranges[-1][1] == v:
            ranges[-1][1] = v + 1
        else:
            ranges.append([v, v + 1])
    return ranges


def from_ranges(ranges: list[list[int]]) -> list[int]:
    """The inverse of ``to_ranges``."""
    return [v for start, stop in ranges for v in range(start, stop)]


def query_simulator(sim: Any, tasks: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Ask a live ``scienceworld.ScienceWorldEnv`` for the variation splits of ``tasks`` (default:
    all, in the package's own order from ``tasks.json``: 1-1 boil, 1-2 melt, ...)."""
    from scienceworld.constants import ID2TASK

    known = set(sim.get_task_names())
    numbers = {name: number for number, name in ID2TASK.items()}
    out: dict[str, dict[str, Any]] = {}
    for name in tasks or [n for n in ID2TASK.values() if n in known]:
        task_number = numbers[name]
        sim.load(name, 0, "")
        out[name] = {
            "number": task_number,
            "max_variations": int(sim.get_max_variations(name)),
            "train": to_ranges(list(sim.get_variations_train())),
            "dev": to_ranges(list(sim.get_variations_dev())),
            "test": to_ranges(list(sim.get_variations_test())),
        }
    return out


@functools.lru_cache(maxsize=1)
def load_splits() -> dict[str, dict[str, Any]]:
    """``{task_name: {"number", "max_variations", "train", "dev", "test"}}`` with expanded lists."""
    raw = json.loads(SPLITS_PATH.read_text())
    tasks = raw["tasks"]
    return {
        name: {
            "number": entry["number"],
            "max_variations": entry["max_variations"],
            **{split: from_ranges(entry[split]) for split in SPLIT_NAMES},
        }
        for name, entry in tasks.items()
    }


def main() -> None:
    """Regenerate ``splits.json`` from the installed simulator."""
    from importlib.metadata import version

    from scienceworld import ScienceWorldEnv

    sim = ScienceWorldEnv("", envStepLimit=100)
    try:
        tasks = query_simulator(sim)
    finally:
        sim.close()
    lines = [f"  {json.dumps(name)}: {json.dumps(entry)}" for name, entry in tasks.items()]
    text = '{\n "scienceworld_version": %s,\n "tasks": {\n%s\n }\n}\n' % (
        json.dumps(version("scienceworld")),
        ",\n".join(lines),
    )
    json.loads(text)  # the hand-made layout (one task per line) must stay valid JSON
    SPLITS_PATH.write_text(text)
    total = sum(t["max_variations"] for t in tasks.values())
    print(f"wrote {SPLITS_PATH}: {len(tasks)} tasks, {total} variations")


if __name__ == "__main__":
    main()
