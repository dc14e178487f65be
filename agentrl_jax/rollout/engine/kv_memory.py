"""The engine's KV cache on the device: allocated in its sharding, released while the engine is
idle (so a learner update on the same devices can use the memory) and allocated again.

:class:`KVCacheMemory` owns ``cache``: every layer's keys and values, ``[max_batch, K,
max_length, Dh]`` (head-major) or ``[max_batch, max_length, K, Dh]``, or ``None`` while
released. The device calls donate it and return the next one, which the scheduler stores back
(``kv.cache = prefill(..., kv.cache, ...)``); only the engine thread touches it after start-up.

Before the first allocation the cache's bytes per device are checked against what the device's
allocator still has for this process (``memory_stats``: ``bytes_limit - bytes_in_use``, where
the platform reports them): a cache that cannot fit is a :class:`KVCacheDoesNotFit` naming the
sizes and the remedies, not an out-of-memory error from inside XLA minutes later.
"""

from __future__ import annotations

import math
import os
from typing import Any, Sequence

import jax

from agentrl_jax.models.config import ModelConfig
from agentrl_jax.rollout.engine.engine_config import EngineConfig
from agentrl_jax.rollout.engine.forward import new_cache
from agentrl_jax.rollout.engine.weights import nbytes


class KVCacheDoesNotFit(MemoryError):
    """The engine's KV cache is larger than the memory its device has left for this process."""


def kv_bytes_per_device(config: EngineConfig, model_config: ModelConfig, sharding: Any) -> int:
    """Bytes of the KV cache on each device of ``sharding``: every leaf's shard (``[max_batch,
    K / tensor_parallel, max_length, Dh]`` or its sequence-major twin when split over the KV
    heads), ``2 x layers`` leaves, from the cache's abstract shapes (nothing allocated)."""
    shapes = jax.eval_shape(lambda: new_cache(config.kv_layout, model_config, config.max_batch,
                                              config.max_length))
    leaves = jax.tree.leaves(shapes)
    shardings = ([sharding] * len(leaves) if isinstance(sharding, jax.sharding.Sharding)
                 else jax.tree.leaves(sharding))
    return sum(math.prod(s.shard_shape(x.shape)) * x.dtype.itemsize
               for x, s in zip(leaves, shardings))


def free_device_bytes(devices: Sequence[Any]) -> tuple[int, int] | None:
    """``(free, limit)`` of the device with the least free memory among ``devices``:
    ``bytes_limit - bytes_in_use`` and ``bytes_limit`` of ``memory_stats()``; ``None`` where a
    device reports no limit (the CPU backend)."""
    best = None
    for device in devices:
        try:
            stats = device.memory_stats()
        except Exception:  # noqa: BLE001 - a backend without memory statistics
            return None
        if not stats or "bytes_limit" not in stats:
            return None
        limit = int(stats["bytes_limit"])
        free = limit - int(stats.get("bytes_in_use", 0))
        if best is None or free < best[0]:
            best = (free, limit)
    return best


def check_kv_fits(kv_bytes: int, free: tuple[int, int] | None, config: EngineConfig,
                  device: str) -> None:
    """Raise :class:`KVCacheDoesNotFit` when ``kv_bytes`` (per device) exceed ``free``'s
    free bytes (``(free, limit)`` from :func:`free_device_bytes`; ``None``: not checked)."""
    if free is None or kv_bytes <= free[0]:
        return
    gib = 2.0 ** 30
    fraction = os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "unset")
    raise KVCacheDoesNotFit(
        f"the engine's KV cache needs {kv_bytes / gib:.1f} GiB on {device} ({config.max_batch} "
        f"slots x {config.max_length} tokens), but this process has "
        f"{free[0] / gib:.1f} GiB of its {free[1] / gib:.1f} GiB left "
        f"(XLA_PYTHON_CLIENT_MEM_FRACTION={fraction}): use fewer decode slots or a shorter "
        "context (a run's rollout.max_batch / rollout.max_concurrency and rollout.max_context; "
        "the inference server's --max-batch and --max-length), or give the process more of "
        "the device (fewer jobs on it, e.g. benchmarks/gpu/jobs.sh --per-gpu)")


class KVCacheMemory:
    """The KV cache of one engine. Owns ``cache`` (a ``forward`` cache or ``None`` when
    released)."""

    def __init__(self, config: EngineConfig, model_config: ModelConfig, sharding: Any):
        self._config = config
        self._model_config = model_config
        self._sharding = sharding
        devices = sorted(sharding.device_set, key=lambda d: d.id)
        check_kv_fits(kv_bytes_per_device(config, model_config, sharding),
                      free_device_bytes(devices), config, str(devices[0]))
        self.cache: Any = self.new()

    @property
    def released(self) -> bool:
        return self.cache is None

    def new(self) -> Any:
        """A zero KV cache, allocated directly in its sharding on the engine's devices."""
        c, m = self._config, self._model_config
        return jax.jit(lambda: new_cache(c.kv_layout, m, c.max_batch, c.max_length),
                       out_shardings=self._sharding)()

    def release(self) -> int:
        """Delete the cache; returns its bytes (0 when already released)."""
        if self.cache is None:
            return 0
        freed = nbytes(self.cache)
        for x in jax.tree.leaves(self.cache):
            x.delete()
        self.cache = None
        return freed

    def allocate(self) -> int:
        """A zero cache in place of a released one; returns its bytes (0 when not released)."""
        if self.cache is not None:
            return 0
        self.cache = self.new()
        return nbytes(self.cache)

    def reset(self) -> None:
        """A fresh zero cache whatever the old one holds (after a failed device call, whose
        donated input may be gone). Raises what the allocation raises."""
        self.cache = self.new()


__all__ = ["KVCacheDoesNotFit", "KVCacheMemory", "check_kv_fits", "free_device_bytes",
           "kv_bytes_per_device"]
