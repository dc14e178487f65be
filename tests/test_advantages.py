"""Advantage estimators vs independent float64 NumPy per-token loops.

Tolerances: JAX computes in float32; references are float64. Whitened advantages
(O(1) values) and group advantages are compared with ``rtol=2e-5, atol=2e-5``;
returns (scale ~ |V| + |R| <= ~10) with ``rtol=2e-5, atol=5e-5``.
All random batches share one shape ``[B, T] = [12, 48]`` so each estimator
configuration compiles once.
"""

from __future__ import annotations

import functools
from collections import defaultdict

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_common.registry import UnknownNameError
from agentrl_jax.algorithms import (
    ADVANTAGE_ESTIMATORS,
    AdvantageOutput,
    compute_advantages,
    get_advantage_estimator,
    group_stats,
    masked_discounted_suffix_sum,
    place_outcome_reward,
    register_advantage_estimator,
    reverse_linear_recurrence,
)

B, T = 12, 48
RTOL, ATOL = 2e-5, 2e-5
RET_ATOL = 5e-5


# ----------------------------------------------------------------------------- data


def multiturn_mask(rng: np.random.Generator, B: int, T: int) -> np.ndarray:
    """Prompt span, then alternating generated / observation spans, then padding."""
    m = np.zeros((B, T), np.float32)
    for b in range(B):
        t = int(rng.integers(1, 7))  # prompt
        end = T - int(rng.integers(0, 8))  # padding at the end
        gen = True
        while t < end:
            n = int(rng.integers(1, 7)) if gen else int(rng.integers(1, 6))
            if gen:
                m[b, t : min(t + n, end)] = 1.0
            t += n
            gen = not gen
    return m


def make_batch(seed: int, *, fully_masked_rows=(), **overrides):
    rng = np.random.default_rng(seed)
    m = multiturn_mask(rng, B, T)
    for r in fully_masked_rows:
        m[r] = 0.0
    batch = dict(
        rewards=rng.normal(size=B).astype(np.float32),
        loss_mask=m,
        # unsorted, non-contiguous ids with a singleton group (id 7) and a big id
        group_ids=np.array([3, 10**6, 3, 7, 10**6, 3, 42, 42, 10**6, 42, 3, 42][:B], np.int64),
        values=rng.normal(size=(B, T)).astype(np.float32),
        token_rewards=(rng.normal(size=(B, T)) * 0.1).astype(np.float32),
    )
    batch.update(overrides)
    return batch


# ----------------------------------------------------------------------------- references (float64 loops)


def ref_place(rewards, m):
    out = np.zeros(m.shape)
    for b in range(m.shape[0]):
        idx = [t for t in range(m.shape[1]) if m[b, t] > 0]
        if idx:
            out[b, idx[-1]] = rewards[b]
    return out


def ref_token_rewards(batch, use_token_rewards=True):
    m = batch["loss_mask"].astype(np.float64)
    r = ref_place(batch["rewards"].astype(np.float64), m)
    if use_token_rewards:
        r = r + m * batch["token_rewards"]
    return r


def ref_whiten(x, m):
    vals = x[m > 0]
    n = vals.size
    if n == 0:
        return np.zeros_like(x)
    mean = vals.mean()
    var = ((vals - mean) ** 2).mean() * (n / (n - 1) if n > 1 else 0.0)
    return (x - mean) / np.sqrt(var + 1e-8) * m


def ref_gae(batch, gamma, lam, whiten=True):
    m = batch["loss_mask"].astype(np.float64)
    V = batch["values"].astype(np.float64)
    r = ref_token_rewards(batch)
    A = np.zeros_like(V)
    for b in range(V.shape[0]):
        last_adv, next_v = 0.0, 0.0
        for t in reversed(range(V.shape[1])):
            if m[b, t] > 0:
                delta = r[b, t] + gamma * next_v - V[b, t]
                last_adv = delta + gamma * lam * last_adv
                next_v = V[b, t]
            A[b, t] = last_adv
    returns = (A + V) * m
    adv = ref_whiten(A, m) if whiten else A * m
    return adv, returns


