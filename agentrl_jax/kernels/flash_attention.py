"""Packed-row causal attention on NVIDIA GPUs: JAX's Pallas (Triton) flash attention
(``jax.experimental.pallas.ops.gpu.attention.mha``) with segment ids.

``q [B, T, H, Dh]``, ``k, v [B, T, K, Dh]`` (GQA: ``H = K * G``; keys / values are repeated to
``H`` heads, the kernel has no GQA mode), ``segment_ids [B, T]`` int or None. Token ``t``
attends to ``s <= t`` with ``segment_ids[b, s] == segment_ids[b, t]``: the same function as
``models.attention.chunked_causal_attention`` without a key mask, forward and backward in fused
Triton kernels (memory O(B*H*T*Dh)). ``T`` must be a multiple of 32 (the kernel's blocks are
128, 64 or 32, the largest that divides it): a packed row's length (``learner.pack_length``) is
chosen so. ``interpret=True`` runs the kernels in the Pallas interpreter (CPU tests).

Split over a device mesh by ``models.sharded_attention.sharded_pallas_causal_attention``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def pallas_causal_attention(q: jax.Array, k: jax.Array, v: jax.Array,
                            segment_ids: jax.Array | None = None,
                            interpret: bool = False) -> jax.Array:
    """``q [B, T, H, Dh]``, ``k, v [B, T, K, Dh]``, ``segment_ids [B, T]`` or None ->
    ``[B, T, H, Dh]``: ``out[b, t, h] = sum_{s <= t, seg[s] == seg[t]} softmax_s(q . k /
    sqrt(Dh)) v[b, s, h // G]``."""
    from jax.experimental.pallas.ops.gpu.attention import BlockSizes, mha

    h, kh = q.shape[2], k.shape[2]
    if h != kh:
        k = jnp.repeat(k, h // kh, axis=2)
        v = jnp.repeat(v, h // kh, axis=2)
    t = q.shape[1]
    block = 128 if t % 128 == 0 else (64 if t % 64 == 0 else 32)
    if t % block:
        raise ValueError(f"pallas attention needs a length that is a multiple of 32, got {t}")
    sizes = BlockSizes(block_q=block, block_k=block, block_q_dkv=min(block, 64),
                       block_kv_dkv=min(block, 64), block_q_dq=min(block, 64),
                       block_kv_dq=min(block, 64))
    seg = None if segment_ids is None else segment_ids.astype(jnp.int32)
    return mha(q, k, v, seg, sm_scale=q.shape[-1] ** -0.5, causal=True, block_sizes=sizes,
               interpret=interpret)


__all__ = ["pallas_causal_attention"]
