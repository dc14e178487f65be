"""The engine's settings: one typed section (``EngineConfig``), the one default of each.

``EngineConfig`` is a ``agentrl_common.typed_sections.Section``: every field is declared with
``setting(default, checks, help=...)`` and nowhere else. Its users:

* the embedded engine (``Engine(model, EngineConfig(...))``), which resolves the section's
  ``"auto"`` and platform-dependent values once, on entry (``resolution.resolve_engine_config``);
* the run config: ``rollout`` (``training/config/rollout_section.py``) declares the engine
  settings a run sets with ``engine_setting(<field>)`` (default, checks and help copied from
  here), and ``engine_config_of_run`` maps them back, field by field;
* the rollout server, whose engine options are generated from these fields
  (``rollout/servers/engine_flags.py``: name, type, default, help), and the engine-servers
  backend, which writes a server's command line from an ``EngineConfig`` with the same module.

``"auto"`` values (the attention kernels, the decode GEMMs, the prefill chunks, tokens and KV
buckets) stay ``"auto"`` here; they are meaningful only once a platform is known.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

from agentrl_common.typed_sections import Section, is_int, setting
from agentrl_jax.rollout.engine.compiled import DECODE_LOOPS
from agentrl_jax.rollout.engine.forward import (DECODE_GEMM, HEAD_MAJOR, MERGED_CUBLAS, SEQ_MAJOR,
                                         XLA_GEMM)

DECODE_ATTENTION = ("auto", "ragged_fused", "ragged", "dense")
PREFILL_ATTENTION = ("auto", "flash", "flash_in_cache", "dense")
#: the compute / KV-cache dtypes an engine may be given (None or "": the model's own)
ENGINE_DTYPES = ("float32", "bfloat16", "float16")
#: the smallest default prefill KV bucket (``EngineConfig.prefill_kv_buckets``)
MIN_PREFILL_KV = 512
#: ``"auto"`` prefill chunks and tokens per call on an accelerator (``resolution.py`` says CPU's)
ACCELERATOR_PREFILL_CHUNKS = (64, 256, 1024)
ACCELERATOR_PREFILL_TOKENS = 4096
AUTO = "auto"


def parse_prefill_kv_buckets(value: Any, name: str = "prefill_kv_buckets"
                             ) -> tuple[int, ...] | None:
    """A configured / command-line ``value`` as KV buckets: ``""`` -> ``()`` (the whole row),
    ``"auto"`` -> ``None`` (resolved per platform), ``"512,1024"`` / a sequence -> those
    lengths. ``name`` names the setting in the ``ValueError``."""
    if value in (None, "", ()):
        return ()
    if value == AUTO:
        return None
    items = value.split(",") if isinstance(value, str) else list(value)
    try:
        lengths = tuple(int(x) for x in items if str(x).strip())
    except (ValueError, TypeError):
        raise ValueError(f"{name} must be '', 'auto' or a comma list of lengths, "
                         f"got {value!r}") from None
    if not lengths or min(lengths) < 1:
        raise ValueError(f"{name}: lengths must be >= 1, got {value!r}")
    return lengths


def kv_buckets_check(name: str) -> Callable[[Any], str | None]:
    """A field check of KV buckets (``parse_prefill_kv_buckets``'s rules; None is ``"auto"``)."""
    def problem(value: Any) -> str | None:
        try:
            parse_prefill_kv_buckets(value, name)
        except ValueError as error:
            return str(error)
        return None
    return problem


def _chunks_problem(value: Any) -> str | None:
    if value == AUTO:
        return None
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (tuple, list)) or not items or not all(
            is_int(c) or (isinstance(c, str) and c.strip().isdigit()) for c in items) or min(
            int(c) for c in items) < 1:
        return f"must be 'auto' or non-empty positive sizes, e.g. '64,256' (got {value!r})"
    return None


def _tokens_problem(value: Any) -> str | None:
    if value == AUTO or (is_int(value) and value >= 1) or (
            isinstance(value, str) and value.strip().isdigit() and int(value) >= 1):
        return None  # digits as a string: a run config's command line spelling
    return f"must be 'auto' or an integer >= 1 (got {value!r})"


