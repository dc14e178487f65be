"""The engine's weights and KV cache between requests: loading new weights (in memory or from a
safetensors directory, checked against the served model's shape), flushing the prefix cache,
and releasing / reallocating the KV cache (so a learner update on the same devices can use the
memory). A mixin of :class:`~agentrl_jax.rollout.engine.engine.Engine`; every call runs on the
engine thread (``_call_in_engine``) between decode steps."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import jax

from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.weights import LoadCancelled
from agentrl_jax.rollout.contract import WeightSource

log = logging.getLogger(__name__)


def _nbytes(tree: Any) -> int:
    return sum(int(x.nbytes) for x in jax.tree.leaves(tree))


class WeightsAndCache:
    """Weight updates and KV-cache memory; ``self`` is an ``Engine``."""

    def update_weights_sync(self, params: Any = None, *, path: str | None = None,
                            version: str | None = None, flush_cache: bool = True,
                            abort_all: bool = False, cancel: threading.Event | None = None
                            ) -> str:
        """Swap the weights between two engine steps (blocking). ``params``: a CausalLM,
        nnx.State or pure dict -- used without a copy unless ``weights_dtype`` asks for a cast;
        ``path``: a HF safetensors directory, whose config must match the served model's before
        anything is built (``load_checkpoint``); ``cancel`` stops that load between tensors.
        Running requests continue with the new weights (their earlier KV was computed with the
        old ones) unless ``abort_all``. Returns the new weight version."""
        if (params is None) == (path is None):
            raise ValueError("pass exactly one of params or path")
        if path is not None:
            params = self.load_checkpoint(path, cancel)
        state = self._prepare_state(params)
        if cancel is not None and cancel.is_set():  # nobody wants these weights any more
            raise LoadCancelled("loading was cancelled")
        if abort_all:
            self.abort_all()

        def swap() -> str:
            self._state = state
            # the old merged weights go before the new ones are built (between engine steps:
            # no decode call is using them), so a sync holds one merged copy, not two
            if self._merged is not None:
                for x in jax.tree.leaves(self._merged):
                    x.delete()
                self._merged = self._merge_fn(state)
            if flush_cache:
                self._slots.flush()
            self.stats.weight_updates += 1
            self.weight_version = str(version) if version is not None else str(
                int(self.weight_version) + 1 if self.weight_version.isdigit() else 1)
            return self.weight_version

        return self._call_in_engine(swap).result()

    def load_checkpoint(self, path: str, cancel: threading.Event | None = None) -> Any:
        """The model of the safetensors directory ``path``, refused (``ValueError``) unless its
        config has this engine's architecture, checked before anything is built or read."""
        from agentrl_jax.models.safetensors_io import load_safetensors_model

        model, _ = load_safetensors_model(path, check_config=self._check_compatible,
                                          cancel=cancel)
        return model

    def _check_compatible(self, cfg: ModelConfig) -> None:
        mine = self.model_config
        keys = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                "num_kv_heads", "head_dim", "tie_word_embeddings", "attention_bias", "qk_norm")
        diff = {k: (getattr(mine, k), getattr(cfg, k)) for k in keys
                if getattr(mine, k) != getattr(cfg, k)}
        if diff:
            raise ValueError("checkpoint architecture differs from the served model: "
                             + ", ".join(f"{k}: {a} != {b}" for k, (a, b) in diff.items()))

    async def sync_weights(self, weights: WeightSource, version: int) -> None:
        """The learner's arrays themselves (this engine runs in the trainer's process: no
        export, no copy unless ``weights`` makes one)."""
        await self.update_weights(weights.arrays(), version=str(version))

    async def update_weights(self, params: Any = None, *, path: str | None = None,
                             version: str | None = None, flush_cache: bool = True,
                             abort_all: bool = False, cancel: threading.Event | None = None
                             ) -> str:
        return await asyncio.to_thread(self.update_weights_sync, params, path=path,
                                       version=version, flush_cache=flush_cache,
                                       abort_all=abort_all, cancel=cancel)

    def flush_cache_sync(self) -> int:
        """Drop every cached session prefix; returns how many slots were freed."""
        return self._call_in_engine(self._slots.flush).result()

    def release_kv_cache_sync(self) -> int:
        """Free the KV cache (``[max_batch, max_length]`` rows of every layer) while the
        engine is idle; cached prefixes are dropped and the next request allocates a zero
        cache again (``stats.kv_allocations``). Returns the bytes freed (0 when already
        released). Raises ``RuntimeError`` while a request is queued or running."""

        def release() -> int:
            if self._slot_seq or self._waiting or self._prefill_queue or self._fork_ready:
                raise RuntimeError("cannot release the KV cache while requests are running "
                                   f"({len(self._slot_seq)} running, {len(self._waiting)} "
                                   "waiting)")
            if self._cache is None:
                return 0
            freed = _nbytes(self._cache) + _nbytes(self._merged)
            self._slots.flush()
            for x in jax.tree.leaves((self._cache, self._merged)):
                x.delete()
            self._cache = self._merged = None
            self.stats.kv_releases += 1
            return freed

        return self._call_in_engine(release).result()

    async def release_kv_cache(self) -> int:
        return await asyncio.to_thread(self.release_kv_cache_sync)

    def resume_kv_cache_sync(self) -> int:
        """Allocate a released KV cache now (else the next request does); returns its bytes
        (0 when it was not released)."""

        return self._call_in_engine(self._reallocate_cache).result()

    def _reallocate_cache(self) -> int:
        """(Engine thread.) A zero KV cache in place of a released one; returns its bytes."""
        if self._cache is not None:
            return 0
        self._cache = self._new_cache()
        if self._merged is None:
            self._merged = self._merge_fn(self._state)
        self.stats.kv_allocations += 1
        return _nbytes(self._cache) + _nbytes(self._merged)

    async def resume_kv_cache(self) -> int:
        return await asyncio.to_thread(self.resume_kv_cache_sync)

    async def flush_cache(self) -> int:
        return await asyncio.to_thread(self.flush_cache_sync)

    async def health(self) -> bool:
        return not self._closed and self._error is None and self._thread.is_alive()


__all__ = ["WeightsAndCache"]
