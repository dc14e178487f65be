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
  prefill row, stop detection, detokenisation) runs under ``_isolated``: an error there fails
  that request alone (``_fail_request``: its future gets the error, its slots are freed) and
  the batch goes on. Only a failed device call (prefill, decode, row copy) or an error in the
  engine's shared bookkeeping fails every request in flight (``_recover``: "engine step
  failed").

Modules by job: ``engine_config.py`` (shapes and knobs), ``compiled.py`` (the jitted device
functions), ``requests.py`` (request / sequence bookkeeping, counters), ``placement.py``
(devices and shardings), ``slots.py`` (slot table and prefix cache); this module is the
scheduler and its thread.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import itertools
import logging
import threading
import uuid
import warnings
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from agentrl_jax import compile_notice
from agentrl_jax.compile_notice import Announced
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.llama import CausalLM, abstract_model
from agentrl_jax.rollout.contract import (BackendUnavailableError, BatchedSamplesBackend,
                                               GenerateResult, InvalidRequestError,
                                               OverloadedError, SamplingParams, check_input_ids)
from agentrl_jax.rollout.engine.attention_choice import (resolve_decode_attention,
                                                         resolve_prefill_attention)
from agentrl_jax.rollout.engine.compiled import STOP, compiled_functions
from agentrl_jax.rollout.engine.engine_config import EngineConfig
from agentrl_jax.rollout.engine.failures import FailureHandling
from agentrl_jax.rollout.engine.forward import (FLASH_IN_CACHE, FLASH_IN_CACHE_INTERPRET,
                                                new_cache)
from agentrl_jax.rollout.engine.placement import EnginePlacement, to_state
from agentrl_jax.kernels.prefill_attention import BLOCK_Q
from agentrl_jax.rollout.engine.requests import EngineStats, Request, Seq
from agentrl_jax.rollout.engine.sampling import GREEDY, SAMPLE
from agentrl_jax.rollout.engine.scheduler import Scheduler
from agentrl_jax.rollout.engine.slots import SlotTable
from agentrl_jax.rollout.engine.weights import WeightsAndCache

log = logging.getLogger(__name__)
_PLACE_LOCK = threading.Lock()  # Engine._prepare_state's device_put (see there)
# CPU backends cannot always reuse donated buffers; that is harmless.
warnings.filterwarnings("ignore", message="Some donated buffers were not usable")


