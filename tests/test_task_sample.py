"""Which tasks an evaluation plays (``training/runtime/task_sample.py``): hand-computed samples,
the real BabyAI / ScienceWorld / MiniWoB splits (every level or task covered, none beyond its
share), the evenly spaced sample's aliasing that it replaces, and the config / task_refs path."""

from __future__ import annotations

import collections

import pytest
from ml_collections import ConfigDict

from agentrl_jax.training.config.experiment import base_config
from agentrl_jax.training.preflight.validate import ConfigError, check_config
from agentrl_jax.training.runtime import services
from agentrl_jax.training.runtime.task_sample import (group_quotas, sample_tasks, spaced_sample,
                                                      stratified_sample, task_group)


def _interleaved(groups: int, seeds: int) -> list[str]:
    """Ids ordered seed-major, as BabyAI's and MiniWoB's catalogs list them."""
    return [f"G{g}/seed={s}" for s in range(seeds) for g in range(groups)]


def test_a_hand_computed_sample():
    ids = _interleaved(3, 4)  # G0/0 G1/0 G2/0 G0/1 ... positions: G0 at 0,3,6,9
    # quotas: 5 // 3 = 1 each, the 2 left to groups 0 and 1 -> [2, 2, 1]; G0 takes its members
    # 0 and 2 (positions 0, 6), G1 its 0 and 2 (1, 7), G2 its 0 (2); in the split's order
    assert stratified_sample(ids, 5) == ["G0/seed=0", "G1/seed=0", "G2/seed=0", "G0/seed=2",
                                         "G1/seed=2"]
    assert spaced_sample(ids, 5) == [ids[0], ids[2], ids[4], ids[7], ids[9]]
    assert stratified_sample(ids, 12) == ids and stratified_sample(ids, 50) == ids
    assert stratified_sample(ids, 2) == ["G0/seed=0", "G1/seed=0"]  # limit < groups
    assert stratified_sample(ids, 0) == []


@pytest.mark.parametrize("sizes, limit, quotas", [
    ([4, 4, 4], 5, [2, 2, 1]),
    ([1, 10, 10], 12, [1, 6, 5]),  # the small group gives all it has, the rest share
    ([3, 3, 3], 4, [2, 1, 1]),
    ([5, 5, 5, 5], 2, [1, 0, 1, 0]),  # fewer than the groups: evenly spaced groups
    ([2, 50], 30, [2, 28]),
])
def test_group_quotas(sizes, limit, quotas):
    assert group_quotas(sizes, limit) == quotas


def test_task_groups():
    assert task_group("BabyAI-GoTo-v0/seed=7") == "BabyAI-GoTo-v0"
    assert task_group("boil/var=21") == "boil" and task_group("dark_oak_sign") == "dark_oak_sign"
    with pytest.raises(ValueError, match="unknown task sample"):
        sample_tasks(["a"], 1, "random")


def _counts(ids: list[str]) -> collections.Counter:
    return collections.Counter(task_group(t) for t in ids)


@pytest.mark.parametrize("family, split", [("babyai", "test"), ("babyai", "dev"),
                                           ("miniwob", "test"), ("miniwob", "train"),
                                           ("scienceworld", "test")])
@pytest.mark.parametrize("limit", [32, 100, 128, 200])
def test_real_splits_are_covered_group_by_group(family, split, limit):
    from environments.registry import FAMILIES

    ids = list(FAMILIES.get(family).catalog_factory().task_ids(split))
    sizes = _counts(ids)
    picked = stratified_sample(ids, limit)
    counts = _counts(picked)
    assert len(picked) == len(set(picked)) == limit and set(picked) <= set(ids)
    assert len(counts) == min(limit, len(sizes))
    # no group over its share while another with ids left is below it (water-filling)
    short = [g for g in counts if counts[g] < sizes[g]]
    if short:
        assert max(counts.values()) - min(counts[g] for g in short) <= 1


def test_the_evenly_spaced_sample_aliases_on_babyai():
    """What evaluations read before: 100 of BabyAI's 4,800 test ids are 2 of its 96 levels."""
    from environments.registry import FAMILIES

    ids = list(FAMILIES.get("babyai").catalog_factory().task_ids("test"))
    assert len(_counts(ids)) == 96
    assert len(_counts(spaced_sample(ids, 100))) == 2
    assert len(_counts(spaced_sample(ids, 128))) == 64
    assert len(_counts(stratified_sample(ids, 100))) == 96


class _Client:
    def __init__(self, ids):
        self.ids = ids

    async def tasks(self, split):
        return self.ids


async def test_task_refs_samples_by_the_kind_given():
    ids = _interleaved(4, 25)
    stratified = await services.task_refs({"e": _Client(ids)}, "test", 10)
    spaced = await services.task_refs({"e": _Client(ids)}, "test", 10, sample="spaced")
    assert len(_counts([t.task_id for t in stratified])) == 4
    assert len(_counts([t.task_id for t in spaced])) == 2  # stride 10 over a period of 4
    assert [t.task_id for t in spaced] == spaced_sample(ids, 10)


def test_the_setting_is_checked():
    config = base_config()
    assert config.train.eval_sample == "stratified"
    config.train = ConfigDict({**config.train.to_dict(), "eval_sample": "random"})
    with pytest.raises(ConfigError, match="train.eval_sample"):
        check_config(config)
