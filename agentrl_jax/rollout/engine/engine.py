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
* **Decode attention** reads only each slot's valid KV on GPUs (``decode_attention.py``).
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
import time
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
from agentrl_jax.rollout.backends.base import (BackendUnavailableError, BatchedSamplesBackend,
                                      GenerateResult, InvalidRequestError, OverloadedError,
                                      RequestFailedError, RolloutError, SamplingParams,
                                      WeightSource,
                                      check_input_ids)
from agentrl_jax.rollout.engine.compiled import (ACT, CNT, IDX, KEY0, KEY1, MINP, POS, REM, STOP, TEMP,
                                          TOK, TOPK, TOPP, compiled_functions)
from agentrl_jax.rollout.engine.decode_attention import ragged_tiling
from agentrl_jax.rollout.engine.engine_config import EngineConfig
from agentrl_jax.rollout.engine.forward import (DENSE, FUSED, FUSED_INTERPRET, RAGGED, RAGGED_INTERPRET,
                                         new_cache)
from agentrl_jax.rollout.engine.fused_decode_attention import unsupported_shape
from agentrl_jax.rollout.engine.placement import EnginePlacement, to_state
from agentrl_jax.rollout.engine.requests import (DECODE, DONE, FORK_WAIT, PREFILL, EngineStats, Request,
                                          Seq)
from agentrl_jax.rollout.engine.sampling import GREEDY, SAMPLE, sampling_mode, seed_to_key
from agentrl_jax.rollout.engine.slots import SlotTable
from agentrl_jax.rollout.engine.stop_strings import find_stop, may_complete_mask, slots_to_check

log = logging.getLogger(__name__)
# CPU backends cannot always reuse donated buffers; that is harmless.
warnings.filterwarnings("ignore", message="Some donated buffers were not usable")


def _nbytes(tree: Any) -> int:
    return sum(int(x.nbytes) for x in jax.tree.leaves(tree))


