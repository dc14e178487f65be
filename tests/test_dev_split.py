"""The dev splits: carved from the training distribution, disjoint from train and test, stable."""

import zlib

import pytest

from environments.babyai.catalog import BabyAICatalog
from environments.core.base import InvalidTaskError
from environments.textcraft.catalog import TextCraftCatalog


def test_babyai_dev_split_is_disjoint_and_covers_every_level():
    catalog = BabyAICatalog(train_per_level=5, test_per_level=3, dev_per_level=2)
    train, dev, test = (set(catalog.task_ids(s)) for s in ("train", "dev", "test"))
    assert not (dev & train) and not (dev & test) and not (train & test)
    levels = {t.split("/")[0] for t in train}
    assert {t.split("/")[0] for t in dev} == levels  # every level, two seeds each
    assert len(dev) == 2 * len(levels)
    seeds = sorted({int(t.split("seed=")[1]) for t in dev})
    assert seeds == [500_000, 500_001]  # hand-computed: DEV_SEED_BASE + 0, 1
    assert "dev" in catalog.splits


def test_textcraft_dev_goals_are_carved_out_of_the_training_goals():
    catalog = TextCraftCatalog()
    train, dev, test = (set(catalog.task_ids(s)) for s in ("train", "dev", "test"))
    assert dev and not (dev & train) and not (dev & test)
    # the test split is what it was before the carve (one stable hash of the goal name)
    assert test == {g for g in train | dev | test if zlib.crc32(g.encode()) % 5 == 0}
    # every dev goal satisfies the second hash rule, computed here independently
    assert all(zlib.crc32(f"dev:{g}".encode()) % 10 == 0 for g in dev)
    assert not any(zlib.crc32(f"dev:{g}".encode()) % 10 == 0 for g in train)


def test_an_unknown_split_is_refused_with_the_known_names():
    with pytest.raises(InvalidTaskError, match="dev"):
        BabyAICatalog(train_per_level=1, test_per_level=1, dev_per_level=1).task_ids("validation")
