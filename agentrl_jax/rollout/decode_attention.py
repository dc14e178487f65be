"""Decode-step attention over the engine's head-major KV cache ``[B, K, S, Dh]``.

A decode step has one query per slot (``T = 1``); slot ``b``'s query at position ``p_b`` attends
to cache positions ``0..p_b``. Two implementations of the same function:

* :func:`dense_decode_attention` -- XLA einsums over every slot's whole allocated row: reads
  ``B x S`` keys and values per layer whatever the slots' lengths (the engine's original path;
  any backend).
* :func:`ragged_decode_attention` -- flash-decoding over only each slot's valid KV: JAX's Pallas
  (Triton) split-K decode kernel (``jax.experimental.pallas.ops.gpu.decode_attention.mqa``) with
  a per-row key length. The cache is viewed as ``B*K`` rows of ``[S, Dh]`` (a free reshape of the
  head-major layout, no transpose) and the ``G = H / K`` query heads of a KV head form one row's
  queries (GQA without repeating keys). The sequence is cut into ``k_splits`` splits of whole
  ``block_k`` blocks; a split that starts past a row's length is skipped and a split's loop
  stops at the row's last block, so the bytes read are ``~sum_b ceil(len_b / block_k) *
  block_k`` instead of ``B x S``. The splits' partial softmax sums are combined in XLA.
  ``interpret=True`` runs the kernel in the Pallas interpreter (CPU tests).

Both return ``[B, H, Dh]`` in the query dtype; scores and the softmax are float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def dense_decode_attention(q: jax.Array, cache_k: jax.Array, cache_v: jax.Array,
                           lengths: jax.Array) -> jax.Array:
    """``q [B, H, Dh]``, ``cache_k / cache_v [B, K, S, Dh]``, ``lengths [B]`` (keys
    ``0..lengths[b]-1`` are visible to row ``b``; 0: none, the output is 0) -> ``[B, H, Dh]``.

    ``out[b, h] = sum_s softmax_s(q[b,h] . k[b,h//G,s] / sqrt(Dh), s < len_b) v[b,h//G,s]``."""
    b, h, dh = q.shape
    kh, s = cache_k.shape[1], cache_k.shape[2]
    qg = q.reshape(b, kh, h // kh, dh)
    scores = jnp.einsum("bkgd,bksd->bkgs", qg, cache_k.astype(q.dtype),
                        preferred_element_type=jnp.float32) * (dh ** -0.5)
    mask = jnp.arange(s)[None, None, None, :] < lengths[:, None, None, None]
    scores = jnp.where(mask, scores, -jnp.inf)
    probs = jnp.exp(scores - jnp.max(jnp.where(mask, scores, -1e30), axis=-1, keepdims=True))
    probs = probs / jnp.maximum(probs.sum(-1, keepdims=True), 1e-30)
    out = jnp.einsum("bkgs,bksd->bkgd", probs.astype(cache_v.dtype), cache_v,
                     preferred_element_type=jnp.float32)
    return out.reshape(b, h, dh).astype(q.dtype)


def ragged_blocks(max_length: int, target_split: int = 256) -> tuple[int, int] | None:
    """``(block_k, k_splits)`` for a cache of ``max_length`` positions: the largest block of
    (128, 64, 32, 16) that divides it, and the most splits of whole blocks that keep each split
    ``>= target_split`` positions (one split when the row is short). None when no block divides
    ``max_length`` (the engine then uses the dense attention)."""
    for block_k in (128, 64, 32, 16):
        if max_length % block_k == 0:
            blocks = max_length // block_k
            splits = max((d for d in range(1, blocks + 1)
                          if blocks % d == 0 and max_length // d >= min(target_split,
                                                                        max_length)),
                         default=1)
            return block_k, splits
    return None


def ragged_decode_attention(q: jax.Array, cache_k: jax.Array, cache_v: jax.Array,
                            lengths: jax.Array, interpret: bool = False) -> jax.Array:
    """The same function as :func:`dense_decode_attention`, reading only valid KV blocks."""
    from jax.experimental.pallas.ops.gpu.decode_attention import mqa

    b, h, dh = q.shape
    kh, s = cache_k.shape[1], cache_k.shape[2]
    blocks = ragged_blocks(s)
    if blocks is None:
        raise ValueError(f"ragged decode attention needs a cache length divisible by 16, got {s}")
    block_k, k_splits = blocks
    g = h // kh
    rows_q = q.reshape(b * kh, g, dh)
    rows_k = cache_k.reshape(b * kh, s, dh)
    rows_v = cache_v.reshape(b * kh, s, dh)
    rows_len = jnp.repeat(lengths.astype(jnp.int32), kh)
    out = mqa(rows_q, rows_k.astype(q.dtype), rows_v.astype(q.dtype), kv_seq_len=rows_len,
              sm_scale=dh ** -0.5, block_h=16, block_k=block_k, k_splits=k_splits,
              interpret=interpret)
    return out.reshape(b, h, dh).astype(q.dtype)


__all__ = ["dense_decode_attention", "ragged_decode_attention", "ragged_blocks"]