class Engine(BatchedSamplesBackend):
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
        self.decode_attention = self._resolve_decode_attention()
        self.decode_gemm = c.resolved_decode_gemm(self.placement.platform,
                                                  self.placement.tensor_parallel)
        self._decode_fn, self._prefill_fn, self._copy_fn, self._merge_fn = compiled_functions(
            self.graphdef, c.max_batch, c.max_length, c.decode_steps, c.max_stop_ids,
            c.kv_layout, self.decode_attention, self.decode_gemm,
            one_pass_sampler=self.placement.platform == "gpu")
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

    def _resolve_decode_attention(self) -> str:
        """The decode attention this engine compiles: ``ragged_fused`` / ``ragged`` (the Pallas
        kernels; in the Pallas interpreter off GPUs, for tests) or ``dense``. The kernels need
        the head-major cache, one device (they are not partitioned over a tensor-parallel
        group) and a ``max_length`` divisible by 16; otherwise dense. The fused kernel also
        needs at most 16 query heads per KV head and a head dim divisible by 32; otherwise
        ragged."""
        c, platform = self.config, self.placement.platform
        choice = c.resolved_decode_attention(platform)
        if choice not in (RAGGED, FUSED):
            return DENSE
        why = ("the seq-major cache layout" if c.kv_layout != "bksd" else
               "tensor parallelism" if self.placement.tensor_parallel > 1 else
               f"max_length={c.max_length} (not a multiple of 16)"
               if ragged_tiling(c.max_length) is None else None)
        if why is not None:
            if c.decode_attention in (RAGGED, FUSED):
                log.warning("%s decode attention is not available with %s; using dense",
                            c.decode_attention, why)
            return DENSE
        mc = self.model_config
        if choice == FUSED and unsupported_shape(mc.num_heads, mc.num_kv_heads, mc.head_dim):
            choice = RAGGED
        if choice == FUSED:
            return FUSED if platform == "gpu" else FUSED_INTERPRET
        return RAGGED if platform == "gpu" else RAGGED_INTERPRET

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
        # arrays on other devices (a learner sharded over every GPU) are transferred.
        return jax.device_put(state, self._state_shardings)

    def warmup(self) -> None:
        """Compile every jitted shape (decode, each prefill bucket, row copy) with calls that
        change nothing (all rows idle / padded)."""
        c = self.config
        ints = np.zeros_like(self._ints)
        ints[:, STOP:] = -1
        with warnings.catch_warnings(), compile_notice.quiet():
            warnings.simplefilter("ignore")
            for mode in (GREEDY, SAMPLE):  # top-k/p/min-p (SAMPLE_FILTERED): on first use
                self._cache, outs, _ = self._decode_fn((self._state, self._merged),
                                                       self._cache, ints, self._floats,
                                                       np.int32(1), np.bool_(False), mode)
            for chunk, rows, kv in c.prefill_shapes():
                self._cache = self._prefill_fn(
                    self._state, self._cache, np.full((rows,), c.max_batch, np.int32),
                    np.zeros((rows, chunk), np.int32),
                    np.full((rows, chunk), c.max_length, np.int32), kv)
            n = c.copy_rows
            self._cache = self._copy_fn(self._cache, np.zeros((n,), np.int32),
                                        np.full((n,), c.max_batch, np.int32))
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

    def update_weights_sync(self, params: Any = None, *, path: str | None = None,
                            version: str | None = None, flush_cache: bool = True,
                            abort_all: bool = False) -> str:
        """Swap the weights between two engine steps (blocking). ``params``: a CausalLM,
        nnx.State or pure dict -- used without a copy unless ``weights_dtype`` asks for a cast;
        ``path``: a HF safetensors directory. Running requests continue with the new weights
        (their earlier KV was computed with the old ones) unless ``abort_all``. Returns the new
        weight version."""
        if (params is None) == (path is None):
            raise ValueError("pass exactly one of params or path")
        if path is not None:
            from agentrl_jax.models.safetensors_io import load_safetensors_model
            params, cfg = load_safetensors_model(path)
            self._check_compatible(cfg)
        state = self._prepare_state(params)
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
                             abort_all: bool = False) -> str:
        return await asyncio.to_thread(self.update_weights_sync, params, path=path,
                                       version=version, flush_cache=flush_cache,
                                       abort_all=abort_all)

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

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._closed and not self._commands and (
                        self._paused or not (self._incoming or self._waiting or self._slot_seq
                                             or self._prefill_queue or self._fork_ready)):
                    t0 = time.perf_counter()
                    self._cv.wait()
                    self.stats.idle_time_s += time.perf_counter() - t0
                if self._closed:
                    break
                commands, self._commands = self._commands, []
                incoming, self._incoming = self._incoming, []
            self._waiting.extend(incoming)
            for fn, future in commands:
                try:
                    future.set_result(fn())
                except BaseException as e:  # noqa: BLE001 -- reported to the caller
                    future.set_exception(e)
            if self._paused:
                continue
            t0 = time.perf_counter()
            try:
                self._step()
            except Exception as e:  # noqa: BLE001 -- never let the engine thread die
                log.exception("engine step failed")
                self._recover(e)
            self.stats.step_time_s += time.perf_counter() - t0
        self._shutdown()

    def _step(self) -> None:
        if self._cache is None:  # released (release_kv_cache) while the engine was idle
            if not self._waiting:  # woken by a command only: stay released
                return
            self._reallocate_cache()
        self._admit()
        for _ in range(self.config.prefill_calls_per_step):  # prefill first, bounded
            if not self._prefill_queue:
                break
            self._run_prefill()
        if self._fork_ready:
            self._run_forks()
        if any(s.state == DECODE for s in self._slot_seq.values()):
            self._run_decode()

    # ----------------------------------------------------------------------- admission
    def _admit(self) -> None:
        while self._waiting:
            req = self._waiting[0]
            if req.aborted:
                self._waiting.popleft()
                self._dequeued()
                for seq in req.seqs:
                    self._isolated(req, self._finish, seq, "abort", None)
                continue
            n = req.sampling.n
            if self._slots.available < n:
                return
            self._waiting.popleft()
            self._dequeued()
            self._isolated(req, self._admit_one, req)

    def _admit_one(self, req: Request) -> None:
        """Give a request its slots and queue its prefill (or activate it at once)."""
        c = self.config
        n = req.sampling.n
        self.stats.requests += 1
        ids = np.asarray(req.input_ids, np.int32)
        L = len(req.input_ids)
        first = req.seqs[0]
        session = req.session_id if c.session_cache else None
        slot, reuse = self._slots.acquire_for_session(session, ids, max_reuse=L - 1)
        self._bind(first, slot)
        first.cursor = first.kv_len = first.cached_tokens = reuse
        self.stats.prompt_tokens += L * n
        self.stats.cached_tokens += reuse
        for seq in req.seqs[1:]:
            self._bind(seq, self._slots.acquire())
            seq.state = FORK_WAIT
            seq.cached_tokens = L - 1
            self.stats.cached_tokens += L - 1
            first.forks.append(seq)
        key = tuple(req.input_ids) if c.share_prompts and reuse < L - 1 else None
        leader = self._prompt_leaders.get(key) if key is not None and n == 1 else None
        if leader is not None and (leader.state != PREFILL or leader.slot is None):
            leader = None  # ended without its prefill (its followers were re-queued then)
        if leader is not None:  # the same prompt is being prefilled: wait, copy its row
            first.state = FORK_WAIT
            first.cached_tokens = L - 1
            self.stats.cached_tokens += L - 1 - reuse
            self.stats.shared_prompts += 1
            leader.forks.append(first)
        elif reuse < L - 1:
            first.state = PREFILL
            self.stats.prefill_tokens += L - 1 - reuse
            self._prefill_queue.append(first)
            if key is not None:
                first.prompt_key = key
                self._prompt_leaders[key] = first
        else:
            self._prefill_done(first)
        self.stats.prefill_tokens += n  # the last prompt token, fed by the first decode step

    def _drop_leader(self, seq: Seq) -> None:
        """``seq`` no longer prefills a prompt others may share (its prefill ended)."""
        key, seq.prompt_key = seq.prompt_key, None
        if key is not None and self._prompt_leaders.get(key) is seq:
            del self._prompt_leaders[key]

    def _orphan_followers(self, seq: Seq) -> None:
        """``seq`` ends before its prefill did: the sequences of other requests that waited to
        copy its row prefill their prompts themselves."""
        self._drop_leader(seq)
        own = []
        for f in seq.forks:
            if f.req is seq.req:
                own.append(f)
            elif f.state == FORK_WAIT and f.slot is not None:
                f.state = PREFILL
                f.cursor = f.kv_len = f.cached_tokens = 0
                self.stats.prefill_tokens += f.prompt_len - 1
                self._prefill_queue.append(f)
        seq.forks = own

    def _dequeued(self) -> None:
        with self._cv:
            self._num_waiting -= 1

    def _bind(self, seq: Seq, slot: int) -> None:
        seq.slot = slot
        self._slot_seq[slot] = seq
        self._ints[slot, ACT] = 0

    def _prefill_done(self, seq: Seq) -> None:
        self._drop_leader(seq)
        if seq.forks:
            self._fork_ready.append(seq)
            seq.state = FORK_WAIT
        else:
            self._activate(seq)

    def _activate(self, seq: Seq) -> None:
        """Make a prefilled sequence decodable: its first decode step feeds the last prompt
        token at position L-1 and samples the first new token."""
        req, s, sp = seq.req, seq.slot, seq.req.sampling
        L = seq.prompt_len
        seq.state = DECODE
        seq.kv_len = L - 1
        row = self._ints[s]
        row[TOK], row[POS], row[ACT] = req.input_ids[-1], L - 1, 1
        row[REM] = min(sp.max_new_tokens, self.config.max_length - L)
        # top-k of the vocabulary size or more keeps every token: the same as off (0)
        row[TOPK] = sp.top_k if 0 < sp.top_k < self.vocab_size else 0
        row[CNT] = 0
        row[KEY0:KEY1 + 1] = np.array(seed_to_key(req.seed), np.uint32).view(np.int32)
        row[IDX] = seq.index
        row[STOP:] = -1
        row[STOP:STOP + len(seq.stop_ids)] = seq.stop_ids
        self._floats[s] = (sp.temperature, sp.top_p, sp.min_p)
        self._out_len[s] = 0
        self._has_stop_str[s] = bool(sp.stop)
        self._stop_masks[s] = (may_complete_mask(self.tokenizer, sp.stop, sp.skip_special_tokens)
                               if sp.stop else None)

    # ------------------------------------------------------------------------- prefill
    def _run_prefill(self) -> None:
        c = self.config
        queue = self._prefill_queue
        best = None
        for chunk in c.chunk_buckets:  # the bucket that prefills the most tokens per call
            rows = c.prefill_rows(chunk)
            work = sum(min(chunk, s.prompt_len - 1 - s.cursor) for s in queue[:rows])
            if best is None or work > best[0]:
                best = (work, chunk, rows)
        _, chunk, rows = best
        batch = queue[:rows]
        slot_ids = np.full((rows,), c.max_batch, np.int32)
        tokens = np.zeros((rows, chunk), np.int32)
        positions = np.full((rows, chunk), c.max_length, np.int32)
        counts = []
        for r, seq in enumerate(batch):
            n = min(chunk, seq.prompt_len - 1 - seq.cursor)
            if not self._isolated(seq.req, self._prefill_row, seq, n, tokens[r], positions[r]):
                tokens[r], positions[r], n = 0, c.max_length, 0  # a padded row: writes nothing
            else:
                slot_ids[r] = seq.slot
            counts.append(n)
        kv = c.prefill_kv(chunk, max(seq.cursor + n for seq, n in zip(batch, counts)))
        t0 = time.perf_counter()
        self._cache = self._prefill_fn(self._state, self._cache, slot_ids, tokens, positions, kv)
        self.stats.prefill_calls += 1
        done = []
        for seq, n in zip(batch, counts):
            if seq.state == DONE:  # failed while its row was built
                continue
            seq.cursor += n
            seq.kv_len = seq.cursor
            if seq.cursor >= seq.prompt_len - 1:
                done.append(seq)
        self._prefill_queue = [s for s in queue
                               if s.state != DONE and s.cursor < s.prompt_len - 1]
        for seq in done:
            self._isolated(seq.req, self._prefill_done, seq)
        jax.block_until_ready(self._cache.keys[0])
        self.stats.prefill_time_s += time.perf_counter() - t0

    @staticmethod
    def _prefill_row(seq: Seq, n: int, tokens: np.ndarray, positions: np.ndarray) -> None:
        """Write a sequence's next ``n`` prompt tokens and positions into one prefill row."""
        tokens[:n] = seq.req.input_ids[seq.cursor:seq.cursor + n]
        positions[:n] = np.arange(seq.cursor, seq.cursor + n)

    def _run_forks(self) -> None:
        """Copy the prefilled prompt row of each ``n > 1`` request to its other samples."""
        c = self.config
        pairs = []
        for seq in self._fork_ready:  # (a sequence of another request may have ended waiting)
            pairs.extend((seq.slot, f.slot) for f in seq.forks
                         if f.state == FORK_WAIT and f.slot is not None)
        for i in range(0, len(pairs), c.copy_rows):
            part = pairs[i:i + c.copy_rows]
            src = np.zeros((c.copy_rows,), np.int32)
            dst = np.full((c.copy_rows,), c.max_batch, np.int32)
            for j, (a, b) in enumerate(part):
                src[j], dst[j] = a, b
            self._cache = self._copy_fn(self._cache, src, dst)
            self.stats.copy_calls += 1
        for seq in list(self._fork_ready):
            if seq.state == DONE:
                continue
            self._isolated(seq.req, self._activate, seq)
            for f in seq.forks:
                if f.state == FORK_WAIT:
                    self._isolated(f.req, self._activate, f)
        self._fork_ready = []

    # -------------------------------------------------------------------------- decode
    def _run_decode(self) -> None:
        c = self.config
        waiting_for_slot = bool(self._waiting) and self._slots.available < \
            self._waiting[0].sampling.n
        act = self._ints[:, ACT] > 0
        f = self._floats
        mode = sampling_mode(np.where(act, f[:, TEMP], 0.0), self._ints[:, TOPK], f[:, TOPP],
                             f[:, MINP])
        t0 = time.perf_counter()
        self._cache, outs, steps = self._decode_fn(
            (self._state, self._merged), self._cache, self._ints, self._floats,
            np.int32(c.decode_steps),
            np.bool_(waiting_for_slot), mode)
        toks, lps, raws, valid, steps = jax.device_get((*outs, steps))
        self.stats.decode_time_s += time.perf_counter() - t0
        steps = int(steps)
        self.stats.decode_calls += 1
        self.stats.decode_steps += steps
        # Append the new tokens to the per-slot output buffers: one vectorised op per step.
        for j in range(steps):
            rows = np.flatnonzero(valid[j])
            if rows.size == 0:
                break
            n = self._out_len[rows]
            self._out_tok[rows, n] = toks[j, rows]
            self._out_lp[rows, n] = lps[j, rows]
            self._out_raw[rows, n] = raws[j, rows]
            self._out_len[rows] = n + 1
        counts = valid[:steps].sum(axis=0)
        active = np.flatnonzero(counts)
        if active.size == 0:
            return
        n = counts[active]
        last = toks[n - 1, active]
        ints = self._ints
        ints[active, TOK] = last
        ints[active, POS] += n
        ints[active, REM] -= n
        ints[active, CNT] += n
        total = int(n.sum())
        self.stats.decode_slot_steps += total
        self.stats.generated_tokens += total
        stop_hit = (ints[active, STOP:] == last[:, None]).any(axis=1)
        length_hit = ints[active, REM] <= 0
        check = self._has_stop_str[active]  # stop strings: only if a new token may complete one
        if check.any():
            try:
                check[check] = slots_to_check(toks[:steps], valid[:steps], active[check],
                                              self._stop_masks)
            except Exception:  # noqa: BLE001 -- check each such slot alone (_after_decode)
                log.exception("stop-string pre-check failed; checking every slot")
        attention = active[stop_hit | length_hit | check]
        for slot in attention.tolist():  # only slots that (may) finish need Python work
            seq = self._slot_seq.get(slot)
            if seq is None or seq.state != DECODE:
                continue
            self._isolated(seq.req, self._after_decode, seq)

    def _after_decode(self, seq: Seq) -> None:
        """Finish a decoding sequence if its last token is a stop id, its output contains a
        stop string, or its token budget is spent."""
        slot, ints = seq.slot, self._ints
        tok = int(ints[slot, TOK])
        if tok in seq.stop_set:
            self._finish(seq, "stop", tok)
        elif seq.req.sampling.stop and self._check_stop_strings(seq):
            pass  # finished inside
        elif ints[slot, REM] <= 0:
            self._finish(seq, "length", None)

    def _check_stop_strings(self, seq: Seq) -> bool:
        sp, slot = seq.req.sampling, seq.slot
        length = int(self._out_len[slot])
        hit = find_stop(self.tokenizer, self._out_tok[slot, :length], seq.stop_checked,
                        sp.stop or [], sp.skip_special_tokens, self._stop_masks[slot])
        if hit is None:
            seq.stop_checked = length
            return False
        j, text, index, matched = hit
        self._out_len[slot] = j + 1  # drop the tokens decoded after the match
        seq.stop_text = text if sp.no_stop_trim else text[:index]
        self._finish(seq, "stop", matched)
        return True

    # ------------------------------------------------------------------------- finishing
    def _abort_request(self, req: Request) -> None:
        if req.rid not in self._requests:
            return
        if req in self._waiting:
            self._waiting.remove(req)
            self._dequeued()
        for seq in req.seqs:
            if seq.state != DONE:
                self._isolated(req, self._finish, seq, "abort", None)

    def _finish(self, seq: Seq, reason: str, matched: int | str | None) -> None:
        if seq.state == DONE:
            return
        req = seq.req
        if seq.state == PREFILL:
            self._orphan_followers(seq)
        if seq.state == PREFILL and seq in self._prefill_queue:
            self._prefill_queue.remove(seq)
        if seq in self._fork_ready:
            self._fork_ready.remove(seq)
        was_decoding = seq.state == DECODE
        seq.state = DONE
        if seq.slot is not None:
            slot = seq.slot
            if was_decoding:  # collect the output from the slot buffers
                length = int(self._out_len[slot])
                seq.out_ids = self._out_tok[slot, :length].tolist()
                seq.logprobs = self._out_lp[slot, :length].tolist()
                seq.logprobs_raw = self._out_raw[slot, :length].tolist()
                seq.kv_len = min(int(self._ints[slot, POS]), seq.prompt_len + length)
            self._ints[slot, ACT] = 0
            self._has_stop_str[slot] = False
            self._slot_seq.pop(slot, None)
            session = req.session_id if (self.config.session_cache and seq.index == 0) else None
            tokens = None
            if session is not None and seq.kv_len > 0:
                full = req.input_ids + seq.out_ids
                tokens = np.asarray(full[:min(seq.kv_len, len(full))], np.int32)
            self._slots.release(slot, session, tokens)
            seq.slot = None
        if reason == "abort":
            self.stats.aborted += 1
        req.results[seq.index] = self._result(seq, reason, matched)
        if all(r is not None for r in req.results):
            with self._cv:
                self._requests.pop(req.rid, None)
            if not req.future.done():
                try:
                    req.future.set_result(list(req.results))
                except concurrent.futures.InvalidStateError:
                    pass

    def _result(self, seq: Seq, reason: str, matched: int | str | None) -> GenerateResult:
        req, sp = seq.req, seq.req.sampling
        text = None
        if self.tokenizer is not None:
            if seq.stop_text is not None:
                text = seq.stop_text
            else:
                ids = seq.out_ids
                if reason == "stop" and isinstance(matched, int) and not sp.no_stop_trim:
                    ids = ids[:-1]
                text = self.tokenizer.decode(ids, skip_special_tokens=sp.skip_special_tokens)
        return GenerateResult(
            output_ids=list(seq.out_ids), output_logprobs=list(seq.logprobs),
            finish_reason=reason, matched_stop=matched, prompt_tokens=seq.prompt_len,
            cached_tokens=seq.cached_tokens, output_logprobs_raw=list(seq.logprobs_raw),
            text=text, rid=req.rid, weight_version=self.weight_version,
            latency_s=time.perf_counter() - req.created)

    # ------------------------------------------------------------------- fault isolation
    def _isolated(self, req: Request, fn: Callable[..., Any], *args: Any) -> bool:
        """``fn(*args)``, host-side work of ``req`` alone; if it raises, ``req`` fails (and
        only it: ``_fail_request``). Returns whether it succeeded."""
        try:
            fn(*args)
            return True
        except Exception as e:  # noqa: BLE001 -- reported to the request's caller
            self._fail_request(req, e)
            return False

    def _fail_request(self, req: Request, error: BaseException) -> None:
        """Fail one request after an error in its own host-side work; every other request
        goes on. Its sequences leave the queues and their slots (no prefix is cached from
        them: their KV may be incomplete); its future gets the error: an
        ``InvalidRequestError`` as it is (HTTP 400), anything else as a
        ``RequestFailedError`` naming the request and the cause (HTTP 500)."""
        if isinstance(error, InvalidRequestError):
            exc: Exception = error
            log.warning("request %s refused in the engine: %s", req.rid, error)
        else:
            exc = RequestFailedError(f"request {req.rid!r} failed in the engine (the other "
                                     f"requests go on): {type(error).__name__}: {error}")
            log.error("request %s failed alone: %s: %s", req.rid, type(error).__name__, error,
                      exc_info=error)
        with self._cv:
            self._requests.pop(req.rid, None)
        if req in self._waiting:
            self._waiting.remove(req)
            self._dequeued()
        for seq in req.seqs:
            if seq.state == PREFILL:
                self._orphan_followers(seq)
            if seq in self._prefill_queue:
                self._prefill_queue.remove(seq)
            if seq in self._fork_ready:
                self._fork_ready.remove(seq)
            if seq.slot is not None:
                slot = seq.slot
                self._ints[slot, ACT] = 0
                self._has_stop_str[slot] = False
                self._stop_masks[slot] = None
                if self._slot_seq.get(slot) is seq:
                    del self._slot_seq[slot]
                self._slots.release(slot)
                seq.slot = None
            seq.state = DONE
        if not req.future.done():
            try:
                req.future.set_exception(exc)
            except concurrent.futures.InvalidStateError:
                pass

    def _recover(self, error: BaseException) -> None:
        """After a failed device call (or an error in the engine's shared bookkeeping, which no
        single request explains): fail every in-flight request, reset the cache."""
        message = f"{type(error).__name__}: {error}"
        with self._cv:
            requests = list(self._requests.values())
            self._requests.clear()
            self._num_waiting = 0
        for req in requests:
            if not req.future.done():
                req.future.set_exception(RolloutError(f"engine step failed: {message}"))
        self._waiting.clear()
        self._prefill_queue, self._fork_ready = [], []
        self._prompt_leaders.clear()
        self._slot_seq.clear()
        self._ints[:, :STOP] = 0
        self._has_stop_str[:] = False
        self._slots = SlotTable(self.config.max_batch)
        try:
            self._cache = self._new_cache()
        except Exception as e:  # noqa: BLE001
            self._error = f"cannot reallocate the KV cache after {message}: {e}"

    def _shutdown(self) -> None:
        with self._cv:
            requests = list(self._requests.values())
            self._requests.clear()
            commands, self._commands = self._commands, []
        for req in requests:
            if not req.future.done():
                req.future.set_exception(BackendUnavailableError("the engine was closed"))
        for _, future in commands:
            if not future.done():
                future.set_exception(BackendUnavailableError("the engine was closed"))


EmbeddedBackend = Engine

__all__ = ["Engine", "EngineConfig", "EngineStats", "EmbeddedBackend"]
