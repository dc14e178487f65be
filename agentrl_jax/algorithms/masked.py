"""Masked reductions, outcome-reward placement and group statistics.

Conventions (shared by the whole ``algorithms`` package):

* ``loss_mask [batch, time]``: 1 on tokens the policy generated, 0 on prompt,
  observation and padding tokens. Any numeric or bool dtype; converted to float32.
* A row whose mask is all zero ("fully masked row", e.g. padding added to keep a
  static batch shape) is *invalid*: it gets zero advantages and it does not take
  part in group statistics.
* All functions are pure, shape-static and jit-able.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

Array = jax.Array

#: eps inside ``rsqrt(var + eps)`` used by ``masked_whiten`` (verl / Tunix value).
WHITEN_EPS = 1e-8


def as_mask(loss_mask: Array) -> Array:
    """``loss_mask`` as float32 0/1 (anything non-zero counts as 1)."""
    return (jnp.asarray(loss_mask) != 0).astype(jnp.float32)


def masked_mean(x: Array, mask: Array, axis=None) -> Array:
    """``sum(x*mask) / sum(mask)``; 0 where the mask is empty (never NaN)."""
    n = jnp.sum(mask, axis=axis)
    return jnp.sum(x * mask, axis=axis) / jnp.maximum(n, 1.0)


def masked_var(x: Array, mask: Array, unbiased: bool = True) -> Array:
    """Variance of the masked entries of ``x`` (scalar, all axes).

    ``unbiased`` applies Bessel's correction ``n/(n-1)`` as verl's ``masked_var``;
    with ``n <= 1`` the variance is 0 (verl raises instead).
    """
    n = jnp.sum(mask)
    mean = masked_mean(x, mask)
    var = jnp.sum(jnp.square(x - mean) * mask) / jnp.maximum(n, 1.0)
    if unbiased:
        var = jnp.where(n > 1, var * n / jnp.maximum(n - 1.0, 1.0), 0.0)
    return var


def masked_whiten(x: Array, mask: Array, eps: float = WHITEN_EPS, shift_mean: bool = True) -> Array:
    """``(x - mean) * rsqrt(var + eps)`` with mean / unbiased var over masked entries.

    Identical to ``verl.utils.torch_functional.masked_whiten`` (and Tunix's); the
    result is *not* re-masked (callers multiply by the mask).
    """
    mean = masked_mean(x, mask)
    var = masked_var(x, mask, unbiased=True)
    out = (x - mean) * jax.lax.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out


def last_generated_index(loss_mask: Array) -> tuple[Array, Array]:
    """Index of the last generated token per row.

    Returns ``(index [B] int32, has_any [B] bool)``; ``index`` is 0 for rows with no
    generated token (check ``has_any``).
    """
    m = as_mask(loss_mask)
    T = m.shape[-1]
    rev_first = jnp.argmax(m[..., ::-1], axis=-1)
    idx = (T - 1 - rev_first).astype(jnp.int32)
    has = jnp.any(m > 0, axis=-1)
    return jnp.where(has, idx, 0), has


def place_outcome_reward(rewards: Array, loss_mask: Array) -> Array:
    """Put each trajectory's outcome score on its LAST GENERATED token.

    ``rewards [B]``, ``loss_mask [B, T]`` -> ``token_rewards [B, T]`` with
    ``out[b, t] = rewards[b]`` iff ``t`` is the last index where ``loss_mask[b] != 0``;
    zero elsewhere and on fully masked rows. Placing the score on a mask-0 token
    (e.g. the final observation, as AgentGym-RL does) would hide it from GAE and
    REINFORCE++; this helper is the fix.
    """
    rewards = jnp.asarray(rewards, jnp.float32)
    idx, has = last_generated_index(loss_mask)
    T = jnp.shape(loss_mask)[-1]
    onehot = (jnp.arange(T)[None, :] == idx[:, None]) & has[:, None]
    return jnp.where(onehot, rewards[:, None], 0.0)


def effective_token_rewards(rewards: Array, loss_mask: Array, token_rewards: Array | None = None) -> Array:
    """``r[b, t] = place_outcome_reward(rewards, m)[b, t] + m[b, t] * token_rewards[b, t]``.

    Per-token rewards on mask-0 tokens are dropped (verl's multi-turn GAE also
    ignores them): put turn-level rewards on the turn's last generated token.
    """
    m = as_mask(loss_mask)
    r = place_outcome_reward(rewards, m)
    if token_rewards is not None:
        r = r + m * jnp.asarray(token_rewards, jnp.float32)
    return r


def outcome_scores(rewards: Array, loss_mask: Array, token_rewards: Array | None = None) -> Array:
    """Scalar score per trajectory: ``R[b] = rewards[b] + sum_t m[b,t] * token_rewards[b,t]``  ([B])."""
    R = jnp.asarray(rewards, jnp.float32)
    if token_rewards is not None:
        R = R + jnp.sum(as_mask(loss_mask) * jnp.asarray(token_rewards, jnp.float32), axis=-1)
    return R


class GroupStats(NamedTuple):
    """Per-SAMPLE statistics of the sample's group (all ``[B]``)."""

    mean: Array  #: mean of the group's valid scores
    std: Array  #: unbiased (ddof=1) std; 0 for groups with < 2 valid samples
    count: Array  #: number of valid samples in the group (float32)


def dense_group_index(group_ids: Array) -> Array:
    """Map arbitrary (unsorted, non-contiguous) integer group ids ``[B]`` to dense
    ids in ``[0, B)`` so that static-size segment ops with ``num_segments = B`` work.

    Ids must fit in int32 (JAX's default integer width): hash task uids into that range."""
    g = jnp.asarray(group_ids).reshape(-1)
    B = g.shape[0]
    _, inv = jnp.unique(g, return_inverse=True, size=B, fill_value=g.min() if B else 0)
    return inv.reshape(-1).astype(jnp.int32)


def group_stats(scores: Array, group_ids: Array, valid: Array | None = None) -> GroupStats:
    """Group mean / unbiased std / count of ``scores [B]`` over ``group_ids [B]``.

    Segment sums over dense group ids (works for unsorted, arbitrary ids). Samples
    with ``valid == False`` are excluded from their group's statistics (but still
    receive their group's statistics).

    ``mean_g = sum_{i in g} R_i / n_g``; ``std_g = sqrt(sum (R_i - mean_g)^2 / (n_g - 1))``
    (``torch.std`` / ``np.std(ddof=1)`` as in verl and Tunix), 0 when ``n_g < 2``.
    """
    scores = jnp.asarray(scores, jnp.float32)
    B = scores.shape[0]
    w = jnp.ones((B,), jnp.float32) if valid is None else jnp.asarray(valid).astype(jnp.float32)
    seg = dense_group_index(group_ids)
    n = jax.ops.segment_sum(w, seg, num_segments=B)
    s = jax.ops.segment_sum(w * scores, seg, num_segments=B)
    mean_g = s / jnp.maximum(n, 1.0)
    mean = mean_g[seg]
    d2 = jax.ops.segment_sum(w * jnp.square(scores - mean), seg, num_segments=B)
    var_g = jnp.where(n > 1, d2 / jnp.maximum(n - 1.0, 1.0), 0.0)
    return GroupStats(mean=mean, std=jnp.sqrt(var_g)[seg], count=n[seg])
