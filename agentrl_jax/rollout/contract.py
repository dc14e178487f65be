"""The rollout-backend interface: one async API over the embedded engine and SGLang servers.

Every backend turns token ids into token ids. The RL actor pool calls ``generate`` once per turn
with the full token history of an episode and ``session_id=<episode id>``, so a backend with a
prefix cache (our engine's session slots, SGLang's radix cache) only prefills the new suffix.

Backends are chosen by name through the registry ``ROLLOUT_BACKENDS`` (adding one: a class with
``from_config`` / ``from_run`` and one ``register_backend`` line, docs/EXTENDING.md)::

    backend = create_backend("embedded", model="smollm2", max_batch=32, max_length=4096)
    backend = create_backend("sglang", urls=["http://127.0.0.1:30000"])
    backend = create_backend({"name": "embedded", "model": "smollm2"})   # from a config dict

Logprob semantics (all backends): ``GenerateResult.output_logprobs[i]`` is the log-probability
of ``output_ids[i]`` under the distribution the token was sampled from *after temperature* and
*before* top-k / top-p / min-p truncation, i.e. ``log_softmax(logits / T)[token]``. Greedy
requests (``temperature == 0``) report the untempered ``log_softmax(logits)[token]``.
``output_logprobs_raw`` (when the backend offers it) is always the untempered value. With
``temperature == 1`` and no truncation -- the RL setting -- the two are equal and are exactly the
behaviour policy's logprobs.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
from typing import Any, ClassVar, Mapping, Protocol, Sequence

from agentrl_common.registry import Registry
from agentrl_jax.rollout import sampling_limits as limits

FINISH_REASONS = ("stop", "length", "abort")


class RolloutError(RuntimeError):
    """Base class of rollout errors."""


class InvalidRequestError(RolloutError, ValueError):
    """A malformed request (bad sampling parameters, token ids out of range, prompt too long)."""


class RequestFailedError(RolloutError):
    """One request failed inside the backend (an error in its own processing); the other
    requests in flight were not affected (HTTP 500 naming the request)."""


class OverloadedError(RolloutError):
    """The admission queue is full; retry later (HTTP 503 + Retry-After)."""

    def __init__(self, message: str, retry_after: float = 1.0):
        super().__init__(message)
        self.retry_after = retry_after


class BackendUnavailableError(RolloutError):
    """The backend cannot serve (engine closed, every server unreachable)."""


@dataclasses.dataclass
class SamplingParams:
    """Sampling options, named as SGLang's ``sampling_params``.

    temperature: 0 means greedy (argmax). top_k <= 0 (SGLang uses -1) disables top-k.
    stop_token_ids: ``None`` means the model's EOS ids; an explicit list replaces them (EOS is
    then *not* added implicitly). ``ignore_eos=True`` drops the EOS ids from the default set.
    stop: strings checked on the detokenized output; the text is trimmed before the match (unless
    ``no_stop_trim``) while ``output_ids`` keep the token that completed the match.
    seed: per-request RNG seed; the same seed gives the same samples whatever else is batched.
    n: number of samples of one prompt (they share the prompt's prefill).
    option_count: ``None``, or ``n >= 1``: sample only the first ``n`` option tokens of a
    policy restricted to its option tokens (``models/output_tokens.py``: a turn that lists
    ``n`` options; EOS excluded too); the reported log-probs are of that distribution. Ours
    only: SGLang has no such parameter (its backend refuses it).
    """

    max_new_tokens: int = limits.MAX_NEW_TOKENS.default
    temperature: float = limits.TEMPERATURE.default
    top_p: float = limits.TOP_P.default
    top_k: int = limits.TOP_K.default
    min_p: float = limits.MIN_P.default
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    n: int = limits.N.default
    seed: int | None = None
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    option_count: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def validate(self, vocab_size: int | None = None,
                 context: Mapping[str, Any] | None = None) -> None:
        """Raise ``InvalidRequestError`` naming the parameter and its allowed range
        (``sampling_limits.py``) for the first out-of-range value. ``context``: the engine's
        bounds (``max_length``, ``max_batch``, ``max_stop_ids``, ``vocab_size``; the
        ``vocab_size`` argument is the same as that key)."""
        context = dict(context or {})
        if vocab_size is not None:
            context.setdefault("vocab_size", vocab_size)

        def bad(name: str, msg: str) -> InvalidRequestError:
            return InvalidRequestError(f"sampling_params: {name} {msg}")

        for limit in (limits.MAX_NEW_TOKENS, limits.TEMPERATURE, limits.TOP_P, limits.TOP_K,
                      limits.MIN_P, limits.N):
            problem = limit.problem(getattr(self, limit.name), context)
            if problem is not None:
                raise bad(limit.name, problem)
        if self.seed is not None:
            problem = limits.SEED.problem(self.seed, context)
            if problem is not None:
                raise bad("seed", problem)
        if self.option_count is not None:
            if context.get("option_tokens") == 0:
                raise bad("option_count", "needs a policy restricted to its option tokens "
                          "(model.output_tokens); this one samples every token")
            problem = limits.OPTION_COUNT.problem(self.option_count, context)
            if problem is not None:
                raise bad("option_count", problem)
        if self.stop is not None:
            problem = limits.stop_problem(self.stop)
            if problem is not None:
                raise bad("stop", problem)
        if self.stop_token_ids is not None:
            problem = limits.stop_token_ids_problem(self.stop_token_ids, context)
            if problem is not None:
                raise bad("stop_token_ids", problem)
        for name in ("ignore_eos", "skip_special_tokens", "no_stop_trim"):
            if not isinstance(getattr(self, name), bool):
                raise bad(name, f"must be a boolean (got {getattr(self, name)!r})")

    def to_sglang(self) -> dict[str, Any]:
        """The ``sampling_params`` dictionary SGLang's ``/generate`` accepts."""
        out: dict[str, Any] = {"max_new_tokens": self.max_new_tokens,
                               "temperature": self.temperature, "top_p": self.top_p,
                               "top_k": self.top_k, "min_p": self.min_p, "n": self.n,
                               "ignore_eos": self.ignore_eos,
                               "skip_special_tokens": self.skip_special_tokens,
                               "no_stop_trim": self.no_stop_trim}
        if self.stop:
            out["stop"] = list(self.stop)
        if self.stop_token_ids is not None:
            out["stop_token_ids"] = list(self.stop_token_ids)
        if self.seed is not None:
            out["sampling_seed"] = self.seed
        if self.option_count is not None:  # our rollout servers only (SGLangBackend)
            out["option_count"] = self.option_count
        return out


@dataclasses.dataclass
class GenerateResult:
    """One generated sample.

    output_ids include the token that ended generation (EOS / stop token), and its logprob, so
    the sequence the policy actually sampled can be trained on. ``text`` is the detokenized
    output (stop token and stop string trimmed, as SGLang does) or ``None`` without a tokenizer.
    cached_tokens: prompt tokens whose KV came from a cache (prefix reuse) instead of prefill.
    """

    output_ids: list[int]
    output_logprobs: list[float]
    finish_reason: str
    matched_stop: int | str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_logprobs_raw: list[float] | None = None
    text: str | None = None
    rid: str | None = None
    weight_version: str | None = None
    latency_s: float = 0.0

    @property
    def completion_tokens(self) -> int:
        return len(self.output_ids)

    def finish_reason_json(self) -> dict[str, Any]:
        """SGLang's ``meta_info.finish_reason`` object."""
        if self.finish_reason == "stop":
            return {"type": "stop", "matched": self.matched_stop}
        if self.finish_reason == "length":
            return {"type": "length", "length": len(self.output_ids)}
        return {"type": "abort", "message": "aborted"}


class WeightSource(Protocol):
    """A learner's current weights in the forms a backend loads (``sync_weights``; the
    trainer's ``training/runtime/policy.py::LearnerWeights``)."""

    is_main: bool  # the main process of a multi-process run (True with one process)

    def arrays(self) -> Any:
        """The parameter arrays on this host's devices (an engine in this process)."""

    def policy(self) -> Any:
        """The policy model (servers load an export of it); with several processes a
        collective that every process calls."""

    def synced(self, version: int) -> None:
        """Called once this process's backend has the weights (a barrier across processes)."""


class RolloutBackend(abc.ABC):
    """Async interface of a rollout backend (embedded engine, SGLang servers, ...)."""

    name: str = "base"
    #: ``make_backend`` builds an ``EngineConfig`` and device groups for it (``BackendBuild``):
    #: a JAX engine on this job's devices; False: it reaches servers at ``rollout.urls``
    uses_local_engine: ClassVar[bool] = False

    @classmethod
    def from_config(cls, **options: Any) -> "RolloutBackend":
        """Registry factory of :func:`create_backend`: the backend built from keyword options.
        Default: ``cls(**options)``."""
        return cls(**options)

    @classmethod
    def from_run(cls, build: BackendBuild) -> "RolloutBackend":
        """Registry factory of the training job (``training/runtime/services.make_backend``): the
        backend for this run's policy, engine config / devices or server URLs."""
        raise NotImplementedError(f"{cls.__name__} cannot be built for a training run "
                                  "(it defines no from_run)")
    #: servers this run did not start: every process of a multi-process run shares them (one
    #: export, loaded by the main process), and they keep the weights loaded last when the
    #: trainer restarts
    external_servers: bool = False
    #: ``generate`` / ``generate_n`` also take ``input_ids`` as an ``array.array`` of machine
    #: integers (an episode's context kept as ``array("i")``: ``agent/context_ids.py``) and
    #: keep nothing of it past the call, since the caller extends it for its next turn (the
    #: embedded engine: ``engine/prompt_ids.check_input_ids`` reads it in place and copies).
    #: Others get a list.
    takes_id_arrays: bool = False

    @abc.abstractmethod
    async def generate(self, input_ids: list[int], sampling: SamplingParams | None = None,
                       session_id: str | None = None, rid: str | None = None) -> GenerateResult:
        """Generate one sample continuing ``input_ids`` (requires ``sampling.n == 1``)."""

    async def generate_n(self, input_ids: list[int], sampling: SamplingParams | None = None,
                         session_id: str | None = None, rid: str | None = None
                         ) -> list[GenerateResult]:
        """``sampling.n`` samples of one prompt. Default: n independent ``generate`` calls
        (seeds ``seed + i`` when a seed is given); backends override it to share the prefill."""
        sampling = sampling or SamplingParams()
        calls = []
        for i in range(sampling.n):
            s = dataclasses.replace(sampling, n=1,
                                    seed=None if sampling.seed is None else sampling.seed + i)
            calls.append(self.generate(input_ids, s, session_id=session_id if i == 0 else None,
                                       rid=None if rid is None else f"{rid}-{i}"))
        return list(await asyncio.gather(*calls))

    @abc.abstractmethod
    async def update_weights(self, params: Any = None, *, path: str | None = None,
                             version: str | None = None) -> None:
        """Load new policy weights: in-memory ``params`` (an nnx model / State / param pytree)
        or a HF safetensors directory ``path``. Invalidates prefix caches."""

    async def sync_weights(self, weights: WeightSource, version: int) -> None:
        """Load a learner's weights as ``version`` (the trainer calls it after each update):
        by default its policy model (servers load an export of it; external servers from the
        main process only), then ``weights.synced(version)``. An engine in the trainer's
        process overrides it to take the arrays themselves."""
        policy = weights.policy()  # every process takes part (a collective)
        if weights.is_main or not self.external_servers:
            await self.update_weights(policy, version=str(version))
        weights.synced(version)

    @abc.abstractmethod
    async def health(self) -> bool:
        """True when the backend can serve requests."""

    async def abort(self, rid: str) -> None:
        """Abort a running request (its result comes back with finish_reason ``abort``)."""

    async def flush_cache(self) -> None:
        """Drop cached prefixes."""

    async def release_kv_cache(self) -> int:
        """Free the KV cache while no request runs (between a rollout and the next one, e.g.
        during the learner's update on the same accelerators); every cached prefix goes with
        it, and the next request allocates the cache again. Returns the bytes freed. Default:
        nothing held here (0)."""
        return 0

    async def resume_kv_cache(self) -> int:
        """Allocate a released KV cache again before the next rollout (a server that cannot
        serve while released, as SGLang's memory saver, needs this); returns the bytes
        allocated. Default: nothing to do (0)."""
        return 0

    def end_session(self, session_id: str) -> None:
        """A finished episode: its session's cached prefix and routing pin may go (so that a
        live session's prefix is not evicted in its place). Returns at once; safe to call from
        the event loop. Default: nothing to free."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Release resources (engine thread, HTTP sessions, launched servers)."""

    async def __aenter__(self) -> "RolloutBackend":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


class BatchedSamplesBackend(RolloutBackend):
    """For backends whose native call returns ``n`` samples (``generate_n``): ``generate`` is
    ``generate_n`` with ``n == 1``."""

    async def generate(self, input_ids: list[int], sampling: SamplingParams | None = None,
                       session_id: str | None = None, rid: str | None = None) -> GenerateResult:
        sampling = sampling or SamplingParams()
        if sampling.n != 1:
            raise InvalidRequestError("generate() takes n == 1; use generate_n() for n > 1")
        return (await self.generate_n(input_ids, sampling, session_id, rid))[0]

    @abc.abstractmethod
    async def generate_n(self, input_ids: list[int], sampling: SamplingParams | None = None,
                         session_id: str | None = None, rid: str | None = None
                         ) -> list[GenerateResult]:
        """``sampling.n`` samples of one prompt, sharing its prefill."""


# ------------------------------------------------------------------------------------ registry
@dataclasses.dataclass(frozen=True)
class BackendBuild:
    """What the training job hands a backend's ``from_run`` (``training/runtime/services.make_backend``).

    model: the policy (a ``CausalLM``). tokenizer: its tokenizer. model_path: where it was
    loaded from (None: built in memory). urls: server URLs (``rollout.urls``). api_key:
    ``rollout.api_key`` (None: the backend's default). engine_config: the ``EngineConfig`` of each
    local engine replica and device_groups: one tuple of ``jax.Device`` per replica -- both set
    only for backends with ``uses_local_engine``.
    """

    model: Any
    tokenizer: Any = None
    model_path: str | None = None
    urls: tuple[str, ...] = ()
    api_key: str | None = None
    engine_config: Any = None
    device_groups: tuple[tuple[Any, ...], ...] = ()


#: backend name -> a class with ``from_config(**options)`` (:func:`create_backend`),
#: ``from_run(BackendBuild)`` (the training job) and ``uses_local_engine``
#: (``RolloutBackend`` gives the defaults). Lazy entries import their module on first use, so
#: listing the names (config validation) imports neither JAX nor aiohttp.
ROLLOUT_BACKENDS: Registry[Any] = Registry("rollout backend", expected=type)
ROLLOUT_BACKENDS.register_lazy("embedded", "agentrl_jax.rollout.backends.embedded:EmbeddedEngines")
ROLLOUT_BACKENDS.register_lazy("engine_servers",
                               "agentrl_jax.rollout.backends.engine_servers:EngineServers")
ROLLOUT_BACKENDS.register_lazy("sglang", "agentrl_jax.rollout.backends.sglang:SGLangBackend")


def register_backend(name: str, backend: type | str, *, replace: bool = False) -> None:
    """Register a backend class under ``name`` (or its ``"package.module:Class"`` path, imported
    on first use); ``DuplicateNameError`` for a taken name unless ``replace``."""
    if isinstance(backend, str):
        ROLLOUT_BACKENDS.register_lazy(name, backend, replace=replace)
    else:
        ROLLOUT_BACKENDS.register(name, backend, replace=replace)


def available_backends() -> list[str]:
    """The registered backend names, sorted (imports no backend module)."""
    return ROLLOUT_BACKENDS.names()


def create_backend(name_or_config: str | dict[str, Any], **config: Any) -> RolloutBackend:
    """Build a backend by registry name (``embedded``, ``engine_servers``, ``sglang``) or from a
    config dict whose ``name`` (or ``backend``) key selects it; remaining keys go to its
    ``from_config``. An unknown name raises ``UnknownNameError`` (a ``ValueError``)."""
    if isinstance(name_or_config, dict):
        config = {**name_or_config, **config}
        name = config.pop("name", None) or config.pop("backend", None)
        if name is None:
            raise ValueError("backend config needs a 'name' key "
                             f"(one of {', '.join(available_backends())})")
    else:
        name = name_or_config
    return ROLLOUT_BACKENDS.get(name).from_config(**config)


__all__ = ["SamplingParams", "GenerateResult", "RolloutBackend", "RolloutError",
           "RequestFailedError",
           "InvalidRequestError", "OverloadedError", "BackendUnavailableError",
           "register_backend", "create_backend", "available_backends",
           "FINISH_REASONS"]
