"""``learner/scored.py``: the LM head only at the scored positions (``loss_mask != 0``).

The gather indices match a NumPy loop on a hand-written mask; the gathered head gives the full
head's log-probs and entropies at every scored position (zeros elsewhere); one update with
``learner.scored_lm_head`` leaves the same parameters and metrics as the full head, packed and
padded, with and without a KL reference and an entropy bonus; and scored counts that move inside
a capacity bucket compile no new program."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.learner import Learner, LearnerConfig, RolloutBatch, UpdateOptions
from agentrl_jax.learner.logprobs import logprobs_from_hidden
from agentrl_jax.learner.scored import (ScoredCapacity, capacity_bucket, row_counts,
                                        scored_logprobs_from_hidden, scored_positions)
from agentrl_jax.models.llama import init_model
from agentrl_jax.sharding.mesh import make_mesh
from learner_helpers import TINY_MODEL, random_batch, recorded_compiles

#: a hand-written mask: row 0 scores t = 2, 3, 6; row 1 nothing; row 2 has a (never valid)
#: mark at t = 0, which is not a scored position (nothing predicts token 0), and t = 1, 7
MASK = np.array([[0, 0, 1, 1, 0, 0, 1, 0],
                 [0, 0, 0, 0, 0, 0, 0, 0],
                 [1, 1, 0, 0, 0, 0, 0, 1]], np.float32)


def _numpy_positions(mask: np.ndarray, capacity: int) -> np.ndarray:
    r, t = mask.shape
    out = np.full((r, capacity), t, np.int64)
    for i in range(r):
        cols = [j for j in range(1, t) if mask[i, j] != 0][:capacity]
        out[i, :len(cols)] = cols
    return out


@pytest.mark.parametrize("capacity", [3, 4, 8])
def test_gather_indices_match_a_numpy_loop(capacity):
    got = np.asarray(scored_positions(jnp.asarray(MASK), capacity))
    np.testing.assert_array_equal(got, _numpy_positions(MASK, capacity))
    np.testing.assert_array_equal(row_counts(MASK), [3, 0, 2])


def test_capacity_buckets_grow_and_never_shrink():
    assert [capacity_bucket(c, 4) for c in (0, 3, 4, 5, 17, 64)] == [4, 4, 4, 8, 32, 64]
    cap = ScoredCapacity(True, 4)
    assert cap.current(64) == 4
    assert cap.for_rows(3, 64) == 4 and cap.for_rows(9, 64) == 16
    assert cap.for_rows(2, 64) == 16  # kept: no smaller program once a larger one exists
    assert cap.for_rows(2, 16) is None  # a capacity of the whole row: the full head
    assert ScoredCapacity(False, 4).for_rows(1, 64) is None


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_scored_head_equals_the_full_head_at_scored_positions(temperature):
    rng = np.random.default_rng(0)
    r, t, d, v = MASK.shape[0], MASK.shape[1], 6, 11
    hidden = jnp.asarray(rng.standard_normal((r, t, d)), jnp.float32)
    tokens = jnp.asarray(rng.integers(0, v, (r, t)), jnp.int32)
    w = jnp.asarray(rng.standard_normal((d, v)), jnp.float32)
    head = lambda h: h @ w  # noqa: E731
    # both heads jitted: one program each instead of an eager op-by-op run
    full_lp, full_ent = jax.jit(lambda h: logprobs_from_hidden(
        h, tokens, head, chunk_size=3, temperature=temperature, with_entropy=True))(hidden)
    lp, ent = jax.jit(lambda h: scored_logprobs_from_hidden(
        h, tokens, jnp.asarray(MASK), head, 4, chunk_size=3, temperature=temperature,
        with_entropy=True))(hidden)
    scored = np.zeros_like(MASK, bool)
    scored[:, 1:] = MASK[:, 1:] != 0
    for got, want in ((lp, full_lp), (ent, full_ent)):
        got, want = np.asarray(got), np.asarray(want)
        np.testing.assert_allclose(got[scored], want[scored], rtol=1e-6, atol=1e-6)
        assert np.all(got[~scored] == 0)
    # the gradient of a masked loss is the full head's as well
    def loss(h, fn):
        return jnp.sum(fn(h) * jnp.asarray(MASK))
    g_full = jax.jit(jax.grad(lambda h: loss(h, lambda x: logprobs_from_hidden(
        x, tokens, head)[0])))(hidden)
    g_sc = jax.jit(jax.grad(lambda h: loss(h, lambda x: scored_logprobs_from_hidden(
        x, tokens, jnp.asarray(MASK), head, 4)[0])))(hidden)
    np.testing.assert_allclose(np.asarray(g_sc), np.asarray(g_full), rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------- whole updates
BASE = dict(dtype="float32", remat=False, learning_rate=1e-3, micro_batch_size=2,
            logprob_batch_size=2, min_length_bucket=32, advantage_estimator="grpo",
            shuffle=False, scored_capacity_min=4)
VARIANTS = {
    "packed": dict(pack_length=96, tis_cap=2.0, mini_batches=2, kl_coef=0.0, entropy_coef=0.0),
    "packed_kl_entropy": dict(pack_length=96, kl_coef=0.05, entropy_coef=0.01),
    "padded": dict(ratio_source="recompute", kl_coef=0.0, entropy_coef=0.0),
    "padded_kl_entropy": dict(ratio_source="recompute", kl_coef=0.05, entropy_coef=0.01,
                              mini_batches=2),
}


def _sparse_batch(seed: int, b: int, t: int, every: int = 9) -> RolloutBatch:
    """``random_batch`` whose loss mask keeps 2 of every ``every`` positions (agent turns:
    short actions between long observations)."""
    batch = random_batch(seed, b, t, TINY_MODEL.vocab_size, group_size=2, prompt=3,
                         longest_first=True)
    arrays = {k: v for k, v in vars(batch).items() if v is not None}
    keep = (np.arange(t) % every >= every - 2).astype(np.float32)[None]
    arrays["loss_mask"] = arrays["loss_mask"] * keep
    arrays["rollout_logprobs"] = arrays["rollout_logprobs"] * keep
    return RolloutBatch.from_mapping(arrays)


def _learner(cfg: LearnerConfig) -> Learner:
    ref = init_model(TINY_MODEL, seed=7) if cfg.kl_coef else None
    return Learner(init_model(TINY_MODEL, seed=1), cfg, reference=ref,
                   mesh=make_mesh(fsdp=1, devices=jax.devices()[:1]))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_one_update_equals_the_full_head(variant):
    cfg = LearnerConfig(**BASE, **VARIANTS[variant])
    batch = _sparse_batch(3, 6, 40)
    full, scored = _learner(cfg.replace(scored_lm_head=False)), _learner(cfg)
    m_full = full.update(batch, UpdateOptions(log=False))
    m_scored = scored.update(batch, UpdateOptions(log=False))
    # the scored head ran at fewer positions than the rows hold
    assert scored.scored_capacity.value < 32, scored.scored_capacity.value
    assert m_full.keys() == m_scored.keys()
    for k in (k for k in m_full if not k.startswith("perf/")):  # perf/: timings
        np.testing.assert_allclose(m_scored[k], m_full[k], rtol=1e-5, atol=1e-6, err_msg=k)
    if "kl" in variant:
        assert m_full["actor/kl_loss"] > 0 and m_full["actor/entropy"] > 0
    # Adam's first steps are ~ lr * g / |g|: a gradient element near zero turns its rounding
    # into a visible share of a step, so the parameters agree to 1e-5 relative plus 1% of one
    # step (the gradients themselves: test_train_step_gradients_equal_the_full_head)
    for x, y in zip(jax.tree.leaves(scored.params), jax.tree.leaves(full.params), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5,
                                   atol=1e-2 * cfg.learning_rate)


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_scored_counts_inside_a_bucket_compile_nothing_new(layout):
    cfg = LearnerConfig(**BASE, **VARIANTS[layout]).replace(scored_capacity_min=8)
    learner = _learner(cfg)
    learner.update(_sparse_batch(0, 6, 40), UpdateOptions(log=False))
    first = learner.scored_capacity.value
    with recorded_compiles() as names:
        # other trajectories, other scored counts per row (every 10th / 11th position pair)
        for seed, every in ((1, 10), (2, 11)):
            learner.update(_sparse_batch(seed, 6, 40, every), UpdateOptions(log=False))
    assert learner.scored_capacity.value == first
    assert names == [], names
    # a batch whose rows hold more scored tokens than the bucket: one larger bucket
    with recorded_compiles() as names:
        learner.update(_sparse_batch(4, 6, 40, every=3), UpdateOptions(log=False))
    assert learner.scored_capacity.value > first
    assert names, "a larger capacity compiles its programs"


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_train_step_gradients_equal_the_full_head(packed):
    from agentrl_jax.learner.train_step import policy_loss_fn

    cfg = LearnerConfig(**BASE, kl_coef=0.05, entropy_coef=0.01)
    learner = _learner(cfg)
    rng = np.random.default_rng(5)
    r, t = 2, 40
    keep = (np.arange(t) % 9 >= 7) & (np.arange(t) >= 3)
    mb = {"tokens": rng.integers(1, TINY_MODEL.vocab_size, (r, t)).astype(np.int32),
          "attention_mask": np.ones((r, t), np.int32),
          "loss_mask": np.broadcast_to(keep, (r, t)).astype(np.float32),
          "old_logprobs": -rng.random((r, t)).astype(np.float32),
          "ref_logprobs": -rng.random((r, t)).astype(np.float32),
          "advantages": rng.standard_normal((r, t)).astype(np.float32)}
    if packed:  # two sequences of 20 tokens a row
        mb["segment_ids"] = np.repeat([[1, 2]], 20, axis=1).repeat(r, 0).astype(np.int32)
        mb["positions"] = np.tile(np.arange(20), (r, 2)).astype(np.int32)
    denom = float(mb["loss_mask"].sum())

    def grads(capacity):
        fn = jax.value_and_grad(policy_loss_fn(learner.graphdef, cfg, capacity), has_aux=True)
        return jax.jit(fn)(learner.params, mb, denom)
    (loss_f, m_f), g_f = grads(None)
    (loss_s, m_s), g_s = grads(8)
    np.testing.assert_allclose(loss_s, loss_f, rtol=1e-5)
    for k in m_f:
        np.testing.assert_allclose(m_s[k], m_f[k], rtol=1e-5, atol=1e-7, err_msg=k)
    for x, y in zip(jax.tree.leaves(g_s), jax.tree.leaves(g_f), strict=True):
        scale = float(np.abs(np.asarray(y)).max())
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6 * scale)


def test_the_run_reserves_the_most_scored_tokens_a_trajectory_holds():
    """``scored_tokens_bound``: the longest horizon x generated tokens a turn (BabyAI's
    grpo_gpu: 20 x 24); ``reserve`` rounds it up to the capacity bucket, never shrinks it,
    and leaves the full head where the bucket fills a row."""
    from agentrl_jax.learner.scored import ScoredCapacity
    from agentrl_jax.training.rl.schedule import HorizonSchedule, scored_tokens_bound

    bound = scored_tokens_bound(HorizonSchedule(phases=(6, 13, 20), steps_per_phase=15), 24)
    assert bound == 480
    cap = ScoredCapacity(True, 64)
    assert cap.current(3072) == 64
    cap.reserve(bound)
    assert cap.current(3072) == 512 and cap.current(512) is None
    cap.reserve(100)
    assert cap.value == 512
    off = ScoredCapacity(False, 64)
    off.reserve(bound)
    assert off.current(3072) is None
