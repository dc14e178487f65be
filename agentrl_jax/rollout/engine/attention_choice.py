"""Which attention kernels an engine compiles, from its config, its devices and the model shape.

Pure functions of their arguments (no engine needed); ``Engine.__init__`` calls both. The names
they return are ``forward.py``'s: the Pallas kernels on a GPU, the same kernels in the Pallas
interpreter elsewhere (tests), or ``dense`` (XLA einsums) where a kernel cannot run.
"""

from __future__ import annotations

import logging

from agentrl_jax.models.config import ModelConfig
from agentrl_jax.kernels.decode_attention import ragged_tiling
from agentrl_jax.rollout.engine.engine_config import EngineConfig
from agentrl_jax.rollout.engine.forward import (DENSE, FLASH, FLASH_IN_CACHE,
                                                FLASH_IN_CACHE_INTERPRET, FLASH_INTERPRET, FUSED,
                                                FUSED_INTERPRET, HEAD_MAJOR, RAGGED,
                                                RAGGED_INTERPRET)
from agentrl_jax.kernels.fused_decode_attention import unsupported_shape
from agentrl_jax.kernels.prefill_attention import BLOCK_Q, unsupported_prefill_shape

log = logging.getLogger(__name__)


def _kernel_blocker(config: EngineConfig, tensor_parallel: int) -> str | None:
    """Why no Pallas attention kernel can run for this engine (None: they can). The kernels
    need the head-major cache and one device (they are not partitioned over a tensor-parallel
    group)."""
    if config.kv_layout != HEAD_MAJOR:
        return "the seq-major cache layout"
    if tensor_parallel > 1:
        return "tensor parallelism"
    return None


def resolve_decode_attention(config: EngineConfig, model: ModelConfig, platform: str,
                             tensor_parallel: int) -> str:
    """The decode attention to compile: ``ragged_fused`` / ``ragged`` (the Pallas kernels; their
    ``*_interpret`` forms off GPUs) or ``dense``. Besides ``_kernel_blocker``'s conditions the
    kernels need a ``max_length`` divisible by 16; the fused kernel also needs at most 16 query
    heads per KV head and a head dim divisible by 32 (otherwise ragged). An explicitly chosen
    kernel that cannot run is logged as a warning and replaced by dense; so is a GPU's default
    kernel that ``max_length`` alone rules out."""
    choice = config.resolved_decode_attention(platform)
    if choice not in (RAGGED, FUSED):
        return DENSE
    why = _kernel_blocker(config, tensor_parallel)
    length_blocks = why is None and ragged_tiling(config.max_length) is None
    if length_blocks:
        fits = -(-config.max_length // 16) * 16
        why = f"max_length={config.max_length} (not a multiple of 16; e.g. {fits} is)"
    if why is not None:
        # an explicit kernel, or a GPU's default one lost to the length alone (dense decode is
        # much slower there, and the fix is the caller's): said; other blockers are choices
        if config.decode_attention in (RAGGED, FUSED) or (length_blocks and platform == "gpu"):
            log.warning("%s decode attention is not available with %s; using dense", choice, why)
        return DENSE
    if choice == FUSED and unsupported_shape(model.num_heads, model.num_kv_heads, model.head_dim):
        choice = RAGGED
    if choice == FUSED:
        return FUSED if platform == "gpu" else FUSED_INTERPRET
    return RAGGED if platform == "gpu" else RAGGED_INTERPRET


def resolve_prefill_attention(config: EngineConfig, model: ModelConfig, platform: str,
                              tensor_parallel: int) -> str:
    """The prefill attention to compile: ``flash_in_cache`` / ``flash`` (the Pallas kernel
    reading the rows in place / on a gathered copy; their ``*_interpret`` forms off GPUs) or
    ``dense``. ``flash_in_cache`` falls back to ``flash`` when ``unsupported_prefill_shape``
    rejects the packed rows (``max_length`` / head dim); both fall back to dense under
    ``_kernel_blocker``'s conditions, with a warning when the kernel was chosen explicitly."""
    choice = config.resolved_prefill_attention(platform)
    if choice not in (FLASH, FLASH_IN_CACHE):
        return DENSE
    why = _kernel_blocker(config, tensor_parallel)
    if why is not None:
        if config.prefill_attention in (FLASH, FLASH_IN_CACHE):
            log.warning("%s prefill attention is not available with %s; using dense",
                        config.prefill_attention, why)
        return DENSE
    packed_why = unsupported_prefill_shape(BLOCK_Q, config.max_length, model.head_dim)
    if choice == FLASH_IN_CACHE and packed_why is not None:
        log.warning("flash_in_cache prefill attention is not available (%s); using flash "
                    "on gathered rows", packed_why)
        choice = FLASH
    if choice == FLASH_IN_CACHE:
        return FLASH_IN_CACHE if platform == "gpu" else FLASH_IN_CACHE_INTERPRET
    return FLASH if platform == "gpu" else FLASH_INTERPRET
