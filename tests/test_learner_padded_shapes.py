"""Padded-row updates on a CPU mesh round the micro-batches of a mini-batch up to a power of
two (``layouts.padded_token_space``): there the train step skips passes without loss tokens
and the log-prob passes skip chunks of padding rows, so the extra rows cost nothing, and row
counts that change every step (flat groups skipped) stop compiling a new train step, gather,
forward and shuffle each step. The extra padding rows change neither the parameters nor the
metrics of an update."""

from __future__ import annotations

import jax
import numpy as np

from agentrl_jax.learner import LearnerConfig, UpdateOptions
from agentrl_jax.learner import layouts
from agentrl_jax.sharding.mesh import make_mesh
from learner_helpers import recorded_compiles, tiny_batch, tiny_learner

CFG = LearnerConfig(kl_coef=0.0, entropy_coef=0.0, dtype="float32", remat=False,
                    learning_rate=1e-3, micro_batch_size=2,
                    pack_length=0, logprob_batch_size=2, min_length_bucket=32,
                    advantage_estimator="grpo", shuffle=False)


def test_row_buckets_on_a_cpu_mesh():
    mesh = make_mesh(fsdp=1, devices=jax.devices()[:1])
    assert layouts.skips_padding_passes(CFG, mesh, local=False)
    # micro-batches of 2 rows: 3 -> 4 of them; 5 -> 8; lengths to the bucket
    assert layouts.padded_token_space(6, 40, CFG, mesh) == (8, 64)
    assert layouts.padded_token_space(9, 30, CFG, mesh) == (16, 32)
    assert layouts.padded_token_space(2, 64, CFG, mesh) == (2, 64)
    two_minis = CFG.replace(mini_batches=2)
    assert layouts.padded_token_space(10, 64, two_minis, mesh) == (16, 64)  # 2 x (3 -> 4) x 2
    one_row_micro = CFG.replace(micro_batch_size=1)  # passes of a whole micro-batch: no skipping
    assert not layouts.skips_padding_passes(one_row_micro, mesh, local=False)
    assert layouts.padded_token_space(6, 40, one_row_micro, mesh) == (6, 64)
    # process-local rows: the log-prob passes run padding chunks too, so no rounding
    assert not layouts.skips_padding_passes(CFG, mesh, local=True)
    assert layouts.padded_token_space(6, 40, CFG, mesh, local=True) == (6, 64)


def test_new_row_counts_in_the_same_bucket_compile_nothing():
    learner = tiny_learner(CFG)
    learner.update(tiny_batch(0, 6, 40), UpdateOptions(log=False))  # rows 8, length 64
    with recorded_compiles() as compiles:
        for seed, b in enumerate([7, 5, 8], start=1):
            metrics = learner.update(tiny_batch(seed, b, 50), UpdateOptions(log=False))
            assert np.isfinite(metrics["actor/pg_loss"]) and metrics["batch/rows"] == b
    assert compiles == [], compiles


def test_padding_rows_change_neither_the_update_nor_its_metrics(monkeypatch):
    batch = tiny_batch(5, 6, 40)  # rows 8 with the power-of-two rounding, 6 without
    a, b = tiny_learner(CFG, seed=1), tiny_learner(CFG, seed=1)
    ma = a.update(batch, UpdateOptions(log=False))
    assert ma["batch/padded_rows"] == 8
    monkeypatch.setattr(layouts, "skips_padding_passes", lambda config, mesh, local: False)
    mb = b.update(batch, UpdateOptions(log=False))
    assert mb["batch/padded_rows"] == 6
    for k in (k for k in ma if not k.startswith(("perf/", "batch/padded_rows"))):
        np.testing.assert_allclose(ma[k], mb[k], rtol=2e-5, atol=1e-6, err_msg=k)
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-5, atol=1e-7)
    start = tiny_learner(CFG, seed=1).params  # the update did move the parameters
    assert any(not np.allclose(np.asarray(x), np.asarray(y)) for x, y in
               zip(jax.tree.leaves(a.params), jax.tree.leaves(start), strict=True))
