"""The embedded engine's static configuration (shapes and scheduling knobs)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from agentrl_jax.rollout.engine.forward import (DECODE_GEMM, HEAD_MAJOR, MERGED_CUBLAS, SEQ_MAJOR,
                                         XLA_GEMM)

DECODE_ATTENTION = ("auto", "ragged_fused", "ragged", "dense")
PREFILL_ATTENTION = ("auto", "flash", "flash_in_cache", "dense")
#: the smallest default prefill KV bucket (``EngineConfig.prefill_kv_buckets``)
MIN_PREFILL_KV = 512


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Static engine shape and scheduling knobs.

    max_batch: number of slots (sequences decoded together). max_length: KV-cache length per
    slot (prompt + generated tokens must fit). dtype: compute / KV-cache dtype override
    (``"bfloat16"`` or ``"float32"``; default: the model config's). weights_dtype: cast the
    parameters (a copy) to this dtype, e.g. ``"bfloat16"`` when the learner keeps f32 weights.
    prefill_chunks: chunk-size buckets of chunked prefill; prefill_tokens: tokens per prefill
    call (rows = prefill_tokens // chunk); prefill_calls_per_step: prefill calls run before
    each decode call while prompts wait (new requests join the running batch quickly, and a
    flood of long prompts cannot stall decoding). decode_steps: decode steps per jitted call.
    max_stop_ids: stop token ids per request. max_queue: waiting requests beyond which
    ``generate`` raises ``OverloadedError``. copy_rows: KV rows copied per call for ``n > 1``.
    session_cache: keep finished sessions' KV rows for prefix reuse. kv_layout: ``"bksd"``
    (default) keeps the cache head-major ``[B, K, S, Dh]`` and runs ``rollout.forward`` (no
    per-step cache transposes); ``"bskd"`` uses ``CausalLM``'s own cache layout and forward.
    decode_attention: the decode step's attention over the head-major cache: ``"ragged"``
    reads only each slot's valid KV (a Pallas flash-decoding kernel on GPU,
    ``decode_attention.py``), ``"ragged_fused"`` the same attention in one Pallas kernel that
    also applies RoPE and writes the step's keys / values into the cache
    (``fused_decode_attention.py``: no per-layer scatters or RoPE fusions), ``"dense"``
    reads every slot's whole ``max_length`` row (XLA), ``"auto"``: ragged_fused on a GPU,
    dense elsewhere. decode_gemm: the decode step's GEMMs
    (``forward.DECODE_GEMM``): ``"xla"`` the model's separate projections, ``"merged"`` q/k/v
    and gate/up as one GEMM each on concatenated weights (built once per weight version and
    kept beside the weights: + the q/k/v and gate/up weights' bytes, freed with the KV cache by
    ``release_kv_cache``), ``"merged_cublas"`` that with cuBLAS for every GEMM (head-major
    cache only; measured in docs/PERFORMANCE.md), ``"auto"``: ``merged_cublas`` for a
    one-GPU engine with the head-major cache (the faster decode step there: docs/PERFORMANCE.md,
    "Decode GEMMs"), ``xla`` otherwise (concatenating a
    tensor-parallel engine's sharded weights would gather them). prefill_kv_buckets: a prefill call
    attends over (and gathers / writes back) only the first ``kv`` positions of its slots'
    rows, ``kv`` the smallest of these lengths that holds every row's last prefilled position
    (``max_length`` is always the last bucket); ``None``: powers of two from
    :data:`MIN_PREFILL_KV` below ``max_length``; ``()`` (the default): every call attends over
    the whole row. Buckets cut prefill time but multiply the prefill shapes compiled at
    start-up (docs/PERFORMANCE.md, "Rollout on 1, 2, 4 GPUs"). share_prompts: a request
    (``n == 1``) whose prompt equals, id for id, that of a request still waiting for its
    prefill does not prefill it again: it waits for that prefill and copies the KV row (the
    ``n > 1`` fork path), e.g. the samples of a GRPO group on their first turn.
    prefill_attention: a prefill call's attention over the head-major cache: ``"flash"`` a
    Pallas flash kernel that reads only the keys each block of queries sees and writes no
    scores to memory (``prefill_attention.py``), on a copy of the call's rows (their KV bucket,
    gathered and written back); ``"flash_in_cache"`` the same kernel reading each row where it
    is in the cache (no gather, no write-back, no KV buckets: ``prefill_kv_buckets`` is
    ignored), with packed calls: rows of ``BLOCK_Q`` (64) tokens, as many per sequence as it
    has tokens queued (``prefill_plan.plan_packed``; ``prefill_chunks`` is ignored, the calls
    hold ``prefill_tokens`` tokens or a quarter or sixteenth of that); ``"dense"`` XLA einsums
    over the call's whole KV length; ``"auto"``: flash_in_cache on a GPU, dense elsewhere
    (one-device engines; ``attention_choice.resolve_prefill_attention`` says what falls back
    where). deliver_after_launch: hand finished requests their results only once the next
    device call is launched (or the engine goes idle), so the event loop each result wakes
    runs while the device computes, not between the engine thread's calls (results arrive
    later by the host work before that launch, unchanged; off by default until measured on a
    GPU).
    """

    max_batch: int = 32
    max_length: int = 2048
    dtype: str | None = None
    weights_dtype: str | None = None
    prefill_chunks: tuple[int, ...] = (64, 256, 1024)
    prefill_tokens: int = 4096
    decode_steps: int = 16
    max_stop_ids: int = 8
    max_queue: int = 4096
    copy_rows: int = 8
    session_cache: bool = True
    seed: int = 0
    kv_layout: str = HEAD_MAJOR
    prefill_calls_per_step: int = 4
    decode_attention: str = "auto"
    decode_gemm: str = "auto"
    prefill_kv_buckets: tuple[int, ...] | None = ()
    share_prompts: bool = True
    prefill_attention: str = "auto"
    deliver_after_launch: bool = False

    def __post_init__(self) -> None:
        if self.kv_layout not in (HEAD_MAJOR, SEQ_MAJOR):
            raise ValueError(f"kv_layout must be {HEAD_MAJOR!r} (the engine's head-major cache) "
                             f"or {SEQ_MAJOR!r} (the model's own cache and forward)")
        if self.max_batch < 1 or self.max_length < 2:
            raise ValueError("max_batch must be >= 1 and max_length >= 2")
        if self.decode_steps < 1:
            raise ValueError("decode_steps must be >= 1")
        if not self.prefill_chunks or min(self.prefill_chunks) < 1:
            raise ValueError("prefill_chunks must be non-empty positive sizes")
        if self.decode_attention not in DECODE_ATTENTION:
            raise ValueError(f"decode_attention must be one of {DECODE_ATTENTION}, "
                             f"got {self.decode_attention!r}")
        if self.prefill_attention not in PREFILL_ATTENTION:
            raise ValueError(f"prefill_attention must be one of {PREFILL_ATTENTION}, "
                             f"got {self.prefill_attention!r}")
        if self.decode_gemm not in DECODE_GEMM + ("auto",):
            raise ValueError(f"decode_gemm must be 'auto' or one of {DECODE_GEMM}, "
                             f"got {self.decode_gemm!r}")
        if self.decode_gemm not in ("auto", "xla") and self.kv_layout != HEAD_MAJOR:
            raise ValueError(f"decode_gemm={self.decode_gemm!r} needs kv_layout={HEAD_MAJOR!r}")
        if self.prefill_kv_buckets is not None and any(
                int(b) < 1 for b in self.prefill_kv_buckets):
            raise ValueError("prefill_kv_buckets must be positive lengths")
        for name in ("dtype", "weights_dtype"):
            value = getattr(self, name)
            if value not in (None, "float32", "bfloat16", "float16"):
                raise ValueError(f"{name} must be float32, bfloat16 or float16, got {value!r}")

    @property
    def chunk_buckets(self) -> tuple[int, ...]:
        chunks = sorted({min(c, self.max_length) for c in self.prefill_chunks})
        return tuple(chunks)

    def prefill_rows(self, chunk: int) -> int:
        return max(1, min(self.max_batch, self.prefill_tokens // chunk))

    @functools.cached_property
    def kv_buckets(self) -> tuple[int, ...]:
        """The KV lengths prefill calls are compiled for, ascending, ending at ``max_length``."""
        if self.prefill_kv_buckets is None:
            below, b = [], MIN_PREFILL_KV
            while b < self.max_length:
                below.append(b)
                b *= 2
        else:
            below = [int(b) for b in self.prefill_kv_buckets if int(b) < self.max_length]
        return tuple(sorted(set(below))) + (self.max_length,)

    def prefill_kv(self, chunk: int, needed: int) -> int:
        """The KV length of a prefill call in chunk bucket ``chunk`` whose rows reach position
        ``needed - 1``: the smallest bucket ``>= max(needed, chunk)`` (so a chunk's compiled
        shapes are only those with ``kv >= chunk``)."""
        floor = max(needed, min(chunk, self.max_length))
        return next(b for b in self.kv_buckets if b >= floor)

    def packed_row_buckets(self) -> tuple[int, ...]:
        """Row counts of a packed prefill call (``prefill_plan.plan_packed``) of rows of the
        smallest chunk: ``prefill_tokens / chunk`` rows and a quarter and a sixteenth of that,
        so a call with few tokens queued does not compute a whole ``prefill_tokens`` call."""
        most = max(1, self.prefill_tokens // self.chunk_buckets[0])
        return tuple(sorted({max(1, most // 16), max(1, most // 4), most}))

    def prefill_shapes(self, packed: bool = False) -> list[tuple[int, int, int]]:
        """Every ``(chunk, rows, kv)`` a prefill call can have (what warm-up compiles);
        ``packed``: the packed calls' shapes (:meth:`packed_row_buckets` rows of the smallest
        chunk, at each KV bucket)."""
        if packed:
            chunk = self.chunk_buckets[0]
            return [(chunk, rows, kv) for rows in self.packed_row_buckets()
                    for kv in self.kv_buckets if kv >= chunk]
        return [(chunk, self.prefill_rows(chunk), kv) for chunk in self.chunk_buckets
                for kv in self.kv_buckets if kv >= chunk]

    def resolved_decode_attention(self, platform: str) -> str:
        """``ragged_fused``, ``ragged`` or ``dense`` for a device platform (``"gpu"``,
        ``"cpu"``, ``"tpu"``): ``auto`` is ragged_fused on GPUs (the Pallas Triton kernel),
        dense elsewhere."""
        if self.decode_attention != "auto":
            return self.decode_attention
        return "ragged_fused" if platform == "gpu" else "dense"

    def resolved_prefill_attention(self, platform: str) -> str:
        """``flash``, ``flash_in_cache`` or ``dense`` for a device platform: ``auto`` is
        flash_in_cache on GPUs (the Pallas Triton kernel reading the rows in place), dense
        elsewhere."""
        if self.prefill_attention != "auto":
            return self.prefill_attention
        return "flash_in_cache" if platform == "gpu" else "dense"

    def resolved_decode_gemm(self, platform: str, tensor_parallel: int) -> str:
        """One of ``forward.DECODE_GEMM`` for an engine on ``tensor_parallel`` devices of
        ``platform``: ``auto`` is ``merged_cublas`` for one GPU with the head-major cache,
        ``xla`` otherwise; an explicit choice is kept."""
        if self.decode_gemm != "auto":
            return self.decode_gemm
        one_gpu = platform == "gpu" and tensor_parallel == 1 and self.kv_layout == HEAD_MAJOR
        return MERGED_CUBLAS if one_gpu else XLA_GEMM


def parse_prefill_kv_buckets(value: Any, name: str = "prefill_kv_buckets"
                             ) -> tuple[int, ...] | None:
    """A configured / command-line ``value`` as ``EngineConfig.prefill_kv_buckets``: ``""`` ->
    ``()`` (the whole row), ``"auto"`` -> ``None`` (powers of two), ``"512,1024"`` / a sequence
    -> those lengths. ``name`` names the setting in the ``ValueError``."""
    if value in (None, "", ()):
        return ()
    if value == "auto":
        return None
    items = value.split(",") if isinstance(value, str) else list(value)
    try:
        lengths = tuple(int(x) for x in items if str(x).strip())
    except ValueError:
        raise ValueError(f"{name} must be '', 'auto' or a comma list of lengths, "
                         f"got {value!r}") from None
    if not lengths or min(lengths) < 1:
        raise ValueError(f"{name}: lengths must be >= 1, got {value!r}")
    return lengths


__all__ = ["EngineConfig", "DECODE_ATTENTION", "PREFILL_ATTENTION", "MIN_PREFILL_KV", "parse_prefill_kv_buckets"]
