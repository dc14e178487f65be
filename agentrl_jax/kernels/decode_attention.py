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

from typing import NamedTuple

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


class RaggedTiling(NamedTuple):
    """The ragged kernel's grid: ``block_k`` keys per loop step, ``k_splits`` splits of the row
    (programs that run in parallel and are combined in XLA), Triton ``num_warps`` and
    ``num_stages`` (software-pipelined loads)."""

    block_k: int
    k_splits: int
    num_warps: int
    num_stages: int


def ragged_tiling(max_length: int, long_split: int = 1024) -> RaggedTiling | None:
    """The tiling for a cache row of ``max_length`` positions, or None when no block of 16+
    positions divides it (the engine then uses the dense attention).

    From the sweep ``benchmarks/contenders/decode_attention.py`` (docs/PERFORMANCE.md, "Attention tiling
    sweep"): a short row (``<= long_split``) is one split of 32-key blocks with 2 warps and 3
    stages (faster there than 128-key blocks); a long row is cut into splits of at least
    ``long_split`` keys in 64-key blocks with 4 warps and 2 stages (faster than 16 splits of
    256)."""
    if max_length <= long_split:
        block_k = next((b for b in (32, 16) if max_length % b == 0), None)
        return None if block_k is None else RaggedTiling(block_k, 1, 2, 3)
    for block_k in (64, 128, 32, 16):
        if max_length % block_k == 0:
            blocks = max_length // block_k
            splits = max((d for d in range(1, blocks + 1)
                          if blocks % d == 0 and max_length // d >= long_split), default=1)
            return RaggedTiling(block_k, splits, 4, 2)
    return None


def ragged_decode_attention(q: jax.Array, cache_k: jax.Array, cache_v: jax.Array,
                            lengths: jax.Array, interpret: bool = False) -> jax.Array:
    """The same function as :func:`dense_decode_attention`, reading only valid KV blocks."""
    from jax.experimental.pallas.ops.gpu.decode_attention import mqa

    b, h, dh = q.shape
    kh, s = cache_k.shape[1], cache_k.shape[2]
    tiling = ragged_tiling(s)
    if tiling is None:
        raise ValueError(f"ragged decode attention needs a cache length divisible by 16, got {s}")
    g = h // kh
    rows_q = q.reshape(b * kh, g, dh)
    rows_k = cache_k.reshape(b * kh, s, dh)
    rows_v = cache_v.reshape(b * kh, s, dh)
    rows_len = jnp.repeat(lengths.astype(jnp.int32), kh)
    out = mqa(rows_q, rows_k.astype(q.dtype), rows_v.astype(q.dtype), kv_seq_len=rows_len,
              sm_scale=dh ** -0.5, block_h=16, block_k=tiling.block_k,
              k_splits=tiling.k_splits, num_warps=tiling.num_warps,
              num_stages=tiling.num_stages, interpret=interpret)
    return out.reshape(b, h, dh).astype(q.dtype)


__all__ = ["dense_decode_attention", "ragged_decode_attention", "ragged_tiling", "RaggedTiling"]
