"""Device meshes with ``data``, ``fsdp`` and ``tensor`` axes.

``make_mesh(data=1, fsdp=-1, tensor=1)``: at most one size may be -1, meaning "the devices left".
The same code runs on 1 CPU, ``--xla_force_host_platform_device_count=8``, 8 GPUs or a TPU pod
(``jax.devices()`` spans all hosts after ``jax.distributed.initialize()``).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import jax
import numpy as np
from jax.sharding import Mesh

MESH_AXES = ("data", "fsdp", "tensor")


def resolve_axis_sizes(sizes: Mapping[str, int], num_devices: int) -> dict[str, int]:
    """Replace one -1 by the devices left; check the product equals ``num_devices``."""
    unknown = [a for a in MESH_AXES if sizes.get(a, 1) == -1]
    if len(unknown) > 1:
        raise ValueError(f"at most one mesh axis may be -1, got {unknown}")
    resolved = {a: int(sizes.get(a, 1)) for a in MESH_AXES}
    for axis, size in resolved.items():
        if size == 0 or size < -1:
            raise ValueError(f"mesh axis {axis!r} has invalid size {size}")
    known = int(np.prod([s for s in resolved.values() if s != -1]))
    if unknown:
        if num_devices % known:
            raise ValueError(f"{num_devices} devices cannot be split into mesh {resolved}")
        resolved[unknown[0]] = num_devices // known
    if int(np.prod(list(resolved.values()))) != num_devices:
        raise ValueError(f"mesh {resolved} needs {int(np.prod(list(resolved.values())))} devices, "
                         f"{num_devices} available")
    return resolved


def make_mesh(data: int = 1, fsdp: int = -1, tensor: int = 1,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A ``Mesh`` of shape ``(data, fsdp, tensor)`` over ``devices`` (default: all)."""
    devices = list(devices if devices is not None else jax.devices())
    sizes = resolve_axis_sizes({"data": data, "fsdp": fsdp, "tensor": tensor}, len(devices))
    shape = tuple(sizes[a] for a in MESH_AXES)
    try:
        from jax.experimental import mesh_utils
        grid = mesh_utils.create_device_mesh(shape, devices=devices)
    except Exception:  # odd topologies (virtual CPU devices, subsets): plain reshape
        grid = np.asarray(devices).reshape(shape)
    return Mesh(grid, MESH_AXES)


def mesh_from_config(config: Mapping[str, int] | None) -> Mesh:
    """``make_mesh`` of a mapping of axis sizes such as ``{"data": 1, "fsdp": -1, "tensor": 1}``
    (``LearnerConfig.mesh``, which names all three); an axis it does not name takes
    ``make_mesh``'s default."""
    return make_mesh(**{axis: int(size) for axis, size in dict(config or {}).items()})
