"""Packed-row updates keep one token space a run (``learner/token_space.py``): columns are
``pack_length`` and rows a power of two the learner keeps and only grows (the trainer reserves
a step's episodes), so batches whose row count and length change every step (flat groups
skipped, longer or shorter episodes) compile none of the update's programs after the first
update. Before, every new ``[B, T]`` bucket compiled the update's gather, derive and shuffle
programs again: seven programs, ~1 s on an H200 (docs/LEARNER.md, "One token space a run").
The padded rows change nothing: the same parameters and metrics as the same update on the
token space as given, with the rows split into the same mini-batches. The row counts the
update reports are checked against a hand-packed batch."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from agentrl_jax.learner import LearnerConfig, RolloutBatch, UpdateOptions
from agentrl_jax.learner.token_space import (PackedTokenRows, call_sizes, logprob_call_rows,
                                             packed_token_space)
from learner_helpers import TINY_MODEL, recorded_compiles, tiny_batch, tiny_learner

CFG = LearnerConfig(kl_coef=0.0, entropy_coef=0.0, dtype="float32", remat=False,
                    learning_rate=1e-3, micro_batch_size=2,
                    pack_length=96, logprob_batch_size=2, min_length_bucket=32,
                    advantage_estimator="grpo", shuffle=False)


@pytest.fixture
def compiles():
    with recorded_compiles() as names:
        yield names


def test_token_space_rows_are_kept_and_columns_are_the_pack_length():
    assert packed_token_space(6, 30, CFG) == (8, 96)
    assert packed_token_space(1, 96, CFG) == (1, 96)
    assert packed_token_space(3, 120, CFG) == (4, 120)  # a wider batch keeps its width
    kept = PackedTokenRows()
    kept.reserve(20)
    assert kept.value == 32
    assert packed_token_space(6, 30, CFG, kept) == (32, 96)
    assert packed_token_space(33, 30, CFG, kept) == (64, 96)  # a larger batch grows it ...
    assert packed_token_space(6, 30, CFG, kept) == (64, 96)  # ... and it never shrinks
    kept.reserve(0)
    assert kept.value == 64
    with pytest.raises(ValueError, match="token-space rows"):
        kept.reserve(-1)


def test_batches_across_the_old_buckets_compile_nothing_after_the_first_update(compiles):
    """Row counts 6 -> 12 -> 3 and lengths 40 -> 30 -> 90 crossed the old row buckets (8, 16,
    4) and length buckets (64, 32, 96): each compiled the update's small programs again."""
    learner = tiny_learner(CFG)
    learner.token_rows.reserve(16)  # as the trainer reserves a step's episodes
    first = learner.update(tiny_batch(0, 6, 40), UpdateOptions(log=False))
    assert first["perf/update_compiles"] > 0 and first["learner/token_space_rows"] == 16
    compiles.clear()
    for seed, (b, t) in enumerate([(7, 45), (12, 30), (3, 90), (16, 64), (5, 33)], start=1):
        metrics = learner.update(tiny_batch(seed, b, t), UpdateOptions(log=False))
        assert np.isfinite(metrics["actor/pg_loss"]) and metrics["batch/rows"] == b
        assert metrics["perf/update_compiles"] == 0 and metrics["learner/token_space_rows"] == 16
    assert compiles == [], compiles


def test_padding_changes_neither_the_update_nor_its_metrics(monkeypatch):
    """Six rows in a token space of 64 against the token space as given (6 rows), two
    optimiser steps: the padding rows are not split into the mini-batches (before, the split
    of 8 padded rows put four real rows in the first step and two in the second)."""
    from agentrl_jax.learner import layouts

    cfg = CFG.replace(mini_batches=2)
    batch = tiny_batch(5, 6, 40)
    a, b = tiny_learner(cfg, seed=1), tiny_learner(cfg, seed=1)
    a.token_rows.reserve(64)
    ma = a.update(batch, UpdateOptions(log=False))
    assert ma["learner/token_space_rows"] == 64
    monkeypatch.setattr(layouts, "packed_token_space", lambda rows, length, config, kept:
                        (rows, length))  # the token space as given: no padding
    mb = b.update(batch, UpdateOptions(log=False))
    assert mb["learner/token_space_rows"] == 6
    assert ma.keys() == mb.keys()
    for k in (k for k in ma if not k.startswith(("perf/", "learner/token_space_rows"))):
        np.testing.assert_allclose(ma[k], mb[k], rtol=2e-5, atol=1e-6, err_msg=k)
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-5, atol=1e-7)


