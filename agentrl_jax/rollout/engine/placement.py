"""Where an embedded engine lives: its devices, and the shardings of its weights and KV cache.

An engine runs on one device or, tensor-parallel, on a group of devices: a mesh
``(data=1, fsdp=1, tensor=N)`` over which the weights follow the learner's partition rules
(``agentrl_jax.sharding.rules``: column-parallel q/k/v and MLP in-projections, row-parallel
out-projections) and the KV cache is split over its KV heads. A dimension that ``N`` does not
divide is replicated (e.g. 3 KV heads over 2 devices), so any group works for any model.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from agentrl_jax.rollout.engine.forward import HEAD_MAJOR
from agentrl_jax.sharding.rules import state_shardings


class EnginePlacement:
    """An engine's device group (``devices``; default: this process's first local device)."""

    def __init__(self, devices: Sequence[Any] | None = None):
        devices = list(devices) if devices else [jax.local_devices()[0]]
        if len({d.platform for d in devices}) != 1:
            raise ValueError("an engine's devices must share one platform")
        self.devices = devices
        self.mesh = Mesh(np.array(devices, dtype=object).reshape(1, 1, len(devices)),
                         ("data", "fsdp", "tensor"))

    @property
    def tensor_parallel(self) -> int:
        return len(self.devices)

    @property
    def platform(self) -> str:
        return self.devices[0].platform

    def state_shardings(self, abstract_state: nnx.State) -> nnx.State:
        """A ``NamedSharding`` per parameter (replicated on one device)."""
        return state_shardings(abstract_state, self.mesh)

    def cache_sharding(self, num_kv_heads: int, layout: str) -> NamedSharding:
        """KV cache ``[B, K, S, Dh]`` (head-major) or ``[B, S, K, Dh]``: split over the KV heads
        when the group divides them, else replicated."""
        axis = "tensor" if num_kv_heads % self.tensor_parallel == 0 else None
        spec = P(None, axis, None, None) if layout == HEAD_MAJOR else P(None, None, axis, None)
        return NamedSharding(self.mesh, spec)

    def __repr__(self) -> str:
        return f"EnginePlacement({[str(d) for d in self.devices]})"


def to_state(params: Any, abstract_state: nnx.State) -> nnx.State:
    """An nnx State of the engine's parameter structure from a model / State / pure dict."""
    from agentrl_jax.models.pretrained import Pretrained

    if isinstance(params, Pretrained):
        params = params.model
    if isinstance(params, nnx.Module):
        state = nnx.state(params, nnx.Param)
    elif isinstance(params, nnx.State):
        state = params
    elif isinstance(params, dict):
        state = jax.tree.map(lambda x: x, abstract_state)
        nnx.replace_by_pure_dict(state, params)
    else:
        raise TypeError(f"cannot load weights from a {type(params).__name__}: pass a CausalLM, "
                        "an nnx.State or a pure dict of its parameters")
    if jax.tree.structure(state) != jax.tree.structure(abstract_state):
        raise ValueError("the given parameters do not have this engine's model structure")
    for (path, want), got in zip(jax.tree_util.tree_leaves_with_path(abstract_state),
                                 jax.tree.leaves(state)):
        if tuple(want.shape) != tuple(got.shape):
            raise ValueError(f"parameter {jax.tree_util.keystr(path)} has shape {got.shape}, "
                             f"the engine's model needs {want.shape}")
    return state



def device_groups(devices: Sequence[Any], tensor_parallel: int = 1) -> list[list[Any]]:
    """Consecutive groups of ``tensor_parallel`` devices (one engine replica each); devices
    left over are unused (with a ValueError when there is not even one group)."""
    if tensor_parallel < 1:
        raise ValueError(f"tensor_parallel must be >= 1, got {tensor_parallel}")
    devices = list(devices)
    n = len(devices) // tensor_parallel
    if n == 0:
        raise ValueError(f"tensor_parallel={tensor_parallel} needs at least that many devices, "
                         f"{len(devices)} given")
    return [devices[i * tensor_parallel:(i + 1) * tensor_parallel] for i in range(n)]


__all__ = ["EnginePlacement", "to_state", "device_groups"]
