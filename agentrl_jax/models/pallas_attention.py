"""Packed-row causal attention on NVIDIA GPUs: JAX's Pallas (Triton) flash attention
(``jax.experimental.pallas.ops.gpu.attention.mha``) with segment ids.

``q [B, T, H, Dh]``, ``k, v [B, T, K, Dh]`` (GQA: ``H = K * G``; keys / values are repeated to
``H`` heads, the kernel has no GQA mode), ``segment_ids [B, T]`` int or None. Token ``t``
attends to ``s <= t`` with ``segment_ids[b, s] == segment_ids[b, t]``: the same function as
``attention.chunked_causal_attention`` without a key mask, forward and backward in fused Triton
kernels (memory O(B*H*T*Dh)). ``T`` must be a multiple of the kernel's blocks (128): a packed
row's length (``learner.pack_length``) is chosen so. ``interpret=True`` runs the kernels in
the Pallas interpreter (CPU tests).

On a multi-device mesh (:func:`agentrl_jax.sharding.activations.activation_mesh`, as the
learner traces its steps) :func:`sharded_pallas_causal_attention` runs the kernel inside
``jax.shard_map``: each device attends over its own rows (and, on a ``tensor`` axis, its own
heads). A ``pallas_call`` is opaque to XLA's SPMD partitioner, which otherwise gathers
``q``, ``k``, ``v`` and the segment ids onto every device and runs the whole micro-batch's
attention, forward and backward, on each of them.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from agentrl_jax.sharding.activations import attention_spec, current_mesh


def pallas_causal_attention(q: jax.Array, k: jax.Array, v: jax.Array,
                            segment_ids: jax.Array | None = None,
                            interpret: bool = False) -> jax.Array:
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


def sharded_pallas_causal_attention(q: jax.Array, k: jax.Array, v: jax.Array,
                                    segment_ids: jax.Array | None = None,
                                    interpret: bool = False,
                                    kernel: Callable[..., jax.Array] | None = None
                                    ) -> jax.Array:
    """:func:`pallas_causal_attention` (or ``kernel``, a function of the same signature, e.g.
    ``segment_attention.segment_causal_attention``) split over the current activation mesh.

    ``q [B, T, H, Dh]``, ``k, v [B, T, K, Dh]`` are laid out as
    :func:`~agentrl_jax.sharding.activations.attention_spec` says (rows over the batch axes,
    heads over ``tensor`` where it divides both head counts) and every device runs the kernel
    on its block ``[B / batch_shards, T, H / tensor_shards, Dh]``; attention never mixes rows or
    heads, so the result equals the unsplit kernel's. Without a mesh, on one device, or when
    the batch does not divide over the batch axes, the plain kernel (XLA then places it).
    """
    kernel = kernel or pallas_causal_attention
    mesh = current_mesh()
    spec = None
    if mesh is not None and mesh.size > 1:
        spec = attention_spec(mesh, q.shape[0], q.shape[2], k.shape[2])
    if spec is None or all(axis is None for axis in spec):
        return kernel(q, k, v, segment_ids, interpret=interpret)

    def local(q, k, v, *seg):
        return kernel(q, k, v, seg[0] if seg else None, interpret=interpret)

    in_specs = (spec, spec, spec) + ((P(spec[0], None),) if segment_ids is not None else ())
    args = (q, k, v) + ((segment_ids,) if segment_ids is not None else ())
    return jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=spec,
                         check_vma=False)(*args)


__all__ = ["pallas_causal_attention", "sharded_pallas_causal_attention"]
