"""The engine's KV cache on the device: allocated in its sharding, released while the engine is
idle (so a learner update on the same devices can use the memory) and allocated again.

:class:`KVCacheMemory` owns ``cache``: every layer's keys and values, ``[max_batch, K,
max_length, Dh]`` (head-major) or ``[max_batch, max_length, K, Dh]``, or ``None`` while
released. The device calls donate it and return the next one, which the scheduler stores back
(``kv.cache = prefill(..., kv.cache, ...)``); only the engine thread touches it after start-up.
"""

from __future__ import annotations

from typing import Any

import jax

from agentrl_jax.models.config import ModelConfig
from agentrl_jax.rollout.engine.engine_config import EngineConfig
from agentrl_jax.rollout.engine.forward import new_cache
from agentrl_jax.rollout.engine.weights import nbytes


class KVCacheMemory:
    """The KV cache of one engine. Owns ``cache`` (a ``forward`` cache or ``None`` when
    released)."""

    def __init__(self, config: EngineConfig, model_config: ModelConfig, sharding: Any):
        self._config = config
        self._model_config = model_config
        self._sharding = sharding
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


__all__ = ["KVCacheMemory"]
