"""Generalised advantage estimation over token-level trajectories with observation spans:
the raw recurrence (several implementations, the same numbers) and the registered ``gae``
estimator. Batch contract and multi-turn rule: :mod:`agentrl_jax.algorithms.advantages`.

    delta_t = r_t + gamma V_{t'} - V_t          (t' the next generated token)
    A_t = delta_t + gamma lam A_{t'},  R_t = A_t + V_t
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .advantages import (AdvantageInputs, AdvantageOutput, AdvantageSettings,
                         register_advantage_estimator)
from .masked import as_mask, effective_token_rewards, masked_whiten
from .scan import masked_discounted_suffix_sum, reverse_linear_recurrence

Array = jax.Array

__all__ = ["GAE_METHODS", "gae_advantages_raw", "gae"]


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
        (:mod:`agentrl_jax.kernels.gae`; ``interpret`` mode elsewhere).
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
    else:  # pallas: the kernels where their parameter range is met, else the XLA scans
        from agentrl_jax.kernels import gae as pallas_gae  # lazy: pallas import is optional

        if pallas_gae.supported(gamma, lam):
            A = pallas_gae.gae_pallas_full(r, V, m, gamma=gamma, lam=lam, whiten=False)[2]
        else:
            fallback = "blocked" if lam > 0 else "associative"
            return gae_advantages_raw(r, V, m, gamma=gamma, lam=lam, method=fallback, chunk=chunk)
    return A * m


@register_advantage_estimator("gae", inputs=("values", "token_rewards"))
def gae(x: AdvantageInputs, settings: AdvantageSettings) -> AdvantageOutput:
    """GAE with the multi-turn masking rule (see :func:`gae_advantages_raw`).

    ``r = place_outcome_reward(rewards) + m*token_rewards``; ``A`` = GAE;
    ``returns = (A + V) * m`` (value targets); ``advantages = whiten(A over m) * m``
    (mean / unbiased var over masked tokens, ``rsqrt(var + 1e-8)``) unless
    ``whiten=False``. Matches verl ``gae`` and Tunix ``gae``.
    """
    if x.values is None:
        raise ValueError("the 'gae' estimator needs values [B, T] from a critic")
    gamma, lam, whiten, method = settings.gamma, settings.lam, settings.whiten, settings.method
    m = as_mask(x.loss_mask)
    r = effective_token_rewards(x.rewards, m, x.token_rewards)
    V = jnp.asarray(x.values, jnp.float32)
    if method == "pallas":
        from agentrl_jax.kernels import gae as pallas_gae

        if pallas_gae.supported(gamma, lam):  # kernels with fused whitening statistics
            adv, returns, _ = pallas_gae.gae_pallas_full(r, V, m, gamma=gamma, lam=lam, whiten=whiten)
            return AdvantageOutput(adv, returns)
    A = gae_advantages_raw(r, V, m, gamma=gamma, lam=lam, method=method, chunk=settings.chunk)
    returns = (A + V) * m
    adv = masked_whiten(A, m) * m if whiten else A
    return AdvantageOutput(adv, returns)
