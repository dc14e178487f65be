"""Losses, KL estimators and logits helpers vs NumPy float64 references.

Tolerances: float32 results vs float64 references, ``rtol=1e-5, atol=1e-6`` unless
stated (entropy / log-probs over V=50 logits of scale up to 1e4: ``atol=1e-4``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.algorithms import (
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    POLICY_LOSSES,
    actor_loss,
    aggregate_loss,
    entropy_from_logits,
    entropy_from_logits_chunked,
    get_policy_loss,
    kl_estimate,
    kl_loss,
    kl_penalized_token_rewards,
    log_probs_and_entropy,
    log_probs_from_logits,
    ppo_policy_loss,
    value_loss,
)

B, T, V = 6, 20, 50
RTOL, ATOL = 1e-5, 1e-6


def batch(seed=0):
    rng = np.random.default_rng(seed)
    m = (rng.random((B, T)) < 0.6).astype(np.float32)
    m[2] = 0.0  # a fully masked row
    old = (rng.normal(size=(B, T)) * 0.5 - 2.0).astype(np.float32)
    new = (old + rng.normal(size=(B, T)) * 0.4).astype(np.float32)
    adv = rng.normal(size=(B, T)).astype(np.float32)
    return m, old, new, adv


# ---------------------------------------------------------------- numpy references


def np_agg(lm, m, mode, max_len=None):
    lm, m = lm.astype(np.float64), m.astype(np.float64)
    valid = m.sum(1) > 0
    if mode == "token_mean":
        return (lm * m).sum() / m.sum()
    if mode == "seq_mean_token_sum":
        return (lm * m).sum(1)[valid].mean()
    if mode == "seq_mean_token_mean":
        return ((lm * m).sum(1)[valid] / m.sum(1)[valid]).mean()
    if mode == "seq_mean_token_sum_norm":
        return (lm * m).sum(1)[valid].mean() / (max_len or lm.shape[1])
    raise ValueError(mode)


def np_ppo(new, old, adv, clip_low, clip_high, dual):
    new, old, adv = (x.astype(np.float64) for x in (new, old, adv))
    out = np.zeros_like(adv)
    for idx in np.ndindex(adv.shape):
        r = np.exp(np.clip(new[idx] - old[idx], -20, 20))
        a = adv[idx]
        loss = max(-a * r, -a * min(max(r, 1 - clip_low), 1 + clip_high))
        if dual is not None and a < 0:
            loss = min(loss, -a * dual)
        out[idx] = loss
    return out


def np_log_softmax(z):
    z = z.astype(np.float64)
    mx = z.max(-1, keepdims=True)
    return z - mx - np.log(np.exp(z - mx).sum(-1, keepdims=True))


# ---------------------------------------------------------------- aggregation


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_sum", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_aggregation_modes(mode):
    m, _, _, adv = batch(1)
    got = aggregate_loss(adv, m, mode)
    np.testing.assert_allclose(got, np_agg(adv, m, mode), rtol=RTOL, atol=ATOL)
    # verl spelling and explicit max_len / denom
    assert mode.replace("_", "-") in LOSS_AGGREGATIONS
    if mode == "seq_mean_token_sum_norm":
        np.testing.assert_allclose(aggregate_loss(adv, m, "seq-mean-token-sum-norm", max_len=100), np_agg(adv, m, mode, 100), rtol=RTOL)
    if mode == "token_mean":
        np.testing.assert_allclose(aggregate_loss(adv, m, mode, denom=1000.0), (adv * m).sum() / 1000.0, rtol=RTOL)


def test_aggregation_empty_mask_is_zero():
    z = np.zeros((B, T), np.float32)
    for mode in LOSS_AGGREGATIONS:
        assert float(aggregate_loss(np.ones((B, T)), z, mode)) == 0.0


# ---------------------------------------------------------------- PPO


def test_ppo_clip_and_dual_clip_branches_hand_cases():
    # columns: (A, ratio) ->
    #  0: A=+1, r=1.5  -> clipped high, loss -1.2
    #  1: A=-1, r=0.5  -> clipped low,  loss  0.8
    #  2: A=-1, r=5.0  -> (clip inactive since -A*r > -A*clip(r)) -> 5.0; dual clip c=3 -> 3.0
    #  3: A=+1, r=0.5  -> unclipped, loss -0.5
    #  4: A=-1, r=1.1  -> unclipped, loss 1.1
    #  5: A=+2, r=1.0  -> unclipped, loss -2.0
    A = np.array([[1.0, -1.0, -1.0, 1.0, -1.0, 2.0]], np.float32)
    r = np.array([[1.5, 0.5, 5.0, 0.5, 1.1, 1.0]], np.float32)
    old = np.zeros_like(r)
    new = np.log(r)
    m = np.ones_like(r)
    f = jax.jit(ppo_policy_loss, static_argnames=("clip_low", "clip_high", "dual_clip", "agg"))
    loss, met = f(new, old, A, m, clip_low=0.2, clip_high=0.2, dual_clip=None, agg="token_mean")
    np.testing.assert_allclose(loss, np.mean([-1.2, 0.8, 5.0, -0.5, 1.1, -2.0]), rtol=1e-5)
    np.testing.assert_allclose(met["pg_clipfrac"], 2 / 6, rtol=1e-6)
    np.testing.assert_allclose(met["pg_clipfrac_high"], 1 / 6, rtol=1e-6)
    np.testing.assert_allclose(met["pg_clipfrac_low"], 1 / 6, rtol=1e-6)
    assert float(met["pg_clipfrac_dual"]) == 0.0
    np.testing.assert_allclose(met["ratio_max"], 5.0, rtol=1e-6)
    np.testing.assert_allclose(met["ratio_min"], 0.5, rtol=1e-6)
    np.testing.assert_allclose(met["ratio_mean"], r.mean(), rtol=1e-6)
    np.testing.assert_allclose(met["ppo_kl"], -np.log(r).mean(), rtol=1e-5)

    loss, met = f(new, old, A, m, clip_low=0.2, clip_high=0.2, dual_clip=3.0, agg="token_mean")
    np.testing.assert_allclose(loss, np.mean([-1.2, 0.8, 3.0, -0.5, 1.1, -2.0]), rtol=1e-5)
    np.testing.assert_allclose(met["pg_clipfrac_dual"], 1 / 6, rtol=1e-6)

    # clip-higher: upper bound 1.28 -> column 0 loss becomes -1.28
    loss, met = f(new, old, A, m, clip_low=0.2, clip_high=0.28, dual_clip=None, agg="token_mean")
    np.testing.assert_allclose(loss, np.mean([-1.28, 0.8, 5.0, -0.5, 1.1, -2.0]), rtol=1e-5)


@pytest.mark.parametrize("name", ["ppo", "ppo_dual_clip", "clip_higher"])
def test_policy_loss_registry_vs_numpy(name):
    m, old, new, adv = batch(2)
    cfg = {"ppo": (0.2, 0.2, None), "ppo_dual_clip": (0.2, 0.2, 3.0), "clip_higher": (0.2, 0.28, None)}[name]
    lm = np_ppo(new, old, adv, *cfg)
    fn = get_policy_loss(name)
    mode = {"ppo": "token_mean", "ppo_dual_clip": "seq_mean_token_mean", "clip_higher": "seq_mean_token_sum_norm"}[name]
    loss, _ = jax.jit(functools.partial(fn, agg=mode))(new, old, adv, m)
    np.testing.assert_allclose(loss, np_agg(lm, m, mode), rtol=RTOL, atol=ATOL)


def test_policy_loss_gradient_matches_analytic():
    m, old, new, adv = batch(3)
    dual = 3.0
    grad = jax.jit(jax.grad(lambda lp: ppo_policy_loss(lp, old, adv, m, clip_low=0.2, clip_high=0.28, dual_clip=dual)[0]))(
        jnp.asarray(new)
    )
    # analytic: d/dlogp of -A*r is -A*r where the unclipped branch is active, else 0
    r = np.exp(new.astype(np.float64) - old)
    a = adv.astype(np.float64)
    l1 = -a * r
    l2 = -a * np.clip(r, 0.8, 1.28)
    use_l1 = l1 >= l2
    dual_cap = (a < 0) & (np.maximum(l1, l2) > -a * dual)
    g = np.where(use_l1 & ~dual_cap, -a * r, 0.0) * m / m.sum()
    np.testing.assert_allclose(grad, g, rtol=1e-4, atol=1e-7)
    # and a central finite difference on a few unclipped entries
    f = jax.jit(lambda lp: ppo_policy_loss(lp, old, adv, m, clip_low=0.2, clip_high=0.28, dual_clip=dual)[0])
    idx = [i for i in zip(*np.nonzero(use_l1 & ~dual_cap & (m > 0)))][:3]
    h = 1e-2
    for i in idx:
        e = np.zeros_like(new)
        e[i] = h
        fd = (float(f(new + e)) - float(f(new - e))) / (2 * h)
        np.testing.assert_allclose(fd, g[i], rtol=2e-2, atol=2e-5)


def test_actor_loss_composition():
    m, old, new, adv = batch(4)
    ref = (old - 0.3).astype(np.float32)
    ent = np.abs(adv)
    total, met = jax.jit(
        lambda *a: actor_loss(*a, ref_logprobs=ref, kl_coef=1e-3, kl_estimator="low_var_kl",
                              entropy=ent, entropy_coef=1e-3, policy_loss="ppo",
                              agg="token_mean")
    )(new, old, adv, m)
    pg = np_agg(np_ppo(new, old, adv, 0.2, 0.2, None), m, "token_mean")
    x = np.clip(ref.astype(np.float64) - new, -20, 20)
    k3 = np.clip(np.exp(x) - x - 1, -10, 10)
    expect = pg + 1e-3 * np_agg(k3, m, "token_mean") - 1e-3 * np_agg(ent, m, "token_mean")
    np.testing.assert_allclose(total, expect, rtol=1e-5)
    np.testing.assert_allclose(met["kl_loss"], np_agg(k3, m, "token_mean"), rtol=1e-5)
    assert set(POLICY_LOSSES) >= {"ppo", "ppo_dual_clip", "clip_higher"}


# ---------------------------------------------------------------- KL


def test_kl_estimators_hand_cases():
    lp = np.array([-1.0, -2.0, -1.0, -31.0, -1.0], np.float32)
    ref = np.array([-2.0, -1.0, -1.0, -1.0, -40.0], np.float32)
    # log r = lp - ref = [1, -1, 0, -30, 39]
    np.testing.assert_allclose(kl_estimate(lp, ref, "k1"), [1, -1, 0, -30, 39], rtol=1e-6)
    np.testing.assert_allclose(kl_estimate(lp, ref, "k2"), [0.5, 0.5, 0, 450, 760.5], rtol=1e-6)
    k3 = kl_estimate(lp, ref, "low_var_kl")
    # k3 = exp(-log r) - 1 + log r; clamps: -log r in [-20, 20], result in [-10, 10]
    np.testing.assert_allclose(k3[:3], [np.exp(-1.0), np.e - 2.0, 0.0], rtol=1e-6, atol=1e-7)
    assert float(k3[3]) == 10.0  # exp(20) - 21 clamped to 10
    np.testing.assert_allclose(k3[4], min(np.exp(-20.0) + 20 - 1, 10.0), rtol=1e-6)
    assert kl_estimate(lp, ref, "k3") is not None and "mse" in KL_ESTIMATORS and "kl" in KL_ESTIMATORS
    np.testing.assert_allclose(kl_estimate(lp, ref, "abs"), [1, 1, 0, 30, 39], rtol=1e-6)


def test_kl_loss_and_kl_in_reward():
    m, old, new, _ = batch(5)
    ref = old + 0.2
    np.testing.assert_allclose(
        kl_loss(new, ref, m, estimator="k2"), np_agg(0.5 * (new.astype(np.float64) - ref) ** 2, m, "token_mean"), rtol=1e-5
    )
    tr = np.ones((B, T), np.float32)
    out = kl_penalized_token_rewards(tr, old, ref, m, 0.1, estimator="k1")
    np.testing.assert_allclose(out, tr - 0.1 * (old - ref) * m, rtol=1e-6)
    out0 = kl_penalized_token_rewards(None, old, ref, m, 0.1)
    np.testing.assert_allclose(out0, -0.1 * (old - ref) * m, rtol=1e-6)


# ---------------------------------------------------------------- logits helpers


def logits_case(seed=6, scale=3.0):
    rng = np.random.default_rng(seed)
    z = (rng.normal(size=(B, T, V)) * scale).astype(np.float32)
    tgt = rng.integers(0, V, size=(B, T))
    return z, tgt


def test_entropy_and_logprobs_vs_numpy():
    lp_fn = jax.jit(log_probs_from_logits, static_argnames=("temperature",))
    ent_fn = jax.jit(entropy_from_logits, static_argnames=("temperature",))
    for scale in (3.0, 1e4):  # 1e4: stability (naive exp would overflow)
        z, tgt = logits_case(scale=scale)
        ls = np_log_softmax(z)
        ref_ent = -(np.exp(ls) * ls).sum(-1)
        ref_lp = np.take_along_axis(ls, tgt[..., None], -1)[..., 0]
        atol = 1e-5 if scale < 10 else 2e-3  # |z| ~ 1e4 in float32: ulp ~ 1e-3
        np.testing.assert_allclose(ent_fn(z), ref_ent, rtol=1e-5, atol=atol)
        np.testing.assert_allclose(lp_fn(z, tgt), ref_lp, rtol=1e-5, atol=atol)
    # masked vocabulary entries (-inf logits): finite entropy and gradient
    z, tgt = logits_case()
    z[:, :, :10] = -np.inf
    ls = np_log_softmax(z)
    lsf = np.where(np.isfinite(ls), ls, 0.0)
    ref_ent = -(np.exp(ls) * lsf).sum(-1)
    np.testing.assert_allclose(ent_fn(z), ref_ent, rtol=1e-5, atol=1e-5)
    g = jax.grad(lambda x: jnp.sum(entropy_from_logits(x)))(jnp.asarray(z))
    assert np.all(np.isfinite(np.asarray(g)))
    z, tgt = logits_case()
    ls = np_log_softmax(z / 0.7)
    np.testing.assert_allclose(lp_fn(z, tgt, temperature=0.7), np.take_along_axis(ls, tgt[..., None], -1)[..., 0], rtol=1e-5, atol=1e-5)


def test_chunked_entropy_and_logprobs_match_unchunked():
    z, tgt = logits_case(7)
    lp, ent = jax.jit(log_probs_and_entropy)(z, tgt)
    lp_c, ent_c = jax.jit(functools.partial(log_probs_and_entropy, chunk_size=6))(z, tgt)  # 20 = 6+6+6+2 (padded)
    # (XLA fuses / orders the reductions differently per chunk: agreement to float32 rounding)
    np.testing.assert_allclose(lp_c, lp, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(ent_c, ent, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(jax.jit(functools.partial(entropy_from_logits_chunked, chunk_size=8))(z), ent, rtol=2e-5, atol=2e-5)
    # gradients through the chunked (checkpointed) path equal the plain ones
    g1 = jax.jit(jax.grad(lambda x: jnp.sum(log_probs_and_entropy(x, tgt)[1])))(jnp.asarray(z))
    g2 = jax.jit(jax.grad(lambda x: jnp.sum(log_probs_and_entropy(x, tgt, chunk_size=6)[1])))(jnp.asarray(z))
    np.testing.assert_allclose(g2, g1, rtol=2e-5, atol=2e-6)


# ---------------------------------------------------------------- value loss


def test_value_loss_clipping():
    # v_old = 0, clip 0.2:
    #  v=1.0, R=0.0 -> l1=1, v_clip=0.2 -> l2=0.04 -> max=1     (not clipped)
    #  v=1.0, R=2.0 -> l1=1, v_clip=0.2 -> l2=3.24 -> 3.24      (clipped branch)
    #  v=0.1, R=0.5 -> l1=0.16, v_clip=0.1 -> l2=0.16 -> 0.16   (inside range)
    v = np.array([[1.0, 1.0, 0.1]], np.float32)
    R = np.array([[0.0, 2.0, 0.5]], np.float32)
    m = np.ones_like(v)
    zeros = np.zeros_like(v)

    @jax.jit
    def run(v):
        loss, met = value_loss(v, zeros, R, m)
        loss_nc, _ = value_loss(v, zeros, R, m, clip_range=None)
        g = jax.grad(lambda x: value_loss(x, zeros, R, m)[0])(v)
        return loss, met, loss_nc, g

    loss, met, loss_nc, g = run(v)
    np.testing.assert_allclose(loss, 0.5 * np.mean([1.0, 3.24, 0.16]), rtol=1e-6)
    np.testing.assert_allclose(met["vf_clipfrac"], 1 / 3, rtol=1e-6)
    np.testing.assert_allclose(loss_nc, 0.5 * np.mean([1.0, 1.0, 0.16]), rtol=1e-6)
    # gradient only through values_pred, zero on the clipped entry
    np.testing.assert_allclose(g, [[(1.0 - 0.0) / 3, 0.0, (0.1 - 0.5) / 3]], rtol=1e-5, atol=1e-7)
