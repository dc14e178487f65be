"""Attention kernels split over the activation mesh.

On a multi-device mesh (:func:`agentrl_jax.sharding.activations.activation_mesh`, as the
learner traces its steps) :func:`sharded_pallas_causal_attention` runs a packed-row attention
kernel (``kernels/flash_attention.py``: JAX's Pallas flash attention with segment ids, or
``kernels/segment_attention.py``) inside ``jax.shard_map``: each device attends over its own
rows (and, on a ``tensor`` axis, its own heads). A ``pallas_call`` is opaque to XLA's SPMD
partitioner, which otherwise gathers ``q``, ``k``, ``v`` and the segment ids onto every device
and runs the whole micro-batch's attention, forward and backward, on each of them.
"""

from __future__ import annotations

from typing import Callable

import jax
from jax.sharding import PartitionSpec as P

from agentrl_jax.kernels.flash_attention import pallas_causal_attention
from agentrl_jax.sharding.activations import attention_spec, current_mesh


def sharded_pallas_causal_attention(q: jax.Array, k: jax.Array, v: jax.Array,
                                    segment_ids: jax.Array | None = None,
                                    interpret: bool = False,
                                    kernel: Callable[..., jax.Array] | None = None
                                    ) -> jax.Array:
    """:func:`pallas_causal_attention` (or ``kernel``, a function of the same signature, e.g.
    ``kernels.segment_attention.segment_causal_attention``) split over the current activation mesh.

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


__all__ = ["sharded_pallas_causal_attention"]