def _lengths(value: Any) -> tuple[int, ...]:
    items = value.split(",") if isinstance(value, str) else value
    return tuple(int(x) for x in items if str(x).strip())


@dataclasses.dataclass(frozen=True)
class EngineConfig(Section):
    """The engine's settings: static shapes and scheduling knobs (one default each, below).
    ``"auto"`` values are resolved for the engine's devices by
    ``resolution.resolve_engine_config`` (the shape helpers below refuse them until then).

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
    (``max_length`` is always the last bucket); ``"auto"`` (the default; ``None`` is read as
    ``"auto"``): powers of two from :data:`MIN_PREFILL_KV` below ``max_length`` on an
    accelerator, the whole row on CPU (``resolution.py``); ``()`` or ``""``: every call attends over
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
    GPU). decode_loop: the decode call's loop (``compiled.DECODE_LOOPS``): ``"while"`` stops
    as soon as no slot is active (or, with a request waiting for a slot, when one finishes),
    its condition read on the host every step on a GPU; ``"fixed"`` always runs
    ``decode_steps`` steps, those after that point idle, so the call can run ahead of the host
    (the same tokens, log-probs and cache as ``"while"``; ``"while"`` by default until measured
    on a GPU).
    """

    PREFIX = "engine"
    max_batch: int = setting(64, ge=1, help="slots: sequences decoded together (on the CPU "
                             "backend at most as many as hold their KV cache in a sixth of RAM)")
    max_length: int = setting(4096, ge=2, help="KV-cache length per slot (prompt + generated "
                              "tokens)")
    dtype: str | None = setting(None, choices=ENGINE_DTYPES, kind="dtype", help="compute / "
                                "KV-cache dtype (default: the model's)")
    weights_dtype: str | None = setting(None, choices=ENGINE_DTYPES, kind="dtype", help="cast "
                                        "a copy of the weights to this dtype")
    prefill_chunks: str | tuple[int, ...] = setting(AUTO, check=_chunks_problem, help=(
        "chunk sizes of chunked prefill, e.g. 64,256,1024 ('auto': by platform)"))
    prefill_tokens: int | str = setting(AUTO, check=_tokens_problem, help=(
        "tokens per prefill call ('auto': by platform)"))
    decode_steps: int = setting(16, ge=1, help="decode steps per jitted call")
    max_stop_ids: int = setting(8, ge=1, help="stop token ids per request")
    max_queue: int = setting(4096, ge=0, help="waiting requests beyond which a request is "
                             "refused (overloaded)")
    copy_rows: int = setting(8, ge=1, help="KV rows copied per call (n > 1 and shared "
                             "prompts)")
    session_cache: bool = setting(True, help="keep finished sessions' KV rows for prefix reuse")
    seed: int = setting(0, help="sampling seed of requests without one")
    kv_layout: str = setting(HEAD_MAJOR, choices=(HEAD_MAJOR, SEQ_MAJOR), kind="kv_layout",
                             help="bksd (head-major cache, the engine's forward) or bskd (the "
                                  "model's own)")
    prefill_calls_per_step: int = setting(4, ge=1, help="prefill calls before each decode call "
                                          "while prompts wait")
    decode_attention: str = setting(AUTO, choices=DECODE_ATTENTION, kind="decode_attention",
                                    help="auto (ragged_fused on GPU), ragged_fused, ragged or "
                                         "dense")
    decode_gemm: str = setting(AUTO, choices=(AUTO, *DECODE_GEMM), kind="decode_gemm",
                               help="auto (merged q/k/v and gate/up on cuBLAS for one GPU), "
                                    "xla, merged or merged_cublas")
    prefill_kv_buckets: str | tuple[int, ...] | None = setting(
        AUTO, check=kv_buckets_check("prefill_kv_buckets"), help="'' (the whole row), 'auto' "
        "(powers of two from 512 on an accelerator, the whole row on CPU) or a comma list")
    share_prompts: bool = setting(True, help="a prompt equal to one waiting for its prefill "
                                  "copies that prefill's KV row")
    prefill_attention: str = setting(AUTO, choices=PREFILL_ATTENTION, kind="prefill_attention",
                                     help="auto (flash_in_cache on GPU), flash, flash_in_cache "
                                          "or dense")
    deliver_after_launch: bool = setting(False, help="hand results over once the next device "
                                         "call is launched")
    decode_loop: str = setting("while", choices=DECODE_LOOPS, kind="decode_loop",
                               help="while (stop as soon as nothing decodes) or fixed "
                                    "(decode_steps steps a call, a trip count XLA knows)")

    def __post_init__(self) -> None:
        """Spellings normalised before the checks: ``""`` dtype -> None (the model's),
        KV buckets ``None`` -> ``"auto"``, comma strings and lists -> tuples of ints."""
        normal = {"dtype": self.dtype or None, "weights_dtype": self.weights_dtype or None}
        if self.prefill_kv_buckets is None:
            normal["prefill_kv_buckets"] = AUTO
        elif self.prefill_kv_buckets != AUTO and not kv_buckets_check("")(
                self.prefill_kv_buckets):
            normal["prefill_kv_buckets"] = parse_prefill_kv_buckets(self.prefill_kv_buckets)
        if self.prefill_chunks != AUTO and _chunks_problem(self.prefill_chunks) is None:
            normal["prefill_chunks"] = _lengths(self.prefill_chunks)
        for name, value in normal.items():
            object.__setattr__(self, name, value)
        super().__post_init__()

    def _extra_problems(self, prefix: str, bad: set[str]) -> list[str]:
        if not bad & {"decode_gemm", "kv_layout"} and self.decode_gemm not in (
                AUTO, XLA_GEMM) and self.kv_layout != HEAD_MAJOR:
            return [f"{prefix}.decode_gemm: {self.decode_gemm!r} needs kv_layout="
                    f"{HEAD_MAJOR!r} (got kv_layout={self.kv_layout!r})"]
        return []

    @property
    def resolved(self) -> bool:
        """Whether no setting is ``"auto"`` any more (``resolution.resolve_engine_config``)."""
        return AUTO not in (self.prefill_chunks, self.prefill_tokens, self.prefill_kv_buckets,
                            self.decode_attention, self.prefill_attention, self.decode_gemm)

    def _concrete(self, name: str) -> Any:
        value = getattr(self, name)
        if value == AUTO:
            raise ValueError(f"EngineConfig.{name} is 'auto': resolve the config for a "
                             "platform first (rollout.engine.resolution.resolve_engine_config)")
        return value

    @property
    def chunk_buckets(self) -> tuple[int, ...]:
        chunks = sorted({min(c, self.max_length) for c in self._concrete('prefill_chunks')})
        return tuple(chunks)

    def prefill_rows(self, chunk: int) -> int:
        return max(1, min(self.max_batch, self._concrete('prefill_tokens') // chunk))

    @functools.cached_property
    def kv_buckets(self) -> tuple[int, ...]:
        """The KV lengths prefill calls are compiled for, ascending, ending at ``max_length``."""
        below = [int(b) for b in self._concrete("prefill_kv_buckets") if int(b) < self.max_length]
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
        most = max(1, self._concrete('prefill_tokens') // self.chunk_buckets[0])
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

    def accelerator_kv_buckets(self) -> tuple[int, ...]:
        """What ``"auto"`` KV buckets are on an accelerator: the powers of two from
        :data:`MIN_PREFILL_KV` below ``max_length``."""
        below, b = [], MIN_PREFILL_KV
        while b < self.max_length:
            below.append(b)
            b *= 2
        return tuple(below)

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


__all__ = ["EngineConfig", "DECODE_ATTENTION", "PREFILL_ATTENTION", "ENGINE_DTYPES", "MIN_PREFILL_KV",
           "ACCELERATOR_PREFILL_CHUNKS", "ACCELERATOR_PREFILL_TOKENS", "AUTO",
           "kv_buckets_check", "parse_prefill_kv_buckets"]