class Engine(WeightsAndCache, Scheduler, FailureHandling, BatchedSamplesBackend):
    """The embedded continuous-batching engine (registry name ``embedded``).

    >>> engine = Engine(model, EngineConfig(max_batch=32, max_length=4096), tokenizer=tok)
    >>> result = await engine.generate(ids, SamplingParams(temperature=1.0), session_id="ep-7")

    ``devices``: the device (group) the engine runs on (default: the first local device); a
    group of several runs it tensor-parallel (``placement.py``).
    """

    name = "embedded"

    def __init__(self, model: CausalLM | Any, config: EngineConfig | None = None,
                 tokenizer: Any = None, model_path: str | None = None, warmup: bool = True,
                 devices: Sequence[Any] | None = None):
        from agentrl_jax.models.pretrained import Pretrained

        if isinstance(model, Pretrained):
            tokenizer = tokenizer if tokenizer is not None else model.tokenizer
            model_path = model_path or model.path
            model = model.model
        self.config = config or EngineConfig()
        self.tokenizer = tokenizer
        self.model_path = model_path
        base_cfg: ModelConfig = model.cfg
        self.model_config = base_cfg.replace(dtype=self.config.dtype or base_cfg.dtype,
                                             remat=False)
        if self.config.max_length > base_cfg.max_position_embeddings:
            log.warning("max_length %d exceeds the model's max_position_embeddings %d",
                        self.config.max_length, base_cfg.max_position_embeddings)
        self.placement = EnginePlacement(devices)
        self.graphdef, self._abstract_state = nnx.split(abstract_model(self.model_config))
        self._state_shardings = self.placement.state_shardings(self._abstract_state)
        self._state = self._prepare_state(model)
        self.weight_version = "0"
        c = self.config
        platform, tp = self.placement.platform, self.placement.tensor_parallel
        self.decode_attention = resolve_decode_attention(c, self.model_config, platform, tp)
        self.prefill_attention = resolve_prefill_attention(c, self.model_config, platform, tp)
        # rows read where they are in the cache: one KV length (the whole row), packed calls of
        # BLOCK_Q-token rows (several per sequence; scheduler.py, prefill_plan.py)
        self.packed_prefill = self.prefill_attention in (FLASH_IN_CACHE,
                                                         FLASH_IN_CACHE_INTERPRET)
        if self.packed_prefill:
            self.config = c = dataclasses.replace(c, prefill_kv_buckets=(),
                                                  prefill_chunks=(BLOCK_Q,))
        self.decode_gemm = c.resolved_decode_gemm(self.placement.platform,
                                                  self.placement.tensor_parallel)
        self._decode_fn, self._prefill_fn, self._copy_fn, self._merge_fn = compiled_functions(
            self.graphdef, c.max_batch, c.max_length, c.decode_steps, c.max_stop_ids,
            c.kv_layout, self.decode_attention, self.decode_gemm,
            one_pass_sampler=self.placement.platform == "gpu",
            prefill_attention=self.prefill_attention)
        # a compile after the warm-up (a sampling mode first used, a shape it did not cover) is
        # announced (``compile_notice.py``); the warm-up's own compiles are its caller's phase
        self._decode_fn = Announced(self._decode_fn, (2, 3, 6), lambda a: (
            f"the engine's decode step (sampling mode {a[6]})"))
        self._prefill_fn = Announced(self._prefill_fn, (2, 3, 4, 5), lambda a: (
            f"the engine's prefill of {a[3].shape[0]} x {a[3].shape[1]} tokens "
            f"(attending over {a[5]})"))
        # the decode GEMMs' concatenated weights (decode_gemm merged*), one copy per weight
        # version; freed with the KV cache (release_kv_cache) and rebuilt with it
        self._merged = self._merge_fn(self._state)
        self._cache_sharding = self.placement.cache_sharding(self.model_config.num_kv_heads,
                                                             c.kv_layout)
        self._cache = self._new_cache()
        self.eos_token_ids = list(base_cfg.eos_token_ids)
        if not self.eos_token_ids and tokenizer is not None and tokenizer.eos_token_id is not None:
            self.eos_token_ids = [tokenizer.eos_token_id]
        self.stats = EngineStats()
        # Host mirrors of the per-slot decode state.
        self._ints = np.zeros((c.max_batch, STOP + c.max_stop_ids), np.int32)
        self._ints[:, STOP:] = -1
        self._floats = np.zeros((c.max_batch, 3), np.float32)
        # Outputs accumulate per slot on the host; copied to the sequence when it finishes.
        self._out_tok = np.zeros((c.max_batch, c.max_length), np.int32)
        self._out_lp = np.zeros((c.max_batch, c.max_length), np.float32)
        self._out_raw = np.zeros((c.max_batch, c.max_length), np.float32)
        self._out_len = np.zeros((c.max_batch,), np.int64)
        self._has_stop_str = np.zeros((c.max_batch,), np.bool_)
        # Per slot with stop strings: which tokens may complete a match (stop_strings.py).
        self._stop_masks: list[np.ndarray | None] = [None] * c.max_batch
        self._slots = SlotTable(c.max_batch)
        self._slot_seq: dict[int, Seq] = {}
        self._waiting: collections.deque[Request] = collections.deque()
        self._prefill_queue: list[Seq] = []
        self._fork_ready: list[Seq] = []
        # prompt ids -> the sequence prefilling them (``share_prompts``): an equal prompt that
        # arrives before that prefill ends copies its row instead of prefilling again
        self._prompt_leaders: dict[tuple[int, ...], Seq] = {}
        self._requests: dict[str, Request] = {}
        self._deliveries: list[Request] = []  # finished, results not handed over yet
        self._rng = np.random.default_rng(c.seed)
        self._rid_counter = itertools.count()
        # Thread plumbing.
        self._cv = threading.Condition()
        self._incoming: list[Request] = []
        self._commands: list[tuple[Callable[[], Any], concurrent.futures.Future]] = []
        self._num_waiting = 0
        self._paused = False
        self._closed = False
        self._error: str | None = None
        if warmup:
            self.warmup()
        self._thread = threading.Thread(target=self._loop, name="agentrl-engine", daemon=True)
        self._thread.start()

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

    def _new_cache(self):
        """A zero KV cache, allocated directly in its sharding on the engine's devices."""
        c = self.config
        return jax.jit(lambda: new_cache(c.kv_layout, self.model_config, c.max_batch,
                                         c.max_length), out_shardings=self._cache_sharding)()

    def _prepare_state(self, params: Any) -> nnx.State:
        state = to_state(params, self._abstract_state)
        if self.config.weights_dtype:
            dt = jnp.dtype(self.config.weights_dtype)
            state = jax.tree.map(
                lambda x: x.astype(dt) if jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dt
                else x, state)
        # Every state, the first one included, is committed to the engine's own shardings: the
        # compiled decode / prefill functions are keyed on their inputs' shardings, and weights
        # laid out otherwise (a learner's mesh, an uncommitted array) would recompile all of
        # them on the next call (docs/PERFORMANCE.md, "A whole RL step"). Arrays already laid
        # out so are not copied;
        # arrays on other devices (a learner sharded over every GPU) are transferred. One thread
        # at a time: replicas (threads) put the same arrays, and two concurrent device_puts of one
        # sharded array can fail in JAX ("safe_zip() argument 1 has length 8 but argument 0 ...").
        with _PLACE_LOCK:
            return jax.device_put(state, self._state_shardings)

    def warmup(self, parallel: bool = True) -> None:
        """Compile every jitted shape (decode, each prefill bucket, row copy), then run each
        once with calls that change nothing (all rows idle / padded). ``parallel``: compile
        them all ahead of time at once on a thread pool first
        (``compile_notice.compile_ahead``), so start-up takes about the longest compile rather
        than their sum (the prefill KV buckets multiply the prefill shapes:
        ``EngineConfig.prefill_kv_buckets``)."""
        c = self.config
        ints = np.zeros_like(self._ints)
        ints[:, STOP:] = -1
        n = c.copy_rows
        # (function, arguments, position of the KV cache among them)
        calls: list[tuple[Any, tuple, int]] = []
        for mode in (GREEDY, SAMPLE):  # top-k/p/min-p (SAMPLE_FILTERED): on first use
            calls.append((self._decode_fn, ((self._state, self._merged), self._cache, ints,
                                            self._floats, np.int32(1), np.bool_(False), mode), 1))
        for chunk, rows, kv in c.prefill_shapes(self.packed_prefill):
            calls.append((self._prefill_fn, (
                self._state, self._cache, np.full((rows,), c.max_batch, np.int32),
                np.zeros((rows, chunk), np.int32),
                np.full((rows, chunk), c.max_length, np.int32), kv), 1))
        calls.append((self._copy_fn, (self._cache, np.zeros((n,), np.int32),
                                      np.full((n,), c.max_batch, np.int32)), 0))
        outs = None
        with warnings.catch_warnings(), compile_notice.quiet():
            warnings.simplefilter("ignore")
            if parallel:
                compile_notice.compile_ahead([(fn, args) for fn, args, _ in calls])
            for fn, args, at in calls:  # the cache is donated: each call gets the last one's
                result = fn(*args[:at], self._cache, *args[at + 1:])
                if fn is self._decode_fn:
                    self._cache, outs, _ = result
                else:
                    self._cache = result
        jax.block_until_ready((self._cache, outs))

    # ------------------------------------------------------------------------- public API
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
        return {"max_length": c.max_length, "max_batch": c.max_batch,
                "vocab_size": self.vocab_size, "max_stop_ids": c.max_stop_ids}

    def validate(self, input_ids: Any, sampling: SamplingParams) -> list[int]:
        """Check a request (raises ``InvalidRequestError``); returns the ids as a list. The
        sampling parameters are checked against ``sampling_limits.py`` with this engine's
        bounds (``n <= max_batch``, ``max_new_tokens <= max_length``, stop ids in the
        vocabulary)."""
        ids = check_input_ids(input_ids, self.vocab_size, self.config.max_length)
        sampling.validate(self.vocab_size, self.sampling_context)
        if len(self._stop_ids(sampling)) > self.config.max_stop_ids:
            raise InvalidRequestError(
                f"at most {self.config.max_stop_ids} stop token ids per request "
                f"(got {len(self._stop_ids(sampling))})")
        if sampling.stop and self.tokenizer is None:
            raise InvalidRequestError("stop strings need a tokenizer; this engine has none")
        return ids

    def submit(self, input_ids: Any, sampling: SamplingParams | None = None,
               session_id: str | None = None, rid: str | None = None
               ) -> concurrent.futures.Future:
        """Queue a request (thread-safe). The future resolves to ``list[GenerateResult]``
        (``sampling.n`` samples). Raises ``InvalidRequestError`` / ``OverloadedError``."""
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
        stop_ids = self._stop_ids(sampling)
        req.seqs = [Seq(req, i, stop_ids) for i in range(sampling.n)]
        if sampling.max_new_tokens == 0:
            future.set_result([self._result(s, "length", None) for s in req.seqs])
            return future
        with self._cv:
            if self._closed:
                raise BackendUnavailableError("the engine is closed")
            if self._error is not None:
                raise BackendUnavailableError(f"the engine failed: {self._error}")
            if rid in self._requests:
                raise InvalidRequestError(f"a request with rid {rid!r} is already running")
            if self._num_waiting + 1 > self.config.max_queue:
                raise OverloadedError(
                    f"admission queue full ({self._num_waiting} requests waiting, "
                    f"max_queue={self.config.max_queue}); retry later")
            self._num_waiting += 1
            self._requests[rid] = req
            self._incoming.append(req)
            self._cv.notify()
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
        with self._cv:
            req = self._requests.get(str(rid))
            if req is None:
                return False
            req.aborted = True
            self._commands.append((lambda: self._abort_request(req),
                                   concurrent.futures.Future()))
            self._cv.notify()
        return True

    def end_session(self, session_id: str) -> None:
        """Free the KV row cached for a finished session (thread-safe, returns at once)."""
        with self._cv:
            if self._closed:
                return
            self._commands.append((lambda: self._slots.forget_session(session_id),
                                   concurrent.futures.Future()))
            self._cv.notify()

    def abort_all(self) -> int:
        with self._cv:
            rids = list(self._requests)
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
        with self._cv:
            self._paused = True
            self._cv.notify()

    def resume(self) -> None:
        with self._cv:
            self._paused = False
            self._cv.notify()

    @property
    def paused(self) -> bool:
        return self._paused

    def _call_in_engine(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._cv:
            if self._closed:
                raise BackendUnavailableError("the engine is closed")
            self._commands.append((fn, future))
            self._cv.notify()
        return future

    def load(self) -> dict[str, int]:
        """Current load: running sequences, waiting requests, free / cached slots."""
        return {"running": len(self._slot_seq), "waiting": self._num_waiting,
                "free_slots": self._slots.num_free, "cached_slots": self._slots.num_cached}

    def close(self) -> None:
        with self._cv:
            if self._closed:
                return
            self._closed = True
            self._cv.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=60)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    # ---------------------------------------------------------------------------- internals
    def _stop_ids(self, sampling: SamplingParams) -> list[int]:
        if sampling.stop_token_ids is not None:
            return list(dict.fromkeys(sampling.stop_token_ids))  # replaces the EOS default
        return [] if sampling.ignore_eos else list(self.eos_token_ids)


EmbeddedBackend = Engine

__all__ = ["Engine", "EngineConfig", "EngineStats", "EmbeddedBackend"]
