"""Activation sharding constraints inside the model, switched on by the caller's mesh.

The model code does not know the mesh; a jitted learner function traces it inside
``with activation_mesh(mesh):`` and layers that need a definite activation layout read it
from here. Today that is attention: the cuDNN fused-attention kernel's SPMD partitioner
requires query, key and value to carry the *same* sharding, which XLA's propagation does
not guarantee under FSDP (q/k/v come from differently shaped projection weights). We pin
``q [B, T, H, Dh]``, ``k``/``v [B, T, K, Dh]`` to ``P(("data", "fsdp"), None, heads, None)``
with ``heads = "tensor"`` when the tensor axis divides both head counts (Megatron layout:
each tensor shard keeps whole GQA groups), else replicated.

The residual stream ``[B, T, D]`` is pinned batch-sharded, ``P(("data", "fsdp"), None, None)``,
at every layer boundary, and the MLP's ``[B, T, F]`` intermediate to ``P(batch, None,
"tensor")``. Without these, XLA's propagation on an FSDP mesh can keep the weights sharded and
split the *contraction* instead (measured on a 2-layer model, fsdp=2: all-reduces of
``[4, 256, 8960]`` f32 activations per matmul rather than all-gathers of the weights).

Outside an ``activation_mesh`` block (the rollout engine, single-device use) nothing changes.
Tracing is synchronous, so a context variable set around the traced body is seen by every
layer it calls.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from agentrl_jax.sharding.rules import BATCH_AXES

_MESH: contextvars.ContextVar[Mesh | None] = contextvars.ContextVar("activation_mesh", default=None)


@contextlib.contextmanager
def activation_mesh(mesh: Mesh | None) -> Iterator[None]:
    """Trace the body with activation constraints for ``mesh`` (``None``: none)."""
    token = _MESH.set(mesh)
    try:
        yield
    finally:
        _MESH.reset(token)


def current_mesh() -> Mesh | None:
    return _MESH.get()


def attention_spec(mesh: Mesh, batch: int, num_heads: int, num_kv_heads: int) -> P | None:
    """``P(batch_axes, None, heads, None)`` for ``[B, T, H, Dh]`` attention inputs, or ``None``
    where the batch does not divide over the batch axes (then nothing is constrained)."""
    batch_axes = _batch_axes(mesh, batch)
    if batch_axes is None:
        return None
    tp = mesh.shape.get("tensor", 1)
    heads = "tensor" if tp > 1 and num_heads % tp == 0 and num_kv_heads % tp == 0 else None
    return P(batch_axes or None, None, heads, None)


def constrain_attention_inputs(q: jax.Array, k: jax.Array, v: jax.Array
                               ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Give ``q [B, T, H, Dh]``, ``k``, ``v [B, T, K, Dh]`` one common layout under the
    current :func:`activation_mesh` (identity without one, or on a 1-device mesh)."""
    mesh = current_mesh()
    if mesh is None or mesh.size == 1:
        return q, k, v
    spec = attention_spec(mesh, q.shape[0], q.shape[2], k.shape[2])
    if spec is None:
        return q, k, v
    sharding = NamedSharding(mesh, spec)
    return tuple(jax.lax.with_sharding_constraint(x, sharding) for x in (q, k, v))


def _batch_axes(mesh: Mesh, batch: int) -> tuple[str, ...] | None:
    """Mesh axes over which the batch dimension is split, or ``None`` if they don't divide it."""
    axes = tuple(a for a in BATCH_AXES if a in mesh.shape and mesh.shape[a] > 1)
    size = 1
    for a in axes:
        size *= mesh.shape[a]
    return None if batch % size else axes


def constrain_batch_sharded(x: jax.Array, tensor_last: bool = False) -> jax.Array:
    """Pin an activation ``x [B, ..., C]`` to ``P(batch_axes, None, ..., last)`` under the
    current :func:`activation_mesh`: ``last = "tensor"`` if ``tensor_last`` and the tensor axis
    divides ``C``, else ``None``. Identity without a mesh, on one device, or when the batch
    does not divide over the batch axes."""
    mesh = current_mesh()
    if mesh is None or mesh.size == 1:
        return x
    axes = _batch_axes(mesh, x.shape[0])
    if axes is None:
        return x
    tp = mesh.shape.get("tensor", 1)
    last = "tensor" if tensor_last and tp > 1 and x.shape[-1] % tp == 0 else None
    spec = P(axes or None, *([None] * (x.ndim - 2)), last)
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


__all__ = ["activation_mesh", "current_mesh", "attention_spec", "constrain_attention_inputs",
           "constrain_batch_sharded"]
