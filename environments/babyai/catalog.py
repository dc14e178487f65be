"""Deterministic, disjoint train / dev / test BabyAI tasks: every level with its own seed ranges.

The dev split is drawn from the training distribution (the same levels, seeds no other split
uses) and is what ablations and recipe choices read, so the test split stays untouched."""

from __future__ import annotations

from typing import Sequence

from environments.babyai.levels import level_names, task_id
from environments.core.base import InvalidTaskError, TaskCatalog

TRAIN_SEED_BASE = 0
TRAIN_PER_LEVEL = 500
TEST_SEED_BASE = 1_000_000  # train seeds stay below 10**6, so the splits never share a layout
TEST_PER_LEVEL = 50
DEV_SEED_BASE = 500_000  # above every train seed, below every test seed
DEV_PER_LEVEL = 50


class _LevelSeedIds(Sequence[str]):
    """Task ids ``level/seed=s`` with levels interleaved: index i -> level i % L, seed base + i // L.

    Interleaving makes any prefix of the split cover every level (as AgentGym's data_idx did).
    """

    def __init__(self, levels: Sequence[str], seed_base: int, per_level: int) -> None:
        self._levels = tuple(levels)
        self._seed_base = seed_base
        self._len = len(self._levels) * per_level

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._len))]
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError(index)
        n = len(self._levels)
        return task_id(self._levels[index % n], self._seed_base + index // n)


class BabyAICatalog(TaskCatalog):
    """Train: seeds 0..499 of each level; dev: seeds 500,000..500,049; test: seeds
    1,000,000..1,000,049 of each level."""

    splits = ("train", "dev", "test")

    def __init__(self, train_per_level: int = TRAIN_PER_LEVEL, test_per_level: int = TEST_PER_LEVEL,
                 dev_per_level: int = DEV_PER_LEVEL) -> None:
        levels = level_names()
        self._splits = {
            "train": _LevelSeedIds(levels, TRAIN_SEED_BASE, train_per_level),
            "dev": _LevelSeedIds(levels, DEV_SEED_BASE, dev_per_level),
            "test": _LevelSeedIds(levels, TEST_SEED_BASE, test_per_level),
        }

    def task_ids(self, split: str) -> Sequence[str]:
        try:
            return self._splits[split]
        except KeyError:
            raise InvalidTaskError(f"unknown split {split!r}; expected one of {sorted(self._splits)}") from None
