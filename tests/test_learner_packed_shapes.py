"""Packed-row updates pad the token space to buckets (rows to a power of two, columns to a
length bucket capped at ``pack_length``), so batches whose row count and length change every
step (flat groups skipped, longer or shorter episodes) stop compiling new programs once their
buckets are compiled: before, every new ``[B, T]`` compiled the update's gather, derive and
shuffle programs again (four to five programs a step in `experiments/smoke.py:first_trainer_cpu`,
docs/PERFORMANCE.md). The padded rows change nothing: the same parameters and metrics as
the same update on the token space as given."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from agentrl_jax.learner import LearnerConfig, UpdateOptions
from agentrl_jax.learner.layouts import packed_token_space
from learner_helpers import recorded_compiles, tiny_batch, tiny_learner

CFG = LearnerConfig(kl_coef=0.0, entropy_coef=0.0, dtype="float32", remat=False,
                    learning_rate=1e-3, micro_batch_size=2,
                    pack_length=96, logprob_batch_size=2, min_length_bucket=32,
                    advantage_estimator="grpo", shuffle=False)


@pytest.fixture
def compiles():
    with recorded_compiles() as names:
        yield names


def test_token_space_buckets():
    assert packed_token_space(6, 30, CFG) == (8, 32)
    assert packed_token_space(8, 33, CFG) == (8, 64)
    assert packed_token_space(9, 70, CFG) == (16, 96)  # capped at pack_length
    assert packed_token_space(1, 96, CFG) == (1, 96)


def test_new_row_counts_and_lengths_in_the_same_buckets_compile_nothing(compiles):
    learner = tiny_learner(CFG)
    learner.update(tiny_batch(0, 6, 40), UpdateOptions(log=False))  # buckets (8, 64)
    compiles.clear()
    for seed, (b, t) in enumerate([(7, 45), (8, 50), (5, 64)], start=1):
        metrics = learner.update(tiny_batch(seed, b, t), UpdateOptions(log=False))
        assert np.isfinite(metrics["actor/pg_loss"]) and metrics["batch/rows"] == b
    assert compiles == [], compiles


def test_padding_changes_neither_the_update_nor_its_metrics(monkeypatch):
    from agentrl_jax.learner import layouts

    batch = tiny_batch(5, 6, 40)  # padded to (8, 64) by the packed layout
    a, b = tiny_learner(CFG, seed=1), tiny_learner(CFG, seed=1)
    ma = a.update(batch, UpdateOptions(log=False))
    monkeypatch.setattr(layouts, "packed_token_space", lambda rows, length, config:
                        (rows, length))  # the token space as given: no padding
    mb = b.update(batch, UpdateOptions(log=False))
    assert ma.keys() == mb.keys()
    for k in (k for k in ma if not k.startswith("perf/")):  # perf/: timings
        np.testing.assert_allclose(ma[k], mb[k], rtol=2e-5, atol=1e-6, err_msg=k)
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-5, atol=1e-7)
