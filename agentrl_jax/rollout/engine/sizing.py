"""How big an embedded engine may be on a platform: decode slots that fit the host's RAM on the
CPU backend, and the prefill shapes a CPU should compile. Used by the trainer's services and
by the standalone inference server, so both size an engine the same way."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

#: share of the host's RAM the embedded engine's KV cache may take on the CPU backend.
CPU_KV_RAM_FRACTION = 1 / 6


def fit_engine_slots(slots: int, model_config: Any, max_length: int, dtype: str | None = None,
                     host_ram_bytes: int | None = None, backend: str | None = None) -> int:
    """``slots`` decode slots, or fewer on the CPU backend: as many as hold their KV cache
    (``2 x layers x kv_heads x head_dim x max_length`` values of ``dtype``, default the
    model's, per slot) in :data:`CPU_KV_RAM_FRACTION` of ``host_ram_bytes`` (default: this
    machine's RAM), at least one. The trainer's engine (``training.runtime.services.engine_slots``)
    and the standalone inference server (``rollout/servers/server.py``) are sized by it."""
    import jax
    import jax.numpy as jnp

    backend = backend or jax.default_backend()
    if backend != "cpu":
        return slots
    if host_ram_bytes is None:
        import os

        host_ram_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    itemsize = jnp.dtype(dtype or model_config.dtype).itemsize
    per_slot = (2 * model_config.num_layers * model_config.num_kv_heads * model_config.head_dim
                * int(max_length) * itemsize)
    fit = max(1, int(host_ram_bytes * CPU_KV_RAM_FRACTION // per_slot))
    if fit < slots:
        log.warning("rollout engine: %d decode slots instead of %d (KV cache %.1f GB of %.1f GB "
                    "host RAM on CPU); further requests wait for a free slot", fit, slots,
                    fit * per_slot / 1e9, host_ram_bytes / 1e9)
    return min(slots, fit)


#: chunked-prefill buckets of the embedded engine on the CPU backend (one sequence per call)
CPU_PREFILL_CHUNKS = (64, 256)


def engine_prefill(platform: str) -> dict[str, Any]:
    """``EngineConfig`` prefill fields for the engine's device ``platform``.

    A prefill call computes all of its ``rows x chunk`` token positions, each attending over
    the slot's whole ``max_length`` KV row, whatever share of them is real. Accelerators do
    that padding in parallel almost for free: the engine's defaults (up to 4096 positions a
    call, chunks up to 1024) stay. A CPU pays for every position: a multi-turn agent sends
    one sequence with a ~150-token observation at a time, which the defaults ran as a
    ``[4, 256]`` call (four times the positions of a ``[1, 256]`` call, and the CPU time too:
    docs/PERFORMANCE.md). On CPU: one sequence per call (``prefill_tokens`` = the smallest
    chunk) and chunks of :data:`CPU_PREFILL_CHUNKS` (two compiled prefill shapes, not three),
    each attending over the whole row (``prefill_kv_buckets=()``). KV-length buckets
    (``EngineConfig.prefill_kv_buckets``, e.g. ``"512,1024,2048"``) cut a CPU rollout's prefill
    time but compile four times the prefill shapes at start-up, more than a short run gains
    (docs/PERFORMANCE.md, "The README's CPU taste run", session 64): a long CPU run sets
    ``rollout.prefill_kv_buckets`` itself.
    """
    if platform != "cpu":
        return {}
    return {"prefill_chunks": CPU_PREFILL_CHUNKS, "prefill_tokens": min(CPU_PREFILL_CHUNKS),
            "prefill_kv_buckets": ()}


__all__ = ["CPU_KV_RAM_FRACTION", "CPU_PREFILL_CHUNKS", "engine_prefill", "fit_engine_slots"]