def ref_reinforce_pp(batch, gamma):
    m = batch["loss_mask"].astype(np.float64)
    r = ref_token_rewards(batch)
    G = np.zeros_like(r)
    for b in range(r.shape[0]):
        run = 0.0
        for t in reversed(range(r.shape[1])):
            if m[b, t] > 0:
                run = r[b, t] + gamma * run
            G[b, t] = run * m[b, t]
    return ref_whiten(G, m), G


def ref_scores_and_groups(batch):
    m = batch["loss_mask"].astype(np.float64)
    R = batch["rewards"].astype(np.float64) + (m * batch["token_rewards"]).sum(1)
    valid = m.sum(1) > 0
    groups = defaultdict(list)
    for i, g in enumerate(batch["group_ids"]):
        if valid[i]:
            groups[int(g)].append(R[i])
    return m, R, valid, groups


def ref_outcome(batch, kind, eps=1e-6):
    m, R, valid, groups = ref_scores_and_groups(batch)
    a = np.zeros(len(R))
    for i, g in enumerate(batch["group_ids"]):
        xs = np.array(groups[int(g)])
        if not valid[i] or len(xs) < 2:
            continue
        mean = xs.mean()
        if kind == "grpo":
            a[i] = (R[i] - mean) / (xs.std(ddof=1) + eps)
        elif kind == "dr_grpo":
            a[i] = R[i] - mean
        elif kind == "rloo":
            a[i] = R[i] - (xs.sum() - R[i]) / (len(xs) - 1)  # minus the mean of the others
        elif kind == "rpp_baseline":
            a[i] = R[i] - mean
    adv = a[:, None] * m
    if kind == "rpp_baseline":
        adv = ref_whiten(adv, m)
    return adv


def assert_masked_zero(out: AdvantageOutput, m):
    assert np.all(np.isfinite(np.asarray(out.advantages)))
    assert np.all(np.isfinite(np.asarray(out.returns)))
    assert np.all(np.asarray(out.advantages)[m == 0] == 0)
    assert np.all(np.asarray(out.returns)[m == 0] == 0)


# ----------------------------------------------------------------------------- tests


def test_place_outcome_reward_last_generated_token():
    batch = make_batch(0, fully_masked_rows=(4,))
    got = np.asarray(place_outcome_reward(batch["rewards"], batch["loss_mask"]))
    np.testing.assert_allclose(got, ref_place(batch["rewards"], batch["loss_mask"]), rtol=0, atol=0)
    assert np.all(got[4] == 0)
    # the reward never sits on an observation token
    assert np.all(got[batch["loss_mask"] == 0] == 0)


