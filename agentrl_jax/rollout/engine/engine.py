"""Embedded JAX continuous-batching engine.

Design (see docs/ROLLOUT.md for the long version):

* A fixed pool of ``max_batch`` slots; slot ``b`` owns row ``b`` of every layer's KV cache
  ``[max_batch, K, max_length, Dh]`` (head-major, see ``forward.py``). Rows are indexed by
  absolute position.
* **Decode**: one jitted function runs up to ``decode_steps`` steps for all slots inside a
  ``lax.while_loop`` (static shapes ``[max_batch, 1]``), with sampling fused in and stop detection
  on device (stop token ids, token budget). It returns after ``decode_steps`` steps, when every
  slot is done, or -- if requests are waiting for a slot -- as soon as any slot finishes. The
  host synchronises once per call, not once per token. The cache buffers are donated.
* **Prefill** is chunked: a call processes ``[rows, chunk]`` tokens for up to ``rows`` sequences
  (``rows * chunk ~= prefill_tokens``) with chunk sizes from a few fixed buckets, so only a few
  shapes compile. Prefill writes the prompt's KV except its last token; the first decode step
  feeds the last prompt token and samples the first new token, so every token is sampled by the
  same fused decode code.
* **Continuous batching**: between calls, finished sequences leave and waiting requests take
  their slots. A background thread drives the loop; the asyncio API awaits futures.
* **Prefix reuse**: a finished sequence of a ``session_id`` leaves its KV row cached; when the
  session's next request extends those tokens it takes the same slot and prefills only the new
  suffix (LRU eviction when slots are needed). ``n > 1`` samples of a prompt prefill it once and
  copy the KV row to the other samples' slots.
* **Weights** are a jit argument (``graphdef`` is static), so ``update_weights`` swaps the
  reference -- no copy, no recompilation -- and drops cached prefixes.
* **Placement**: an engine runs on one device or tensor-parallel on a device group
  (``placement.py``); ``replicas.py`` runs one engine per device (group) behind one backend.
* **Decode attention** reads only each slot's valid KV on GPUs (``decode_attention.py``);
  **prefill attention** is a flash kernel there that reads each row where it is in the cache
  (``prefill_attention.py``; ``attention_choice.py`` picks both kernels).
* **Fault isolation**: the host-side work of one request (admission, activation, building its
  prefill row, stop detection, detokenisation) runs under ``Scheduler.isolated``: an error
  there fails that request alone (``Scheduler.fail_request``: its future gets the error, its
  slots are freed) and the batch goes on. Only a failed device call (prefill, decode, row copy)
  or an error in the engine's shared bookkeeping fails every request in flight
  (``FailurePolicy.recover``: "engine step failed").

``Engine`` is the wiring and the public API; its collaborators own the state (docs/ROLLOUT.md,
"Who owns what"): ``EngineWeights`` (weights.py: the served state, its merged copy, the
version, the swap), ``KVCacheMemory`` (kv_memory.py: the KV cache, release / allocate),
``EngineFunctions`` (compiled.py: the jitted device functions), ``EngineInbox`` (inbox.py:
incoming requests, commands, the requests in flight, pause / close), ``Scheduler``
(scheduler.py: slots and queues; the per-slot decode buffers of slot_buffers.py),
``FailurePolicy`` (failures.py) and ``EngineLoop`` (engine_loop.py: the thread). Shapes and
knobs: ``engine_config.py``; request bookkeeping and counters: ``requests.py``; devices:
``placement.py``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import threading
import uuid
import warnings
from typing import Any, Callable, Sequence

import jax
import numpy as np
from flax import nnx

from agentrl_jax import compile_notice
from agentrl_jax.compile_notice import Announced
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.llama import CausalLM, abstract_model
from agentrl_jax.models.weights import LoadCancelled
from agentrl_jax.rollout.contract import (BatchedSamplesBackend, GenerateResult,
                                          InvalidRequestError, SamplingParams, WeightSource)
from agentrl_jax.rollout.engine.attention_choice import (resolve_decode_attention,
                                                         resolve_prefill_attention)
from agentrl_jax.rollout.engine.compiled import STOP, EngineFunctions, compiled_functions
from agentrl_jax.rollout.engine.engine_config import EngineConfig
from agentrl_jax.rollout.engine.engine_loop import EngineLoop
from agentrl_jax.rollout.engine.failures import FailurePolicy
from agentrl_jax.rollout.engine.forward import FLASH_IN_CACHE, FLASH_IN_CACHE_INTERPRET
from agentrl_jax.rollout.engine.inbox import EngineInbox
from agentrl_jax.rollout.engine.kv_memory import KVCacheMemory
from agentrl_jax.rollout.engine.placement import EnginePlacement
from agentrl_jax.rollout.engine.prefill_plan import PrefillRows, blank_rows
from agentrl_jax.rollout.engine.prompt_ids import check_input_ids
from agentrl_jax.rollout.engine.resolution import resolve_engine_config
from agentrl_jax.rollout.engine.requests import EngineStats, Request, Seq
from agentrl_jax.rollout.engine.sampling import GREEDY, SAMPLE
from agentrl_jax.rollout.engine.scheduler import Scheduler
from agentrl_jax.rollout.engine.weights import EngineWeights

log = logging.getLogger(__name__)
# CPU backends cannot always reuse donated buffers; that is harmless.
warnings.filterwarnings("ignore", message="Some donated buffers were not usable")


class Engine(BatchedSamplesBackend):
    """The embedded continuous-batching engine (registry name ``embedded``).

    >>> engine = Engine(model, EngineConfig(max_batch=32, max_length=4096), tokenizer=tok)
    >>> result = await engine.generate(ids, SamplingParams(temperature=1.0), session_id="ep-7")

    ``devices``: the device (group) the engine runs on (default: the first local device); a
    group of several runs it tensor-parallel (``placement.py``). The engine wires its
    collaborators (module docstring) and keeps the public API; they own the state:
    ``weights``, ``kv``, ``functions``, ``inbox``, ``scheduler``, ``failures``, ``loop``.
    """

    name = "embedded"
    takes_id_arrays = True  # submit() copies them (check_input_ids)

    def __init__(self, model: CausalLM | Any, config: EngineConfig | None = None,
                 tokenizer: Any = None, model_path: str | None = None, warmup: bool = True,
                 devices: Sequence[Any] | None = None):
        from agentrl_jax.models.pretrained import Pretrained

        if isinstance(model, Pretrained):
            tokenizer = tokenizer if tokenizer is not None else model.tokenizer
            model_path = model_path or model.path
            model = model.model
        self.tokenizer = tokenizer
        self.model_path = model_path
        base_cfg: ModelConfig = model.cfg
        self.placement = EnginePlacement(devices)
        platform, tp = self.placement.platform, self.placement.tensor_parallel
        # the one place "auto" and platform values are decided (resolution.py)
        self._config = c = resolve_engine_config(config or EngineConfig(), platform, tp, base_cfg)
        self.model_config = base_cfg.replace(dtype=c.dtype, remat=False)
        if c.max_length > base_cfg.max_position_embeddings:
            log.warning("max_length %d exceeds the model's max_position_embeddings %d",
                        c.max_length, base_cfg.max_position_embeddings)
        self.graphdef, abstract_state = nnx.split(abstract_model(self.model_config))
        self.decode_attention = resolve_decode_attention(c, self.model_config, platform, tp)
        self.prefill_attention = resolve_prefill_attention(c, self.model_config, platform, tp)
        # rows read where they are in the cache (the resolution set one KV length, BLOCK_Q rows)
        self.packed_prefill = self.prefill_attention in (FLASH_IN_CACHE,
                                                         FLASH_IN_CACHE_INTERPRET)
        self.decode_gemm = c.decode_gemm
        decode, prefill, copy_rows, merge = compiled_functions(
            self.graphdef, jax.tree.structure(abstract_state), c.max_batch, c.max_length,
            c.decode_steps, c.max_stop_ids, c.kv_layout, self.decode_attention, self.decode_gemm,
            one_pass_sampler=platform == "gpu", prefill_attention=self.prefill_attention,
            decode_loop=c.decode_loop)
        # a compile after the warm-up (a sampling mode first used, a shape it did not cover) is
        # announced (``compile_notice.py``); the warm-up's own compiles are its caller's phase
        self.functions = EngineFunctions(
            decode=Announced(decode, (2, 3, 6), lambda a: (
                f"the engine's decode step (sampling mode {a[6]})")),
            prefill=Announced(prefill, (2, 3, 4), lambda a: (
                f"the engine's prefill of {PrefillRows(a[2], a[3]).rows} x {a[3]} tokens "
                f"(attending over {a[4]})")),
            copy_rows=copy_rows, merge=merge)
        # the decode GEMMs' concatenated weights: one copy per weight version, freed with the
        # KV cache (release_kv_cache) and rebuilt with it
        self.weights = EngineWeights(model, abstract_state,
                                     self.placement.state_shardings(abstract_state),
                                     self.model_config, c.weights_dtype, merge)
        self.kv = KVCacheMemory(c, self.model_config, self.placement.cache_sharding(
            self.model_config.num_kv_heads, c.kv_layout))
        self.eos_token_ids = list(base_cfg.eos_token_ids)
        if not self.eos_token_ids and tokenizer is not None and tokenizer.eos_token_id is not None:
            self.eos_token_ids = [tokenizer.eos_token_id]
        self.stats = EngineStats()
        self._rng = np.random.default_rng(c.seed)  # request seeds (submit)
        self.inbox = EngineInbox(c.max_queue)
        self.scheduler = Scheduler(c, self.functions, self.weights, self.kv, self.inbox,
                                   self.stats, tokenizer, self.vocab_size, self.packed_prefill)
        self.failures = FailurePolicy(self.inbox, self.scheduler, self.kv)
        self.loop = EngineLoop(self.inbox, self.scheduler, self.failures, self.kv, self.stats,
                               self._allocate_cache)
        if warmup:
            self.warmup()
        self.loop.start()

    # ------------------------------------------------------------------------ construction
    @classmethod
    def from_config(cls, model: Any = "smollm2", tokenizer: Any = None, engine: Any = None,
                    **kwargs: Any) -> "Engine":
        """Registry factory: ``model`` is a name / path for ``load_pretrained``, a ``Pretrained``
        or a ``CausalLM``; engine options come as ``engine=EngineConfig|dict`` or keyword
        arguments (``max_batch=..., max_length=..., dtype=...``)."""
        from agentrl_jax.models.pretrained import load_pretrained

        fields = {f.name for f in dataclasses.fields(EngineConfig)}
        engine_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in fields}
        warmup = kwargs.pop("warmup", True)
        if kwargs:
            raise TypeError(f"unknown embedded-engine options: {sorted(kwargs)}")
        if isinstance(engine, dict):
            engine_kwargs = {**engine, **engine_kwargs}
            engine = None
        config = engine or EngineConfig(**engine_kwargs)
        if isinstance(model, str):
            model = load_pretrained(model)
        return cls(model, config, tokenizer=tokenizer, warmup=warmup)

    def warmup(self, parallel: bool = True) -> None:
        """Compile every jitted shape (decode, each prefill bucket, row copy), then run each
        once with calls that change nothing (all rows idle / padded). ``parallel``: compile
        them all ahead of time at once on a thread pool first
        (``compile_notice.compile_ahead``), so start-up takes about the longest compile rather
        than their sum (the prefill KV buckets multiply the prefill shapes:
        ``EngineConfig.prefill_kv_buckets``)."""
        c = self.config
        ints = np.zeros_like(self.scheduler.buffers.ints)
        ints[:, STOP:] = -1
        n = c.copy_rows
        # (function, arguments, position of the KV cache among them)
        calls: list[tuple[Any, tuple, int]] = []
        fns, weights, memory = self.functions, self.weights, self.kv
        floats = self.scheduler.buffers.floats
        for mode in (GREEDY, SAMPLE):  # top-k/p/min-p (SAMPLE_FILTERED): on first use
            calls.append((fns.decode, ((weights.leaves, weights.merged), memory.cache, ints, floats,
                                       np.int32(1), np.bool_(False), mode), 1))
        for chunk, rows, kv in c.prefill_shapes(self.packed_prefill):
            calls.append((fns.prefill, (
                weights.leaves, memory.cache,
                blank_rows(rows, chunk, c.max_batch, c.max_length).packed, chunk, kv), 1))
        calls.append((fns.copy_rows, (memory.cache, np.stack(
            [np.zeros((n,), np.int32), np.full((n,), c.max_batch, np.int32)])), 0))
        outs = None
        with warnings.catch_warnings(), compile_notice.quiet():
            warnings.simplefilter("ignore")
            if parallel:
                compile_notice.compile_ahead([(fn, args) for fn, args, _ in calls])
            for fn, args, at in calls:  # the cache is donated: each call gets the last one's
                result = fn(*args[:at], memory.cache, *args[at + 1:])
                if fn is fns.decode:
                    memory.cache, outs, _ = result
                else:
                    memory.cache = result
        jax.block_until_ready((memory.cache, outs))

    # ------------------------------------------------------------------------- public API
    #: the settings compiled into the engine's functions and buffers: fixed for its lifetime
    FIXED_SETTINGS = ("max_batch", "max_length", "decode_steps", "max_stop_ids", "kv_layout",
                      "dtype", "weights_dtype", "decode_loop")

    @property
    def config(self) -> EngineConfig:
        return self._config

    @config.setter
    def config(self, config: EngineConfig) -> None:
        """New scheduling settings (``share_prompts``, ``deliver_after_launch``,
        ``session_cache``, ``prefill_calls_per_step``, ``max_queue``, ...), used from the next
        scheduling step; raises ``ValueError`` if one of :attr:`FIXED_SETTINGS` differs."""
        changed = [k for k in self.FIXED_SETTINGS
                   if getattr(config, k) != getattr(self._config, k)]
        if changed:
            raise ValueError(f"cannot change {changed} of a running engine")
        self._config = self.scheduler.config = config
        self.inbox.max_queue = config.max_queue

    @property
    def vocab_size(self) -> int:
        return self.model_config.vocab_size

    @property
    def max_length(self) -> int:
        return self.config.max_length

    @property
    def sampling_context(self) -> dict[str, int]:
        """This engine's bounds of the sampling parameters (``sampling_limits.CONTEXT_KEYS``)."""
        c = self.config
        options = self.model_config.option_token_ids
        return {"max_length": c.max_length, "max_batch": c.max_batch,
                "vocab_size": self.vocab_size, "max_stop_ids": c.max_stop_ids,
                "option_tokens": len(options) if options is not None else 0}

    def validate(self, input_ids: Any, sampling: SamplingParams) -> np.ndarray:
        """Check a request (raises ``InvalidRequestError``); returns the ids, int32 ``[L]``. The
        sampling parameters are checked against ``sampling_limits.py`` with this engine's
        bounds (``n <= max_batch``, ``max_new_tokens <= max_length``, stop ids in the
        vocabulary)."""
        ids = check_input_ids(input_ids, self.vocab_size, self.config.max_length)
        sampling.validate(self.vocab_size, self.sampling_context)
        if len(self.stop_ids(sampling)) > self.config.max_stop_ids:
            raise InvalidRequestError(
                f"at most {self.config.max_stop_ids} stop token ids per request "
                f"(got {len(self.stop_ids(sampling))})")
        if sampling.stop and self.tokenizer is None:
            raise InvalidRequestError("stop strings need a tokenizer; this engine has none")
        return ids

    def submit(self, input_ids: Any, sampling: SamplingParams | None = None,
               session_id: str | None = None, rid: str | None = None
               ) -> concurrent.futures.Future:
        """Queue a request (thread-safe). The future resolves to ``list[GenerateResult]``
        (``sampling.n`` samples). Raises ``InvalidRequestError`` / ``OverloadedError`` /
        ``BackendUnavailableError`` (``EngineInbox.submit``)."""
        sampling = sampling or SamplingParams()
        ids = self.validate(input_ids, sampling)
        if session_id is not None and not isinstance(session_id, str):
            raise InvalidRequestError("session_id must be a string")
        rid = str(rid) if rid is not None else uuid.uuid4().hex
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.rid = rid  # type: ignore[attr-defined]
        seed = sampling.seed if sampling.seed is not None else int(
            self._rng.integers(0, 2**63 - 1))
        req = Request(rid, ids, sampling, session_id, future, seed)
        stop_ids = self.stop_ids(sampling)
        req.seqs = [Seq(req, i, stop_ids) for i in range(sampling.n)]
        if sampling.max_new_tokens == 0:
            future.set_result([self.scheduler.result(s, "length", None) for s in req.seqs])
            return future
        self.inbox.submit(req)
        return future

    async def generate_n(self, input_ids: list[int], sampling: SamplingParams | None = None,
                         session_id: str | None = None, rid: str | None = None
                         ) -> list[GenerateResult]:
        future = self.submit(input_ids, sampling, session_id, rid)
        try:
            return await asyncio.shield(asyncio.wrap_future(future))
        except asyncio.CancelledError:
            # The caller gave up (e.g. the HTTP client went away): free its slots.
            self.abort(future.rid)  # type: ignore[attr-defined]
            raise

    def generate_sync(self, input_ids: list[int], sampling: SamplingParams | None = None,
                      session_id: str | None = None, rid: str | None = None,
                      timeout: float | None = None) -> list[GenerateResult]:
        """Blocking variant (for scripts and benchmarks); returns the ``n`` samples."""
        return self.submit(input_ids, sampling, session_id, rid).result(timeout)

    def abort(self, rid: str) -> bool:
        """Abort a request (thread-safe, returns at once); True if it was known."""
        return self.inbox.mark_aborted(rid, self.scheduler.abort_request)

    def end_session(self, session_id: str) -> None:
        """Free the KV row cached for a finished session (thread-safe, returns at once)."""
        self.inbox.command(lambda: self.scheduler.slots.forget_session(session_id),
                           quiet_when_closed=True)

    def abort_all(self) -> int:
        rids = self.inbox.running_ids()
        for rid in rids:
            self.abort(rid)
        return len(rids)

    def pause(self, mode: str = "in_place") -> None:
        """Stop stepping. ``in_place`` / ``retract`` keep requests (and their KV) until
        ``resume()``; ``abort`` aborts them first."""
        if mode not in ("abort", "in_place", "retract"):
            raise InvalidRequestError(f"pause mode must be abort, retract or in_place, got {mode!r}")
        if mode == "abort":
            self.abort_all()
        self.inbox.set_paused(True)

    def resume(self) -> None:
        self.inbox.set_paused(False)

    @property
    def paused(self) -> bool:
        return self.inbox.paused

    def _call_in_engine(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        """Run ``fn`` on the engine thread between steps (``EngineInbox.command``)."""
        return self.inbox.command(fn)

    def load(self) -> dict[str, int]:
        """Current load: running sequences, waiting requests, free / cached slots."""
        load = self.scheduler.load()
        return {"running": load["running"], "waiting": self.inbox.num_waiting,
                "free_slots": load["free_slots"], "cached_slots": load["cached_slots"]}

    def close(self) -> None:
        if self.inbox.close():
            self.loop.join(timeout=60)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    async def health(self) -> bool:
        return not self.inbox.closed and self.inbox.error is None and self.loop.alive()

    def stop_ids(self, sampling: SamplingParams) -> list[int]:
        """The stop token ids of a request: ``stop_token_ids`` (replacing the EOS default),
        else the EOS ids unless ``ignore_eos``."""
        if sampling.stop_token_ids is not None:
            return list(dict.fromkeys(sampling.stop_token_ids))  # replaces the EOS default
        return [] if sampling.ignore_eos else list(self.eos_token_ids)

    # ---------------------------------------------------------------- weights and KV memory
    @property
    def weight_version(self) -> str:
        """The served weights' version (``EngineWeights.version``)."""
        return self.weights.version

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
        state = self.weights.prepare(params)
        if cancel is not None and cancel.is_set():  # nobody wants these weights any more
            raise LoadCancelled("loading was cancelled")
        if abort_all:
            self.abort_all()

        def swap() -> str:
            new_version = self.weights.swap(state, version)
            if flush_cache:
                self.scheduler.slots.flush()
            self.stats.weight_updates += 1
            return new_version

        return self._call_in_engine(swap).result()

    def load_checkpoint(self, path: str, cancel: threading.Event | None = None) -> Any:
        """The model of the safetensors directory ``path``, refused (``ValueError``) unless its
        config has this engine's architecture, checked before anything is built or read."""
        return self.weights.load_checkpoint(path, cancel)

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
        return self._call_in_engine(self.scheduler.slots.flush).result()

    async def flush_cache(self) -> int:
        return await asyncio.to_thread(self.flush_cache_sync)

    def release_kv_cache_sync(self) -> int:
        """Free the KV cache (``[max_batch, max_length]`` rows of every layer) and the merged
        decode weights while the engine is idle; cached prefixes are dropped and the next
        request allocates a zero cache again (``stats.kv_allocations``). Returns the bytes
        freed (0 when already released). Raises ``RuntimeError`` while a request is queued or
        running."""

        def release() -> int:
            scheduler = self.scheduler
            if scheduler.busy:
                raise RuntimeError("cannot release the KV cache while requests are running "
                                   f"({len(scheduler.slot_seq)} running, "
                                   f"{len(scheduler.waiting)} waiting)")
            if self.kv.released:
                return 0
            scheduler.slots.flush()
            freed = self.kv.release() + self.weights.release_merged()
            self.stats.kv_releases += 1
            return freed

        return self._call_in_engine(release).result()

    async def release_kv_cache(self) -> int:
        return await asyncio.to_thread(self.release_kv_cache_sync)

    def resume_kv_cache_sync(self) -> int:
        """Allocate a released KV cache now (else the next request does); returns its bytes
        (0 when it was not released)."""
        return self._call_in_engine(self._allocate_cache).result()

    async def resume_kv_cache(self) -> int:
        return await asyncio.to_thread(self.resume_kv_cache_sync)

    def _allocate_cache(self) -> int:
        """(Engine thread.) A zero KV cache and the merged weights in place of released ones;
        returns their bytes (0 when the cache was not released)."""
        if not self.kv.released:
            return 0
        allocated = self.kv.allocate() + self.weights.ensure_merged()
        self.stats.kv_allocations += 1
        return allocated


EmbeddedBackend = Engine

__all__ = ["Engine", "EngineConfig", "EngineStats", "EmbeddedBackend"]
