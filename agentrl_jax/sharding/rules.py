"""Regex partition rules for every parameter, and helpers to shard models and batches.

A rule maps a regex over the parameter path (``layers/3/attn/q_proj/kernel``) to a
``PartitionSpec`` over the mesh axes. The first matching rule wins. A dimension that a mesh axis
does not divide is replicated on that axis instead (logged), so any mesh works for any model.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from agentrl_jax.sharding.placement import place_global, place_process_local

log = logging.getLogger(__name__)

Rules = Sequence[tuple[str, P]]

# Megatron-style: column-parallel in-projections, row-parallel out-projections, FSDP on the
# other dimension; norms replicated.
DEFAULT_RULES: Rules = (
    (r"embed/embedding$", P("tensor", "fsdp")),  # [V, D]
    (r"attn/(q|k|v)_proj/kernel$", P("fsdp", "tensor")),  # [D, H*Dh]
    (r"attn/(q|k|v)_proj/bias$", P("tensor")),
    (r"attn/o_proj/kernel$", P("tensor", "fsdp")),  # [H*Dh, D]
    (r"mlp/(gate|up)_proj/kernel$", P("fsdp", "tensor")),  # [D, F]
    (r"mlp/down_proj/kernel$", P("tensor", "fsdp")),  # [F, D]
    (r"lm_head/kernel$", P("fsdp", "tensor")),  # [D, V]
    (r"value_head/kernel$", P("fsdp", None)),  # [D, 1]
    (r".*", P()),  # norms, biases, scalars: replicated
)

BATCH_AXES = ("data", "fsdp")


def path_string(path: Sequence[Any]) -> str:
    return "/".join(str(p) for p in path)


def key_path_names(path: Sequence[Any]) -> list[Any]:
    """Plain names of a JAX key path, without the trailing ``value`` of nnx Variables."""
    names = []
    for key in path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                names.append(getattr(key, attr))
                break
        else:
            names.append(key)
    if names and names[-1] == "value":
        names.pop()
    return names


def partition_spec(path: Sequence[Any], shape: Sequence[int], mesh: Mesh,
                   rules: Rules = DEFAULT_RULES) -> P:
    """The spec of the first rule matching ``path``, with non-dividing axes dropped."""
    name = path_string(path)
    for pattern, spec in rules:
        if re.search(pattern, name):
            break
    else:
        return P()
    fitted = []
    for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        if axes is None:
            fitted.append(None)
            continue
        names = axes if isinstance(axes, tuple) else (axes,)
        size = 1
        for axis in names:
            size *= mesh.shape[axis]
        if dim % size:
            log.info("%s: dim %d not divisible by mesh axes %s (%d); replicated", name, dim, names,
                     size)
            fitted.append(None)
        else:
            fitted.append(axes)
    return P(*fitted)


def sharding_fn(mesh: Mesh, rules: Rules = DEFAULT_RULES):
    """A ``(path, shape) -> NamedSharding`` function for checkpoint loaders."""
    def fn(path, shape):
        return NamedSharding(mesh, partition_spec(path, shape, mesh, rules))
    return fn


def state_shardings(state: nnx.State, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> nnx.State:
    """A State of ``NamedSharding`` with the structure of ``state`` (params or optimizer state)."""
    def leaf_sharding(path, leaf):
        shape = getattr(leaf, "shape", ())
        return NamedSharding(mesh, partition_spec(key_path_names(path), shape, mesh, rules))
    return jax.tree_util.tree_map_with_path(leaf_sharding, state)


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """Batch arrays ``[B, ...]`` split over ``data`` x ``fsdp`` on the leading axis."""
    return NamedSharding(mesh, P(BATCH_AXES, *([None] * (ndim - 1))))


def shard_batch(batch: Any, mesh: Mesh, process_local: bool = False) -> Any:
    """Place every array of a pytree with its leading axis over ``data`` x ``fsdp``.

    Host arrays ``[B, ...]``: the same global batch on every process (default), or, with
    ``process_local``, this process's ``[B / num_processes, ...]`` rows (see
    ``agentrl_jax.sharding.placement``). ``jax.Array`` leaves are resharded as they are.
    """
    def place(x):
        if isinstance(x, jax.Array):
            return jax.device_put(x, batch_sharding(mesh, max(x.ndim, 1)))
        x = np.asarray(x)
        sharding = batch_sharding(mesh, max(x.ndim, 1))
        return place_process_local(x, sharding) if process_local else place_global(x, sharding)
    return jax.tree.map(place, batch)


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())