@pytest.mark.parametrize("method", ["scan", "associative", "blocked"])
@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95)])
def test_gae_matches_reference(method, gamma, lam):
    for seed in (1, 2):
        batch = make_batch(seed, fully_masked_rows=(5,) if seed == 2 else ())
        out = compute_advantages("gae", gamma=gamma, lam=lam, method=method, **batch)
        adv, ret = ref_gae(batch, gamma, lam)
        np.testing.assert_allclose(out.advantages, adv, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(out.returns, ret, rtol=RTOL, atol=RET_ATOL)
        assert_masked_zero(out, batch["loss_mask"])


@pytest.mark.parametrize("method", ["scan", "associative", "auto"])
def test_gae_td0_and_unwhitened(method):
    # lam = 0 (one-step TD): 'auto' must fall back to the associative scan.
    batch = make_batch(3)
    out = compute_advantages("gae", gamma=0.9, lam=0.0, whiten=False, method=method, **batch)
    adv, ret = ref_gae(batch, 0.9, 0.0, whiten=False)
    np.testing.assert_allclose(out.advantages, adv, rtol=RTOL, atol=RET_ATOL)
    np.testing.assert_allclose(out.returns, ret, rtol=RTOL, atol=RET_ATOL)


def test_gae_credit_crosses_observation_spans():
    # one trajectory: gen, obs, gen(last); reward only at the end; V = 0, gamma = lam = 1
    m = np.array([[0, 1, 1, 0, 0, 1, 1, 0]], np.float32)
    out = compute_advantages(
        "gae", rewards=np.array([2.0], np.float32), loss_mask=m, values=np.zeros_like(m), whiten=False
    )
    np.testing.assert_allclose(np.asarray(out.advantages)[0], [0, 2, 2, 0, 0, 2, 2, 0])


def test_gae_long_sequence_blocked_two_levels():
    # T = 600 > direct_max: the blocked scan runs with chunks + a carry level.
    rng = np.random.default_rng(7)
    Bl, Tl = 4, 600
    m = multiturn_mask(rng, Bl, Tl)
    batch = dict(
        rewards=rng.normal(size=Bl).astype(np.float32),
        loss_mask=m,
        values=rng.normal(size=(Bl, Tl)).astype(np.float32),
        token_rewards=(rng.normal(size=(Bl, Tl)) * 0.1).astype(np.float32),
    )
    out = compute_advantages("gae", gamma=0.995, lam=0.9, method="blocked", **batch)
    adv, ret = ref_gae(batch, 0.995, 0.9)
    np.testing.assert_allclose(out.advantages, adv, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out.returns, ret, rtol=1e-4, atol=2e-4)


@pytest.mark.parametrize(
    "d,kw",
    [
        (0.0, dict(chunk=4, direct_max=4)),  # 48 -> 12 -> 3: three levels
        (0.37, dict(chunk=8, direct_max=8)),
        (0.95, dict(chunk=4, direct_max=4)),
        (0.95, {}),  # single chunk (T <= direct_max), factorised weights
        (1.0, dict(chunk=8, direct_max=8)),
        (0.95, dict(method="associative")),
    ],
)
def test_blocked_suffix_sum_multilevel(d, kw):
    rng = np.random.default_rng(11)
    x = rng.normal(size=(2, B, T))
    m = multiturn_mask(rng, B, T)
    ref = np.zeros_like(x)
    run = np.zeros((2, B))
    for t in reversed(range(T)):
        run = x[:, :, t] + np.where(m[:, t] > 0, d, 1.0) * run
        ref[:, :, t] = run
    fn = jax.jit(functools.partial(masked_discounted_suffix_sum, discount=d, **kw))
    got = fn(jnp.asarray(x, jnp.float32), m)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_reverse_linear_recurrence_methods_agree():
    rng = np.random.default_rng(5)
    a = rng.uniform(0, 1.2, size=(3, 30))
    b = rng.normal(size=(3, 30))
    ref = np.zeros_like(b)
    x = np.zeros(3)
    for t in reversed(range(30)):
        x = a[:, t] * x + b[:, t]
        ref[:, t] = x
    for method in ("associative", "scan"):
        fn = jax.jit(functools.partial(reverse_linear_recurrence, method=method))
        np.testing.assert_allclose(fn(a, b), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("method", ["auto", "blocked", "associative"])
def test_reinforce_pp(method):
    for seed in (4, 5):
        batch = make_batch(seed, fully_masked_rows=(0,))
        out = compute_advantages("reinforce_pp", gamma=0.97, method=method, **batch)
        adv, ret = ref_reinforce_pp(batch, 0.97)
        np.testing.assert_allclose(out.advantages, adv, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(out.returns, ret, rtol=RTOL, atol=RET_ATOL)
        assert_masked_zero(out, batch["loss_mask"])


@pytest.mark.parametrize(
    "name,kind", [("grpo", "grpo"), ("dr_grpo", "dr_grpo"), ("rloo", "rloo"), ("reinforce_pp_baseline", "rpp_baseline")]
)
def test_outcome_estimators(name, kind):
    for seed in (6, 7):
        batch = make_batch(seed, fully_masked_rows=(1,) if seed == 7 else ())
        out = compute_advantages(name, **batch)
        np.testing.assert_allclose(out.advantages, ref_outcome(batch, kind), rtol=RTOL, atol=ATOL)
        assert_masked_zero(out, batch["loss_mask"])
        if name != "reinforce_pp_baseline":  # (that one whitens afterwards)
            assert np.all(np.asarray(out.advantages)[3] == 0)  # group of one (id 7, row 3)


def test_zero_variance_groups_and_singletons_are_finite_zero():
    batch = make_batch(8, token_rewards=np.zeros((B, T), np.float32))
    batch["rewards"] = np.where(np.isin(batch["group_ids"], [3, 42]), 1.0, batch["rewards"]).astype(np.float32)
    for name in ("grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"):
        out = compute_advantages(name, **batch)
        a = np.asarray(out.advantages)
        assert np.all(np.isfinite(a))
        zero_rows = np.isin(batch["group_ids"], [3, 42, 7])
        if name == "reinforce_pp_baseline":  # zero scores, then whitened: one shared value
            vals = a[zero_rows][batch["loss_mask"][zero_rows] > 0]
            np.testing.assert_allclose(vals, vals[0], rtol=1e-6)
        else:
            assert np.all(a[zero_rows] == 0), name


def test_all_rows_fully_masked_give_zeros():
    batch = make_batch(9, loss_mask=np.zeros((B, T), np.float32))
    # (options as in the tests above, so the compiled functions are reused)
    opts = {"gae": dict(gamma=0.99, lam=0.95, method="scan"), "reinforce_pp": dict(gamma=0.97)}
    for name in ("gae", "grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"):
        out = compute_advantages(name, **opts.get(name, {}), **batch)
        assert np.all(np.asarray(out.advantages) == 0), name
        assert np.all(np.asarray(out.returns) == 0), name


def test_group_stats_unsorted_arbitrary_ids():
    scores = np.array([1.0, 5.0, 3.0, 2.0, 9.0, 4.0], np.float32)
    ids = np.array([-3, 10**9, -3, 77, 10**9, -3])
    st = jax.jit(group_stats)(scores, ids)
    np.testing.assert_allclose(st.mean, [8 / 3, 7, 8 / 3, 2, 7, 8 / 3], rtol=1e-6)
    np.testing.assert_allclose(st.count, [3, 2, 3, 1, 2, 3])
    np.testing.assert_allclose(
        st.std, [np.std([1, 3, 4], ddof=1), np.std([5, 9], ddof=1), np.std([1, 3, 4], ddof=1), 0, np.std([5, 9], ddof=1), np.std([1, 3, 4], ddof=1)], rtol=1e-6
    )


def test_registry_names_aliases_and_custom_estimator():
    for name in ("gae", "grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"):
        assert name in ADVANTAGE_ESTIMATORS
    assert get_advantage_estimator("reinforce-plus-plus") is get_advantage_estimator("reinforce_pp")
    with pytest.raises(UnknownNameError, match=r"^unknown advantage estimator 'nope'; known: .*\bgae, .*\bgrpo\b"):
        get_advantage_estimator("nope")
    with pytest.raises(UnknownNameError, match=r"did you mean 'rloo'\?$"):
        get_advantage_estimator("rlo")
    with pytest.raises(ValueError):
        compute_advantages("grpo", rewards=np.zeros(2), loss_mask=np.ones((2, 3)))

    @register_advantage_estimator("test_constant", overwrite=True)
    def _const(x, settings):
        adv = jnp.ones(x.loss_mask.shape) * x.loss_mask
        return AdvantageOutput(adv, adv)

    out = compute_advantages("test_constant", rewards=np.zeros(2), loss_mask=np.ones((2, 3), np.float32))
    np.testing.assert_allclose(out.advantages, np.ones((2, 3)))
