"""Loss aggregation: a per-token loss ``[B, T]`` reduced to a scalar (pure, jit-able), by mode.

Aggregation modes (``LOSS_AGGREGATIONS``; ``-`` and ``_`` spellings accepted)::

    token_mean:               sum_bt l*m / sum_bt m
    seq_mean_token_sum:       mean_b( sum_t l*m )
    seq_mean_token_mean:      mean_b( sum_t l*m / sum_t m )
    seq_mean_token_sum_norm:  mean_b( sum_t l*m ) / max_len     (Dr.GRPO; max_len defaults to T)

``mean_b`` runs over valid (not fully masked) rows. ``denom`` overrides the
denominator (global token count for ``token_mean``, global number of sequences for
the ``seq_*`` modes) so that gradient accumulation / data parallel shards sum to
the full-batch loss.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from agentrl_common.registry import Registry, snake_case

from .masked import as_mask

Array = jax.Array

#: name -> ``fn(loss_mat [B,T], mask [B,T] float, *, max_len, denom) -> scalar``
LOSS_AGGREGATIONS: Registry = Registry("loss aggregation", normalize=snake_case)


def _n_valid_rows(m: Array) -> Array:
    return jnp.sum(jnp.any(m > 0, axis=-1).astype(jnp.float32))


@LOSS_AGGREGATIONS.register("token_mean")
def _agg_token_mean(loss_mat, m, *, max_len=None, denom=None):
    d = jnp.maximum(jnp.sum(m), 1.0) if denom is None else denom
    return jnp.sum(loss_mat * m) / d


@LOSS_AGGREGATIONS.register("seq_mean_token_sum")
def _agg_seq_mean_token_sum(loss_mat, m, *, max_len=None, denom=None):
    d = jnp.maximum(_n_valid_rows(m), 1.0) if denom is None else denom
    return jnp.sum(loss_mat * m) / d


@LOSS_AGGREGATIONS.register("seq_mean_token_mean")
def _agg_seq_mean_token_mean(loss_mat, m, *, max_len=None, denom=None):
    per_seq = jnp.sum(loss_mat * m, axis=-1) / jnp.maximum(jnp.sum(m, axis=-1), 1.0)
    d = jnp.maximum(_n_valid_rows(m), 1.0) if denom is None else denom
    return jnp.sum(per_seq) / d


@LOSS_AGGREGATIONS.register("seq_mean_token_sum_norm")
def _agg_seq_mean_token_sum_norm(loss_mat, m, *, max_len=None, denom=None):
    L = loss_mat.shape[-1] if max_len is None else max_len
    d = jnp.maximum(_n_valid_rows(m), 1.0) if denom is None else denom
    return jnp.sum(loss_mat * m) / (d * L)


def aggregate_loss(
    loss_mat: Array,
    loss_mask: Array,
    mode: str = "token_mean",
    *,
    max_len: int | None = None,
    denom: Array | float | None = None,
    token_weights: Array | None = None,
) -> Array:
    """Reduce a per-token loss ``[B, T]`` to a scalar with ``mode`` (see module doc).

    ``token_weights [B, T]`` (from :func:`aggregation_weights`): the reduction is
    ``sum(loss_mat * token_weights)`` and ``mode`` / ``max_len`` / ``denom`` are ignored: the
    weights already encode the mode over the whole batch (used for packed rows, where a row
    holds several sequences)."""
    loss_mat = jnp.asarray(loss_mat, jnp.float32)
    if token_weights is not None:
        return jnp.sum(loss_mat * jnp.asarray(token_weights, jnp.float32))
    return LOSS_AGGREGATIONS.get(mode)(loss_mat, as_mask(loss_mask), max_len=max_len, denom=denom)


def aggregation_weights(loss_mask, mode: str = "token_mean", max_len: int | None = None):
    """Per-token weights ``w [B, T]`` (NumPy float32) with ``sum(l * w) == aggregate_loss(l,
    loss_mask, mode, max_len=max_len)`` for every per-token loss ``l`` of the batch::

        token_mean:               w = m / sum(m)
        seq_mean_token_sum:       w = m / N                      (N: rows with any m > 0)
        seq_mean_token_mean:      w = m / (N * sum_t m[b])
        seq_mean_token_sum_norm:  w = m / (N * max_len)          (max_len defaults to T)

    The weights stay attached to their tokens when rows are packed or split into
    micro-batches, so any split sums to the whole batch's loss.
    """
    m = (np.asarray(loss_mask) != 0).astype(np.float64)
    mode = snake_case(mode)
    n_rows = max(float(np.any(m > 0, axis=-1).sum()), 1.0)
    if mode == "token_mean":
        w = m / max(m.sum(), 1.0)
    elif mode == "seq_mean_token_sum":
        w = m / n_rows
    elif mode == "seq_mean_token_mean":
        w = m / (n_rows * np.maximum(m.sum(-1, keepdims=True), 1.0))
    elif mode == "seq_mean_token_sum_norm":
        w = m / (n_rows * (m.shape[-1] if max_len is None else max_len))
    else:
        raise ValueError(f"no token weights for loss aggregation {mode!r}")
    return w.astype(np.float32)
