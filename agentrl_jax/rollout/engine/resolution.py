"""The one resolution of an engine's ``"auto"`` and platform-dependent settings.

``resolve_engine_config(config, platform, tensor_parallel, model_config)`` turns an
``EngineConfig`` as a user gave it (a run's ``rollout`` section, a server's command line, a
test's keywords) into the config the engine runs: every ``"auto"`` replaced by the platform's
value and the slots fitted to the host. ``Engine.__init__`` calls it once, where the config
enters the engine; nothing else decides these values. The rules, per setting:

=====================  =======================================  =============================
setting                an accelerator (``gpu``, ``tpu``)        ``cpu``
=====================  =======================================  =============================
prefill_chunks         ``ACCELERATOR_PREFILL_CHUNKS``           ``sizing.CPU_PREFILL_CHUNKS``
prefill_tokens         ``ACCELERATOR_PREFILL_TOKENS``           the smallest CPU chunk (one
                                                                sequence per call)
prefill_kv_buckets     powers of two from 512 below max_length  ``()``: the whole row
decode_attention       ragged_fused on GPU, else dense; with     dense
                       ``model_config``: the kernel that can
                       run (``attention_choice.py``)
prefill_attention      flash_in_cache on GPU, else dense (idem; dense
                       flash_in_cache reads rows in place:
                       KV buckets ``()``, chunks ``(BLOCK_Q,)``)
decode_gemm            merged_cublas for one GPU, head-major    xla
max_batch              as given                                 at most the slots whose KV
                                                                cache fits a sixth of RAM
dtype                  the model's when not given (``model_config``)
=====================  =======================================  =============================

An explicit value is kept, but for an attention kernel that cannot run on the devices (it
falls back, with a warning: ``attention_choice.py``). Resolving a resolved config changes
nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from agentrl_jax.rollout.engine.engine_config import (ACCELERATOR_PREFILL_CHUNKS,
                                                      ACCELERATOR_PREFILL_TOKENS, AUTO,
                                                      EngineConfig)
from agentrl_jax.kernels.prefill_attention import BLOCK_Q
from agentrl_jax.rollout.engine.attention_choice import (resolve_decode_attention,
                                                         resolve_prefill_attention)
from agentrl_jax.rollout.engine.forward import FLASH_IN_CACHE
from agentrl_jax.rollout.engine.sizing import engine_prefill, fit_engine_slots

#: the suffix of a Pallas kernel run in the interpreter (off GPUs; ``forward.py``'s names)
INTERPRET = "_interpret"


def _config_name(kernel: str) -> str:
    """The config's name of a kernel ``attention_choice`` chose (``flash_interpret`` ->
    ``flash``: the interpreter is how the same kernel runs off a GPU)."""
    return kernel[:-len(INTERPRET)] if kernel.endswith(INTERPRET) else kernel


def resolve_engine_config(config: EngineConfig, platform: str, tensor_parallel: int = 1,
                          model_config: Any = None,
                          host_ram_bytes: int | None = None) -> EngineConfig:
    """``config`` with no ``"auto"`` left, for an engine on ``tensor_parallel`` devices of
    ``platform`` (``"cpu"``, ``"gpu"``, ``"tpu"``) serving a model of ``model_config``
    (``models.config.ModelConfig``; None: ``dtype`` and the CPU slot cap stay as given).
    ``host_ram_bytes``: the RAM the CPU slot cap reads (default: this machine's)."""
    cpu = engine_prefill(platform)  # {} on an accelerator
    changes: dict[str, Any] = {}
    if config.prefill_chunks == AUTO:
        changes["prefill_chunks"] = cpu.get("prefill_chunks", ACCELERATOR_PREFILL_CHUNKS)
    if config.prefill_tokens == AUTO:
        changes["prefill_tokens"] = cpu.get("prefill_tokens", ACCELERATOR_PREFILL_TOKENS)
    elif isinstance(config.prefill_tokens, str):  # "16384" as a run's command line gives it
        changes["prefill_tokens"] = int(config.prefill_tokens)
    if config.prefill_kv_buckets == AUTO:
        changes["prefill_kv_buckets"] = cpu.get("prefill_kv_buckets",
                                                config.accelerator_kv_buckets())
    changes["decode_gemm"] = config.resolved_decode_gemm(platform, tensor_parallel)
    if model_config is None:
        changes["decode_attention"] = config.resolved_decode_attention(platform)
        changes["prefill_attention"] = config.resolved_prefill_attention(platform)
    else:  # what will really run on these devices (a kernel that cannot: dense, logged once)
        changes["decode_attention"] = _config_name(resolve_decode_attention(
            config, model_config, platform, tensor_parallel))
        changes["prefill_attention"] = _config_name(resolve_prefill_attention(
            config, model_config, platform, tensor_parallel))
    if changes["prefill_attention"] == FLASH_IN_CACHE:
        # rows read where they are in the cache: one KV length (the whole row), packed calls
        # of BLOCK_Q-token rows (several per sequence; scheduler.py, prefill_plan.py)
        changes.update(prefill_kv_buckets=(), prefill_chunks=(BLOCK_Q,))
    if model_config is not None:
        dtype = config.dtype or model_config.dtype
        changes["dtype"] = dtype
        changes["max_batch"] = fit_engine_slots(config.max_batch, model_config,
                                                config.max_length, dtype, host_ram_bytes,
                                                backend=platform)
    return dataclasses.replace(config, **changes)


__all__ = ["resolve_engine_config"]
