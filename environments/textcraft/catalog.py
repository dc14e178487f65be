"""Deterministic, disjoint train / dev / test TextCraft goals (every goal of crafting depth >= 1).

The dev goals are carved out of the training goals (about a tenth of them), for ablations and
recipe choices, so the test goals stay untouched."""

from __future__ import annotations

import zlib
from typing import Sequence

from environments.core.base import InvalidTaskError, TaskCatalog
from environments.textcraft.world import PREFIX, world

TEST_BUCKETS = 5  # a goal is a test goal when crc32(goal) % 5 == 0 (about a fifth of the goals)


DEV_BUCKETS = 10  # a non-test goal is a dev goal when crc32("dev:" + goal) % 10 == 0


def is_test_goal(task_id: str) -> bool:
    """Split rule: a stable hash of the goal name, so adding goals never moves existing ones."""
    return zlib.crc32(task_id.encode()) % TEST_BUCKETS == 0


def is_dev_goal(task_id: str) -> bool:
    """A training-distribution goal held out of training (never a test goal): a second stable
    hash, independent of the test rule."""
    return not is_test_goal(task_id) and zlib.crc32(f"dev:{task_id}".encode()) % DEV_BUCKETS == 0


class TextCraftCatalog(TaskCatalog):
    """Task ids are goal names (``dark_oak_sign``), sorted by crafting depth, then name."""

    splits = ("train", "dev", "test")

    def __init__(self) -> None:
        crafting = world()
        goals = sorted(crafting.goal_ids, key=lambda g: (crafting.depth[g], g))
        ids = [g.replace(PREFIX, "") for g in goals]
        self._splits = {
            "train": tuple(t for t in ids if not is_test_goal(t) and not is_dev_goal(t)),
            "dev": tuple(t for t in ids if is_dev_goal(t)),
            "test": tuple(t for t in ids if is_test_goal(t)),
        }

    def task_ids(self, split: str) -> Sequence[str]:
        try:
            return self._splits[split]
        except KeyError:
            raise InvalidTaskError(f"unknown split {split!r}; expected one of {sorted(self._splits)}") from None
