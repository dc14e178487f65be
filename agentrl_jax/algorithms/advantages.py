"""Advantage estimators for multi-turn agentic RL (GAE, GRPO, Dr.GRPO, RLOO,
REINFORCE++, REINFORCE++-baseline), chosen by name from config.

Batch contract (``B`` trajectories, ``T`` tokens each):

* ``rewards [B]``: outcome score of each trajectory. It is placed on the trajectory's
  LAST GENERATED token (:func:`~agentrl_jax.algorithms.masked.place_outcome_reward`).
* ``loss_mask [B, T]``: 1 on generated tokens, 0 on prompt / observation / padding.
  Observation spans (mask 0) may sit in the middle of a trajectory.
* ``group_ids [B]`` int: samples of the same task share an id (any values, any order).
* ``values [B, T]``: critic values (GAE only).
* ``token_rewards [B, T]`` (optional): extra per-token rewards (e.g. per-turn rewards
  or a KL penalty from :func:`~agentrl_jax.algorithms.kl.kl_penalized_token_rewards`);
  entries on mask-0 tokens are ignored.

Every estimator returns ``AdvantageOutput(advantages [B, T], returns [B, T])`` with
zeros on mask-0 tokens and on fully masked rows, finite for groups of one,
zero-variance groups and fully masked rows. All estimators are ``jax.jit``-ed;
scalar options (``gamma``, ``lam``, ``eps``, ``whiten``, ``method``, ``chunk``) are
static (pass Python numbers): one compilation per configuration.

Multi-turn rule (GAE and REINFORCE++): at a mask-0 token the running advantage /
return and the "next value" pass through unchanged, so credit from a later turn
flows back across observation spans to earlier turns; discounting (``gamma``,
``gamma*lam``) is applied per generated token only.

Example::

    out = compute_advantages("grpo", rewards=r, loss_mask=m, group_ids=g)
    adv, ret = out  # or out.advantages, out.returns
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from agentrl_common.registry import Registry, snake_case

from .masked import (
    as_mask,
    effective_token_rewards,
    group_stats,
    masked_whiten,
    outcome_scores,
)
from .scan import masked_discounted_suffix_sum, reverse_linear_recurrence

Array = jax.Array

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AdvantageOutput",
    "compute_advantages",
    "get_advantage_estimator",
    "register_advantage_estimator",
    "gae_advantages_raw",
    "GAE_METHODS",
    "TURN_INPUTS",
    "is_turn_level",
    "LOGPROB_INPUTS",
    "is_logprob_level",
]


class AdvantageOutput(NamedTuple):
    """``advantages [B, T]`` (what the policy loss uses) and ``returns [B, T]``
    (value targets for GAE, discounted returns for REINFORCE++, = advantages for
    the outcome-only estimators, as in verl)."""

    advantages: Array
    returns: Array


#: name -> jitted estimator ``fn(*, rewards, loss_mask, group_ids, values, token_rewards,
#: gamma, lam, eps, whiten, method, chunk) -> AdvantageOutput``
ADVANTAGE_ESTIMATORS: Registry = Registry("advantage estimator", normalize=snake_case)

_STATIC = ("gamma", "lam", "eps", "whiten", "method", "chunk")

#: per-turn inputs of the turn-level estimators (``gigpo``): ``turn_ids [B, T]``,
#: ``turn_rewards [B, K]``, ``turn_anchors [B, K]`` (see ``training/batching.py``)
TURN_INPUTS = ("turn_ids", "turn_rewards", "turn_anchors")

#: names (normalised) of the estimators that take :data:`TURN_INPUTS`
_TURN_LEVEL: set[str] = set()

#: log-prob inputs of the preference estimators (``dpo``): ``logprobs [B, T]`` (the current
#: policy's, before the update) and ``ref_logprobs [B, T]`` (the frozen reference's)
LOGPROB_INPUTS = ("logprobs", "ref_logprobs")

#: names (normalised) of the estimators that take :data:`LOGPROB_INPUTS`
_LOGPROB_LEVEL: set[str] = set()


def register_advantage_estimator(name: str, *, jit: bool = True, overwrite: bool = False,
                                 static: tuple[str, ...] = (), turn_level: bool = False,
                                 logprob_level: bool = False):
    """Decorator: register an estimator under ``name`` (jitted with the standard
    static options, plus ``static`` names of its own scalar options, unless
    ``jit=False``). The function must accept the keyword-only signature of
    :func:`compute_advantages` (unused options may be ignored). ``turn_level``: it
    also takes the per-turn arrays :data:`TURN_INPUTS` (callers pass them only to
    such estimators). ``logprob_level``: it takes :data:`LOGPROB_INPUTS` (the learner
    then computes reference log-probs and passes both)."""

    def deco(fn: Callable) -> Callable:
        f = jax.jit(fn, static_argnames=_STATIC + tuple(static)) if jit else fn
        ADVANTAGE_ESTIMATORS.register(name, f, replace=overwrite)
        if turn_level:
            _TURN_LEVEL.add(snake_case(name))
        if logprob_level:
            _LOGPROB_LEVEL.add(snake_case(name))
        return f

    return deco


def is_turn_level(name: str) -> bool:
    """Whether estimator ``name`` takes the per-turn arrays (:data:`TURN_INPUTS`)."""
    return snake_case(name) in _TURN_LEVEL


def is_logprob_level(name: str) -> bool:
    """Whether estimator ``name`` takes policy / reference log-probs (:data:`LOGPROB_INPUTS`)."""
    return snake_case(name) in _LOGPROB_LEVEL


def get_advantage_estimator(name: str) -> Callable[..., AdvantageOutput]:
    """The registered (jitted) estimator called ``name`` (``-``/``_`` and case
    insensitive). Raises ``UnknownNameError`` (a ``ValueError``) listing the choices."""
    return ADVANTAGE_ESTIMATORS.get(name)


def compute_advantages(
    name: str,
    *,
    rewards: Array,
    loss_mask: Array,
    group_ids: Array | None = None,
    values: Array | None = None,
    token_rewards: Array | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    eps: float = 1e-6,
    whiten: bool = True,
    method: str = "auto",
    chunk: int = 64,
    turn_ids: Array | None = None,
    turn_rewards: Array | None = None,
    turn_anchors: Array | None = None,
    logprobs: Array | None = None,
    ref_logprobs: Array | None = None,
    **options,
) -> AdvantageOutput:
    """Single entry point: ``compute_advantages(cfg.adv_estimator, rewards=..., ...)``.

    Args:
      name: ``gae | grpo | dr_grpo | rloo | reinforce_pp | reinforce_pp_baseline |
        gigpo``
        (aliases: ``reinforce_plus_plus``, ``reinforce_plus_plus_baseline``,
        ``drgrpo``) or any name added with :func:`register_advantage_estimator`.
      rewards: ``[B]`` outcome scores.
      loss_mask: ``[B, T]`` 1 on generated tokens.
      group_ids: ``[B]`` int task ids (group estimators).
      values: ``[B, T]`` critic values (``gae``).
      token_rewards: ``[B, T]`` optional per-token rewards (added on generated tokens).
      gamma: discount per generated token (``gae``, ``reinforce_pp``); per turn
        (``gigpo``).
      lam: GAE lambda.
      eps: ``grpo`` std epsilon: ``(R - mean) / (std + eps)``.
      whiten: whiten advantages over the batch's masked tokens (``gae``,
        ``reinforce_pp``; always on for ``reinforce_pp_baseline`` as in verl).
      method: recurrence implementation for ``gae`` / ``reinforce_pp``:
        ``auto | blocked | associative | scan | pallas`` (see :data:`GAE_METHODS`;
        ``auto`` = ``scan`` on CPU, ``blocked`` on GPU/TPU).
      chunk: chunk length of the blocked scan.
      turn_ids, turn_rewards, turn_anchors: per-turn inputs of the turn-level
        estimators (``gigpo``; :data:`TURN_INPUTS`); ignored by the others, so a
        caller may always pass what its batch holds.
      logprobs, ref_logprobs: ``[B, T]`` policy (before the update) and reference
        log-probs of the preference estimators (``dpo``); ignored by the others.
      options: the estimator's own static options (``gigpo``: ``omega``,
        ``norm_std``; ``dpo``: ``beta``).

    Returns:
      ``AdvantageOutput(advantages [B, T], returns [B, T])`` (float32).
    """
    fn = get_advantage_estimator(name)
    if is_turn_level(name):
        options.update(turn_ids=turn_ids, turn_rewards=turn_rewards, turn_anchors=turn_anchors)
    if is_logprob_level(name):
        options.update(logprobs=logprobs, ref_logprobs=ref_logprobs)
    return fn(
        rewards=rewards,
        loss_mask=loss_mask,
        group_ids=group_ids,
        values=values,
        token_rewards=token_rewards,
        gamma=gamma,
        lam=lam,
        eps=eps,
        whiten=whiten,
        method=method,
        chunk=chunk,
        **options,
    )


# --------------------------------------------------------------------------- GAE

#: GAE / REINFORCE++ recurrence implementations (all give the same numbers).
GAE_METHODS = ("auto", "blocked", "associative", "scan", "pallas")

#: below this lambda the blocked GAE's lambda-trick loses precision (error ~ eps/lam):
#: ``auto`` then uses the associative scan.
_BLOCKED_MIN_LAM = 0.05


def _resolve_gae_method(method: str, lam: float) -> str:
    if method == "auto":
        if jax.default_backend() == "cpu":
            return "scan"  # a sequential loop is the fastest thing on a CPU
        return "blocked" if lam >= _BLOCKED_MIN_LAM else "associative"
    if method not in GAE_METHODS:
        raise ValueError(f"unknown GAE method {method!r}; choices: {GAE_METHODS}")
    if method == "blocked" and lam <= 0:
        raise ValueError("method='blocked' needs lam > 0; use 'associative' for lam == 0")
    return method


def _next_generated_value(values: Array, m: Array, method: str) -> Array:
    """``Vn[b, t]`` = value at the first generated token strictly after ``t`` (0 if none).

    ``U_t = m_t V_t + (1 - m_t) U_{t+1}`` ("last seen" recurrence), ``Vn_t = U_{t+1}``.
    """
    U = reverse_linear_recurrence(1.0 - m, m * values, method=method)
    return jnp.concatenate([U[:, 1:], jnp.zeros_like(U[:, :1])], axis=1)


def gae_advantages_raw(
    token_rewards: Array,
    values: Array,
    loss_mask: Array,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
    method: str = "auto",
    chunk: int = 64,
) -> Array:
    """Un-whitened multi-turn GAE advantages ``A [B, T]`` (garbage-free: 0 on mask 0).

    Per token, scanning backwards with ``m_t`` the loss mask::

        m_t = 1:  delta_t = r_t + gamma * Vnext - V_t
                  A_t     = delta_t + gamma * lam * A_{t+1}
                  Vnext   <- V_t
        m_t = 0:  A_t = A_{t+1},  Vnext unchanged      (observation / prompt / pad)

    i.e. the linear recurrence ``A_t = a_t A_{t+1} + b_t`` with
    ``a_t = gamma*lam if m_t else 1`` and ``b_t = m_t * delta_t``. This is exactly
    verl's ``compute_gae_advantage_return`` (multi-turn version) and Tunix's
    ``compute_gae_advantages``.

    Methods:
      * ``scan``: ``lax.scan`` with carry ``(A, Vnext)`` (the reference loop).
      * ``associative``: ``Vnext`` from a "last generated value" associative scan,
        then the ``A`` recurrence with ``lax.associative_scan`` (O(log T) depth).
      * ``blocked``: no ``Vnext`` at all. With ``S(x)_t = sum_{s>=t} (gamma lam)^{n(t,s)} x_s``
        (``n(t,s)`` = generated tokens in ``[t,s)``),
        ``A = S(m r) + (1-lam)/lam * S(m V) - m V / lam`` on generated tokens
        (the ``gamma V_{next}`` terms telescope into ``S(mV)``). Both suffix sums come
        from one blocked two-level scan (:mod:`.scan`). Needs ``lam > 0``; relative
        error grows like ``float_eps / lam``.
      * ``pallas``: GPU Pallas (Triton) kernel of the blocked scan
        (:mod:`.pallas_gae`; ``interpret`` mode elsewhere).
      * ``auto``: ``scan`` on CPU; on accelerators ``blocked`` if ``lam >= 0.05``
        else ``associative``.
    """
    m = as_mask(loss_mask)
    r = jnp.asarray(token_rewards, jnp.float32) * m
    V = jnp.asarray(values, jnp.float32)
    method = _resolve_gae_method(method, lam)
    if method == "scan":

        def step(carry, xs):
            last_adv, next_v = carry
            r_t, v_t, m_t = xs
            delta = r_t + gamma * next_v - v_t
            adv = delta + gamma * lam * last_adv
            next_v = m_t * v_t + (1.0 - m_t) * next_v
            last_adv = m_t * adv + (1.0 - m_t) * last_adv
            return (last_adv, next_v), last_adv

        B = m.shape[0]
        init = (jnp.zeros((B,), jnp.float32), jnp.zeros((B,), jnp.float32))
        _, A_T = jax.lax.scan(step, init, (r.T, V.T, m.T), reverse=True)
        A = A_T.T
    elif method == "associative":
        Vn = _next_generated_value(V, m, "associative")
        delta = m * (r + gamma * Vn - V)
        a = jnp.where(m > 0, gamma * lam, 1.0)
        A = reverse_linear_recurrence(a, delta, method="associative")
    elif method == "blocked":
        mV = m * V
        S = masked_discounted_suffix_sum(jnp.stack([r, mV]), m, gamma * lam, method="blocked", chunk=chunk)
        A = S[0] - mV / lam
        if lam != 1.0:
            A = A + ((1.0 - lam) / lam) * S[1]
    else:  # pallas
        from .pallas_gae import gae_pallas  # lazy: pallas import is optional

        A = gae_pallas(r, V, m, gamma=gamma, lam=lam)
    return A * m


@register_advantage_estimator("gae")
def gae(
    *,
    rewards,
    loss_mask,
    group_ids=None,
    values=None,
    token_rewards=None,
    gamma=1.0,
    lam=1.0,
    eps=1e-6,
    whiten=True,
    method="auto",
    chunk=64,
) -> AdvantageOutput:
    """GAE with the multi-turn masking rule (see :func:`gae_advantages_raw`).

    ``r = place_outcome_reward(rewards) + m*token_rewards``; ``A`` = GAE;
    ``returns = (A + V) * m`` (value targets); ``advantages = whiten(A over m) * m``
    (mean / unbiased var over masked tokens, ``rsqrt(var + 1e-8)``) unless
    ``whiten=False``. Matches verl ``gae`` and Tunix ``gae``.
    """
    if values is None:
        raise ValueError("the 'gae' estimator needs values [B, T] from a critic")
    m = as_mask(loss_mask)
    r = effective_token_rewards(rewards, m, token_rewards)
    V = jnp.asarray(values, jnp.float32)
    if method == "pallas":
        from . import pallas_gae

        if pallas_gae.supported(gamma, lam):  # kernels with fused whitening statistics
            adv, returns, _ = pallas_gae.gae_pallas_full(r, V, m, gamma=gamma, lam=lam, whiten=whiten)
            return AdvantageOutput(adv, returns)
    A = gae_advantages_raw(r, V, m, gamma=gamma, lam=lam, method=method, chunk=chunk)
    returns = (A + V) * m
    adv = masked_whiten(A, m) * m if whiten else A
    return AdvantageOutput(adv, returns)


def _require_groups(group_ids, name: str):
    if group_ids is None:
        raise ValueError(f"the {name!r} estimator needs group_ids [B]")


def _outcome_setup(rewards, loss_mask, token_rewards, group_ids):
    m = as_mask(loss_mask)
    valid = jnp.any(m > 0, axis=-1)
    R = outcome_scores(rewards, m, token_rewards)
    st = group_stats(R, group_ids, valid)
    return m, valid, R, st


@register_advantage_estimator("grpo")
def grpo(
    *,
    rewards,
    loss_mask,
    group_ids=None,
    values=None,
    token_rewards=None,
    gamma=1.0,
    lam=1.0,
    eps=1e-6,
    whiten=True,
    method="auto",
    chunk=64,
) -> AdvantageOutput:
    """GRPO: ``A_i = (R_i - mean_g) / (std_g + eps)`` broadcast on generated tokens.

    ``R_i = rewards_i + sum_t m_t token_rewards_t``; group stats over the valid
    (not fully masked) samples of the group, ``std`` unbiased (ddof=1) as verl's
    ``torch.std`` and Tunix's ``std(ddof=1)``. Groups of one give ``A = 0``
    (verl instead uses mean 0 / std 1, i.e. ``A = R``); zero-variance groups give 0.
    """
    _require_groups(group_ids, "grpo")
    m, valid, R, st = _outcome_setup(rewards, loss_mask, token_rewards, group_ids)
    a = jnp.where(valid & (st.count >= 2), (R - st.mean) / (st.std + eps), 0.0)
    adv = a[:, None] * m
    return AdvantageOutput(adv, adv)


@register_advantage_estimator("dr_grpo")
def dr_grpo(
    *,
    rewards,
    loss_mask,
    group_ids=None,
    values=None,
    token_rewards=None,
    gamma=1.0,
    lam=1.0,
    eps=1e-6,
    whiten=True,
    method="auto",
    chunk=64,
) -> AdvantageOutput:
    """Dr.GRPO: ``A_i = R_i - mean_g`` (no std division; pair it with the
    ``seq_mean_token_sum_norm`` loss aggregation). verl: ``grpo`` with
    ``norm_adv_by_std_in_grpo=False``; Tunix: ``std_scale=False``."""
    _require_groups(group_ids, "dr_grpo")
    m, valid, R, st = _outcome_setup(rewards, loss_mask, token_rewards, group_ids)
    a = jnp.where(valid & (st.count >= 2), R - st.mean, 0.0)
    adv = a[:, None] * m
    return AdvantageOutput(adv, adv)


@register_advantage_estimator("rloo")
def rloo(
    *,
    rewards,
    loss_mask,
    group_ids=None,
    values=None,
    token_rewards=None,
    gamma=1.0,
    lam=1.0,
    eps=1e-6,
    whiten=True,
    method="auto",
    chunk=64,
) -> AdvantageOutput:
    """RLOO: ``A_i = R_i - mean_{j != i} R_j = n/(n-1) * (R_i - mean_g)``; groups of
    one give 0 (verl leaves ``R_i`` there)."""
    _require_groups(group_ids, "rloo")
    m, valid, R, st = _outcome_setup(rewards, loss_mask, token_rewards, group_ids)
    n = st.count
    a = jnp.where(valid & (n >= 2), n / jnp.maximum(n - 1.0, 1.0) * (R - st.mean), 0.0)
    adv = a[:, None] * m
    return AdvantageOutput(adv, adv)


@register_advantage_estimator("reinforce_pp")
def reinforce_pp(
    *,
    rewards,
    loss_mask,
    group_ids=None,
    values=None,
    token_rewards=None,
    gamma=1.0,
    lam=1.0,
    eps=1e-6,
    whiten=True,
    method="auto",
    chunk=64,
) -> AdvantageOutput:
    """REINFORCE++: discounted return-to-go over generated tokens, whitened over the
    whole batch's masked tokens.

    ``G_t = r_t + gamma * G_{t+1}`` on generated tokens, ``G_t = G_{t+1}`` on mask-0
    tokens (observations pass the return through; verl's single-turn version resets
    it to 0 after the response, which in multi-turn would cut credit at every
    observation span). ``returns = G * m``; ``advantages = whiten(G over m) * m``.
    """
    m = as_mask(loss_mask)
    r = effective_token_rewards(rewards, m, token_rewards)
    if method in ("auto", "pallas"):
        meth = "scan" if jax.default_backend() == "cpu" else "blocked"
    else:
        meth = method
    G = masked_discounted_suffix_sum(r, m, gamma, method=meth, chunk=chunk) * m
    adv = masked_whiten(G, m) * m if whiten else G
    return AdvantageOutput(adv, G)


@register_advantage_estimator("reinforce_pp_baseline")
def reinforce_pp_baseline(
    *,
    rewards,
    loss_mask,
    group_ids=None,
    values=None,
    token_rewards=None,
    gamma=1.0,
    lam=1.0,
    eps=1e-6,
    whiten=True,
    method="auto",
    chunk=64,
) -> AdvantageOutput:
    """REINFORCE++-baseline: ``s_i = R_i - mean_g`` broadcast on generated tokens,
    then whitened over the batch's masked tokens (verl
    ``reinforce_plus_plus_baseline``; no discounting). Groups of one give ``s = 0``."""
    _require_groups(group_ids, "reinforce_pp_baseline")
    m, valid, R, st = _outcome_setup(rewards, loss_mask, token_rewards, group_ids)
    s = jnp.where(valid, R - st.mean, 0.0)
    adv = masked_whiten(s[:, None] * m, m) * m
    return AdvantageOutput(adv, adv)


# verl-style aliases
for _alias, _target in (
    ("reinforce_plus_plus", "reinforce_pp"),
    ("reinforce_plus_plus_baseline", "reinforce_pp_baseline"),
    ("drgrpo", "dr_grpo"),
):
    ADVANTAGE_ESTIMATORS.register(_alias, ADVANTAGE_ESTIMATORS.get(_target))
del _alias, _target