def _batch_of_lengths(lengths: list[int], prompt: int = 4, seed: int = 0) -> RolloutBatch:
    """Right-padded rows of the given lengths (the first ``prompt`` tokens unscored), groups of
    two rows with different rewards."""
    rng = np.random.default_rng(seed)
    b, t = len(lengths), max(lengths)
    attn = (np.arange(t)[None] < np.asarray(lengths)[:, None]).astype(np.int32)
    loss = (attn * (np.arange(t)[None] >= prompt)).astype(np.float32)
    return RolloutBatch.from_mapping({
        "tokens": rng.integers(1, TINY_MODEL.vocab_size, (b, t)).astype(np.int32) * attn,
        "attention_mask": attn, "loss_mask": loss,
        "rollout_logprobs": (-rng.random((b, t)) * loss).astype(np.float32),
        "group_id": np.arange(b) // 2, "reward": (np.arange(b) % 2).astype(np.float32)})


def test_log_prob_calls_are_full_then_micro_batch_sized():
    assert logprob_call_rows(16, 4) == (16, 4)
    assert logprob_call_rows(16, 3) == (16, 16)  # not a divisor: one shape
    assert logprob_call_rows(4, 4) == (4, 4) and logprob_call_rows(4, 8) == (4, 4)
    assert call_sizes(20, 16, 4) == [16, 4]  # 17-20 filled rows: 20, not 32
    assert call_sizes(28, 16, 4) == [16, 4, 4, 4]
    assert call_sizes(32, 16, 4) == [16, 16] and call_sizes(8, 16, 4) == [4, 4]
    assert call_sizes(32, 16, 16) == [16, 16]
    with pytest.raises(ValueError, match="multiple"):
        call_sizes(18, 16, 4)


@pytest.mark.parametrize("logprob_rows,padded,calls", [(3, 6, 2), (4, 4, 1), (8, 4, 2)])
def test_row_and_micro_batch_counts_of_a_hand_packed_batch(logprob_rows, padded, calls):
    """Rows of 96 tokens, lengths 90 90 50 40 | 30 30 20 10, two mini-batches (no shuffle),
    micro-batches of 2 rows. By hand (first-fit decreasing): mini-batch 1: [90] [90] [50 40]
    = 3 rows -> 4 rows, 2 micro-batches; mini-batch 2: [30 30 20 10] = 1 row -> 2 rows, 1
    micro-batch. The log-prob pass packs all eight into [90] [90] [50 40] [30 30 20 10] = 4
    rows: in calls of 3 rows (2 does not divide 3: no tail calls) 6 rows in two calls; of 4
    rows, one call; of 8 rows, two tail calls of 2 (before: one call of 8 rows, 4 of them
    empty). The full LM head, so no scored-token budget reshapes the plans
    (``PackedRows.pack_plan``)."""
    cfg = CFG.replace(mini_batches=2, logprob_batch_size=logprob_rows, scored_lm_head=False)
    learner = tiny_learner(cfg)
    learner.token_rows.reserve(16)
    m = learner.update(_batch_of_lengths([90, 90, 50, 40, 30, 30, 20, 10]),
                       UpdateOptions(log=False))
    assert m["learner/rows"] == 4 and m["learner/rows_padded"] == 6
    assert m["batch/packed_rows"] == 6 and m["learner/micro_batches"] == 3
    assert m["learner/logprob_rows"] == 4 and m["learner/logprob_rows_padded"] == padded
    assert m["learner/logprob_calls"] == calls
    assert m["learner/token_space_rows"] == 16 and m["batch/real_tokens"] == 360


def test_tail_calls_change_neither_the_log_probs_nor_the_update():
    """30 trajectories in ~10 packed rows: log-prob calls of 8 rows then tail calls of 2
    (``[8, 2]``) against calls of 2 rows only; the same micro-batches of 2 in the optimiser
    steps. The same parameters and metrics (the sampler-vs-learner log-prob comparison reads
    the pass's log-probs)."""
    batch = tiny_batch(7, 30, 40)
    cfg = CFG.replace(mini_batches=2)
    a = tiny_learner(cfg.replace(logprob_batch_size=8), seed=2)
    b = tiny_learner(cfg.replace(logprob_batch_size=2), seed=2)
    ma = a.update(batch, UpdateOptions(log=False))
    mb = b.update(batch, UpdateOptions(log=False))
    assert ma["learner/logprob_rows_padded"] % 8 != 0  # the pass ran a tail call
    assert ma["learner/logprob_calls"] < mb["learner/logprob_calls"]
    for k in (k for k in ma if not k.startswith(("perf/", "learner/logprob_calls"))):
        np.testing.assert_allclose(ma[k], mb[k], rtol=2e-5, atol=1e-6, err_msg=k)
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-5, atol=1e-7)
