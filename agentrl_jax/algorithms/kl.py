"""Per-token KL estimators between the policy and a reference policy.

With ``log r = logp - logp_ref`` (sampled from the policy), J. Schulman's estimators
of ``KL(pi || pi_ref)``:

* ``k1`` (``kl``): ``log r``                               unbiased, high variance, can be < 0
* ``k2`` (``mse``): ``0.5 * (log r)^2``                   biased, low variance, >= 0
* ``k3`` (``low_var_kl``): ``exp(-log r) - 1 + log r``    unbiased, low variance, >= 0;
  as verl: ``-log r`` is clamped to ``[-20, 20]`` before ``exp`` and the result to
  ``[-10, 10]``.
* ``abs``: ``|log r|``

Used either as a loss term (:func:`kl_loss`, AgentGym-RL: ``low_var_kl``, coef 1e-3)
or folded into the rewards (:func:`kl_penalized_token_rewards`, classic PPO-RLHF,
verl ``use_kl_in_reward``).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from agentrl_common.registry import Registry, snake_case

from .aggregation import aggregate_loss
from .masked import as_mask

Array = jax.Array

#: name -> ``fn(logprobs [B,T], ref_logprobs [B,T]) -> kl [B,T]``
KL_ESTIMATORS: Registry = Registry("KL estimator", normalize=snake_case)


@KL_ESTIMATORS.register("k1")
def kl_k1(logprobs: Array, ref_logprobs: Array) -> Array:
    """``k1 = logp - logp_ref``  ([B, T])."""
    return jnp.asarray(logprobs, jnp.float32) - jnp.asarray(ref_logprobs, jnp.float32)


@KL_ESTIMATORS.register("k2")
def kl_k2(logprobs: Array, ref_logprobs: Array) -> Array:
    """``k2 = 0.5 * (logp - logp_ref)^2``  ([B, T])."""
    return 0.5 * jnp.square(kl_k1(logprobs, ref_logprobs))


@KL_ESTIMATORS.register("k3")
def kl_k3(logprobs: Array, ref_logprobs: Array, *, inner_clamp: float = 20.0, out_clamp: float = 10.0) -> Array:
    """``k3 = exp(logp_ref - logp) - (logp_ref - logp) - 1`` ("low_var_kl"), verl's clamps:
    ``logp_ref - logp`` to ``[-inner_clamp, inner_clamp]``, the result to
    ``[-out_clamp, out_clamp]``  ([B, T])."""
    x = jnp.clip(-kl_k1(logprobs, ref_logprobs), -inner_clamp, inner_clamp)
    return jnp.clip(jnp.exp(x) - x - 1.0, -out_clamp, out_clamp)


@KL_ESTIMATORS.register("abs")
def kl_abs(logprobs: Array, ref_logprobs: Array) -> Array:
    """``|logp - logp_ref|``  ([B, T])."""
    return jnp.abs(kl_k1(logprobs, ref_logprobs))


for _alias, _target in (("kl", "k1"), ("mse", "k2"), ("low_var_kl", "k3")):
    KL_ESTIMATORS.register(_alias, KL_ESTIMATORS.get(_target))
del _alias, _target


def get_kl_estimator(name: str) -> Callable[[Array, Array], Array]:
    """``k1 | k2 | k3 | low_var_kl | kl | mse | abs``."""
    return KL_ESTIMATORS.get(name)


def kl_estimate(logprobs: Array, ref_logprobs: Array, estimator: str = "low_var_kl") -> Array:
    """Per-token KL estimate ``[B, T]`` (unmasked)."""
    return get_kl_estimator(estimator)(logprobs, ref_logprobs)


def kl_loss(
    logprobs: Array,
    ref_logprobs: Array,
    loss_mask: Array,
    *,
    estimator: str = "low_var_kl",
    agg: str = "token_mean",
    max_len: int | None = None,
    denom: Array | float | None = None,
) -> Array:
    """KL as a loss term: ``aggregate(kl_estimate(logp, logp_ref), loss_mask, agg)`` (scalar).

    Gradients flow through ``logprobs`` (``ref_logprobs`` is treated as a constant).
    """
    kl = kl_estimate(logprobs, jax.lax.stop_gradient(ref_logprobs), estimator)
    return aggregate_loss(kl, loss_mask, agg, max_len=max_len, denom=denom)


def kl_penalized_token_rewards(
    token_rewards: Array | None,
    logprobs: Array,
    ref_logprobs: Array,
    loss_mask: Array,
    kl_coef: float,
    *,
    estimator: str = "k1",
) -> Array:
    """Fold a KL penalty into per-token rewards: ``r'_t = r_t - kl_coef * kl_t`` on
    generated tokens (``[B, T]``; mask-0 tokens keep ``r_t``, or 0).

    ``logprobs`` are the behaviour / old policy log-probs of the sampled tokens (verl
    uses ``old_log_prob``); the result is a constant for the learner (no gradient).
    Pass it as ``token_rewards`` to :func:`~agentrl_jax.algorithms.advantages.compute_advantages`.
    """
    m = as_mask(loss_mask)
    kl = jax.lax.stop_gradient(kl_estimate(logprobs, ref_logprobs, estimator))
    base = jnp.zeros_like(m) if token_rewards is None else jnp.asarray(token_rewards, jnp.float32)
    return base - kl_coef * kl * m
