"""SGLang-compatible HTTP server over the embedded engine (aiohttp).

Follows the HTTP API of SGLang 0.5.x (``sglang.srt.entrypoints.http_server``): ``/generate``,
``/health``, ``/health_generate``, ``/get_model_info``, ``/get_server_info``, ``/flush_cache``,
``/update_weights_from_disk``, ``/abort_request``, ``/pause_generation``,
``/continue_generation`` and the OpenAI-compatible ``/v1/models``, ``/v1/completions`` and
``/v1/chat/completions`` (non-streaming). See docs/ROLLOUT.md for the field-by-field coverage.

    python -m agentrl_jax.rollout.server --model smollm2 --port 30000

Every malformed request gets a 4xx JSON ``{"error": {"message", "type", "code"}}``; a full
admission queue gets 503 with ``Retry-After``.

Limits (``environments.core.httpguard``): an optional API key (``--api-key``, as SGLang's:
``Authorization: Bearer <key>`` on every route but ``/health*``; required to bind a
non-loopback address), a body size limit (413), read timeouts for headers and bodies (408), a
connection limit (503), weight loading confined to ``--weights-dir`` directories, and client
chat templates refused unless ``--allow-request-chat-template`` (then rendered in a killable
child process with a deadline). Bodies over ``INLINE_BYTES`` are parsed and validated on a
worker thread, so one large request does not hold up the event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import dataclasses
import json
import logging
import os
import threading
import time
import uuid
from typing import Any, Callable, Sequence, TypeVar

from aiohttp import web

from agentrl_jax.rollout.base import (BackendUnavailableError, GenerateResult, InvalidRequestError,
                                      OverloadedError, SamplingParams)
from agentrl_jax.rollout.chat_template_sandbox import TemplateBusy, TemplateError, TemplateSandbox
from agentrl_jax.rollout.engine import Engine, EngineConfig
from environments.core.httpguard import (DEFAULT_MAX_CONNECTIONS, DEFAULT_READ_TIMEOUT_S, GuardedSite,
                                         GuardError, Limits, api_key_middleware,
                                         fit_connection_limit, read_body,
                                         require_key_off_loopback, run_app)

try:  # orjson: ~2x faster, and it rejects lone surrogates (``"\ud800"``) while parsing
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None

log = logging.getLogger(__name__)

T = TypeVar("T")

SGLANG_API_VERSION = "0.5.x"
SERVER_VERSION = f"agentrl-jax 0.1.0 (SGLang {SGLANG_API_VERSION} HTTP API)"
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024  # ~1M token ids: a batch of 256 full 4096-token prompts
INLINE_BYTES = 256 * 1024  # bodies up to this are parsed and validated on the event loop
API_KEY_ENV = "AGENTRL_ROLLOUT_API_KEY"
_LARGE = web.RequestKey("large_body", bool)  # set by _json: validate this request off the loop
# apply_chat_template's own parameters: not template variables, so not client-settable
_RESERVED_TEMPLATE_KWARGS = frozenset({
    "conversation", "tokenize", "padding", "truncation", "max_length",
    "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs",
    "add_generation_prompt", "continue_final_message"})


class HTTPError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.headers = status, message, type_, headers


def _error_response(status: int, message: str, type_: str = "invalid_request_error",
                    headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": {"message": message, "type": type_, "code": status},
                              "object": "error", "message": message}, status=status,
                             headers=headers)


@web.middleware
async def _error_middleware(request: web.Request, handler):
    try:
        return await handler(request)
    except HTTPError as e:
        return _error_response(e.status, e.message, e.type, e.headers)
    except GuardError as e:  # body too large / too slow: answer, then close the connection
        response = _error_response(e.status, e.message, "request_too_large" if e.status == 413
                                   else "request_timeout", e.headers)
        response.force_close()
        return response
    except TemplateBusy as e:
        return _error_response(503, str(e), "overloaded", {"Retry-After": "1"})
    except InvalidRequestError as e:
        return _error_response(400, str(e))
    except OverloadedError as e:
        return _error_response(503, str(e), "overloaded",
                               {"Retry-After": str(max(1, round(e.retry_after)))})
    except BackendUnavailableError as e:
        return _error_response(503, str(e), "unavailable", {"Retry-After": "5"})
    except web.HTTPRequestEntityTooLarge as e:
        response = _error_response(413, f"request body too large: {e.text}", "request_too_large")
        response.force_close()
        return response
    except web.HTTPException as e:
        if e.status >= 400:
            return _error_response(e.status, e.reason or "error", "http_error")
        raise
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001 -- never crash the server
        log.exception("unhandled error in %s %s", request.method, request.path)
        return _error_response(500, f"internal error: {type(e).__name__}: {e}", "server_error")


# ------------------------------------------------------------------------------ validation
def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _expect(cond: bool, message: str) -> None:
    if not cond:
        raise InvalidRequestError(message)


def _parse_json_object(raw: bytes) -> dict:
    """``raw`` as a JSON object (InvalidRequestError otherwise, lone surrogates included)."""
    try:
        body = _orjson.loads(raw) if _orjson is not None else json.loads(raw)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError, depth
        raise InvalidRequestError(f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise InvalidRequestError(f"request body must be a JSON object, got {_json_type(body)}")
    return body


def _check_unicode(text: str, where: str) -> None:
    """Text must be encodable as UTF-8 (no lone surrogates such as ``"\\ud800"``)."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidRequestError(f"{where} is not valid Unicode (a lone surrogate "
                                      f"code point)") from None


def _check_fields(body: dict, allowed: set[str], where: str) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise InvalidRequestError(f"{where}: unknown field(s) {unknown}; supported fields: "
                                  f"{sorted(allowed)}")


async def _wait_all(futures: list[concurrent.futures.Future]) -> list[Any]:
    """The results of ``futures`` (completed by the engine thread), in order. One wake-up of
    the event loop when the last one completes, rather than a task per future (a batch of
    4,096 prompts made 8,192 tasks and held the loop for ~0.4 s)."""
    if not futures:
        return []
    loop = asyncio.get_running_loop()
    all_done = loop.create_future()
    remaining = [len(futures)]
    lock = threading.Lock()

    def settle() -> None:
        if not all_done.done():
            all_done.set_result(None)

    def one_done(_: concurrent.futures.Future) -> None:
        with lock:
            remaining[0] -= 1
            last = remaining[0] == 0
        if last:
            try:
                loop.call_soon_threadsafe(settle)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass

    for future in futures:
        future.add_done_callback(one_done)
    await all_done
    return [future.result() for future in futures]


_JSON_TYPE_NAMES = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
                    dict: "object", type(None): "null"}


def _json_type(value: Any) -> str:
    """The JSON name of ``value``'s type, for error messages."""
    return _JSON_TYPE_NAMES.get(type(value), type(value).__name__)


def _is_kind(value: Any, kinds: tuple[type, ...]) -> bool:
    """``isinstance`` with JSON semantics: a boolean is only a ``bool`` (never an int or a
    number) and an integer is also a ``float``."""
    if isinstance(value, bool):
        return bool in kinds
    if isinstance(value, int) and float in kinds:
        return True
    return isinstance(value, kinds)


@dataclasses.dataclass(frozen=True)
class Field:
    """One field of a request body: its JSON type(s), default, allowed values, requiredness."""

    kinds: tuple[type, ...]
    default: Any = None
    choices: tuple[Any, ...] | None = None
    required: bool = False


def parse_body(body: dict, spec: dict[str, Field], where: str) -> dict[str, Any]:
    """Check ``body`` against ``spec`` (unknown fields, types, choices: InvalidRequestError)
    and return every field of ``spec``, defaults filled in (``null`` means the default)."""
    _check_fields(body, set(spec), where)
    out: dict[str, Any] = {}
    for name, field in spec.items():
        value = body.get(name)
        if value is None:
            _expect(not field.required, f"{where}: missing field {name!r}")
            out[name] = field.default
            continue
        if not _is_kind(value, field.kinds):
            wanted = " or ".join(_JSON_TYPE_NAMES[k] for k in field.kinds)
            raise InvalidRequestError(f"{where}: {name} must be a {wanted}, got "
                                      f"{_json_type(value)}")
        if field.choices is not None and value not in field.choices:
            raise InvalidRequestError(f"{where}: {name} must be one of {list(field.choices)}, "
                                      f"got {value!r}")
        out[name] = value
    return out


def _reject_unsupported(body: dict, unsupported: dict[str, Any], where: str) -> None:
    """Fields of the upstream API this server does not implement: accepted only at their
    default value (a boolean default only as a JSON boolean)."""
    for key, default in unsupported.items():
        if isinstance(default, bool) and body.get(key) is not None:
            _expect(isinstance(body[key], bool), f"{where}: {key} must be a boolean")
        if key in body and body[key] not in (default, None) and not (
                isinstance(default, (list, dict)) and not body[key]):
            raise InvalidRequestError(f"{where}: {key}={body[key]!r} is not supported by this "
                                      f"server (only the default {default!r})")


_SAMPLING_SUPPORTED = {"max_new_tokens", "temperature", "top_p", "top_k", "min_p", "stop",
                       "stop_token_ids", "ignore_eos", "n", "skip_special_tokens",
                       "no_stop_trim", "sampling_seed", "seed"}
_SAMPLING_UNSUPPORTED = {"frequency_penalty": 0.0, "presence_penalty": 0.0,
                         "repetition_penalty": 1.0, "min_new_tokens": 0, "json_schema": None,
                         "regex": None, "ebnf": None, "structural_tag": None, "stop_regex": None,
                         "custom_params": None, "logit_bias": None,
                         "spaces_between_special_tokens": True, "stream_interval": None}


def parse_sampling_params(raw: Any, where: str = "sampling_params") -> SamplingParams:
    """SGLang ``sampling_params`` dict -> SamplingParams (raises InvalidRequestError)."""
    if raw is None:
        raw = {}
    _expect(isinstance(raw, dict), f"{where} must be an object, got {type(raw).__name__}")
    _check_fields(raw, _SAMPLING_SUPPORTED | set(_SAMPLING_UNSUPPORTED), where)
    _reject_unsupported(raw, _SAMPLING_UNSUPPORTED, where)
    kwargs = {k: v for k, v in raw.items() if k in _SAMPLING_SUPPORTED and v is not None}
    seed = kwargs.pop("sampling_seed", None)
    seed = kwargs.pop("seed", seed)
    if seed is not None:
        kwargs["seed"] = seed
    if "stop" in kwargs:
        stop = kwargs["stop"]
        _expect(isinstance(stop, (str, list)), f"{where}.stop must be a string or a list")
        kwargs["stop"] = [stop] if isinstance(stop, str) else stop
        if not kwargs["stop"]:
            kwargs.pop("stop")
    for key in ("temperature", "top_p", "min_p"):
        if _is_int(kwargs.get(key)):
            kwargs[key] = float(kwargs[key])
    sampling = SamplingParams(**kwargs)
    sampling.validate()
    return sampling


# ---------------------------------------------------------------------------------- server
_GENERATE_FIELDS = {"text", "input_ids", "sampling_params", "return_logprob", "rid",
                    "session_id", "session_params", "return_text_in_logprobs", "stream",
                    "logprob_start_len", "top_logprobs_num", "token_ids_logprob", "lora_path",
                    "lora_id", "custom_logit_processor", "return_hidden_states", "image_data",
                    "audio_data", "video_data", "input_embeds", "log_metrics", "modalities",
                    "priority", "extra_key", "bootstrap_host", "bootstrap_port",
                    "bootstrap_room", "data_parallel_rank", "no_logs", "return_routed_experts"}
_GENERATE_UNSUPPORTED = {"stream": False, "top_logprobs_num": 0, "token_ids_logprob": None,
                         "lora_path": None, "lora_id": None, "custom_logit_processor": None,
                         "return_hidden_states": False, "image_data": None, "audio_data": None,
                         "video_data": None, "input_embeds": None, "modalities": None,
                         "bootstrap_host": None, "bootstrap_port": None, "bootstrap_room": None,
                         "return_routed_experts": False}


# SGLang's UpdateWeightFromDiskReqInput, AbortReq, PauseGenerationReqInput,
# ContinueGenerationReqInput (booleans are JSON booleans only: "no" is not false)
_UPDATE_WEIGHTS_SPEC = {
    "model_path": Field((str,), required=True),
    "load_format": Field((str,), choices=("auto", "safetensors")),
    "abort_all_requests": Field((bool,), False), "weight_version": Field((str, int)),
    "flush_cache": Field((bool,), True), "is_async": Field((bool,), False),
    "torch_empty_cache": Field((bool,), False), "keep_pause": Field((bool,), False),
    "recapture_cuda_graph": Field((bool,), False), "token_step": Field((int,), 0),
    "manual_load_format": Field((str, dict, list))}
_ABORT_SPEC = {"rid": Field((str,)), "abort_all": Field((bool,), False),
               "abort_message": Field((str,))}
_PAUSE_SPEC = {"mode": Field((str,), "abort", ("abort", "retract", "in_place"))}
_CONTINUE_SPEC = {"torch_empty_cache": Field((bool,), False)}


def _token_char_bound(tokenizer: Any) -> int | None:
    """An upper bound on the characters one token stands for (None: unknown), so that a text
    that cannot fit the context is refused before it is tokenized."""
    try:
        vocab = tokenizer.get_vocab()
    except Exception:  # noqa: BLE001 -- no tokenizer, or one without a vocabulary listing
        return None
    return 2 * max((len(t) for t in vocab), default=1) + 8


def default_weights_dirs(model_path: str | None) -> list[str]:
    """The directory of the served model: the model directory itself, or a model file's folder
    (nothing for a model that is not on disk, e.g. a random one)."""
    if not model_path or not os.path.exists(model_path):
        return []
    return [model_path if os.path.isdir(model_path) else os.path.dirname(os.path.abspath(model_path))]


@dataclasses.dataclass
class _GeneratePlan:
    """A validated ``/generate`` request: what to submit and how to answer."""

    prompts: list[list[int]]
    samplings: list[SamplingParams]
    rids: list[str | None]
    sessions: list[str | None]
    return_logprob: bool
    text_in_lp: bool
    batched: bool


class RolloutServer:
    """The aiohttp application around one ``Engine``.

    ``weights_dirs``: directories ``/update_weights_from_disk`` may load from, in addition to
    the served model's own directory. ``api_key``: required as ``Authorization: Bearer`` on
    every route but ``/health*``. ``allow_request_chat_template``: accept
    ``chat_template_kwargs.chat_template`` (rendered in a child process within
    ``chat_template_timeout_s``)."""

    def __init__(self, engine: Engine, model_path: str | None = None,
                 tokenizer_path: str | None = None, served_model_name: str | None = None,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, *,
                 api_key: str | None = None, weights_dirs: Sequence[str] = (),
                 read_timeout: float = DEFAULT_READ_TIMEOUT_S,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 allow_request_chat_template: bool = False,
                 chat_template_timeout_s: float = 2.0):
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.model_path = model_path or engine.model_path or "random"
        self.tokenizer_path = tokenizer_path or self.model_path
        self.served_model_name = served_model_name or os.path.basename(
            str(self.model_path).rstrip("/")) or "default"
        self.max_body_bytes = max_body_bytes
        self.limits = Limits(max_body=max_body_bytes, read_timeout=read_timeout,
                             max_connections=max_connections, api_key=api_key)
        self.weights_dirs = [os.path.realpath(d) for d in
                             [*default_weights_dirs(model_path or engine.model_path), *weights_dirs]]
        self.allow_request_chat_template = allow_request_chat_template
        self.template_sandbox = TemplateSandbox(chat_template_timeout_s)
        self._max_token_chars = _token_char_bound(self.tokenizer)
        self.started = time.time()
        self._weights_lock = asyncio.Lock()

    def app(self) -> web.Application:
        middlewares: list[Callable] = [_error_middleware]
        if self.limits.api_key:
            middlewares.insert(0, api_key_middleware(
                self.limits.api_key, lambda status, message, headers: _error_response(
                    status, message, "unauthorized", headers)))
        app = web.Application(middlewares=middlewares, client_max_size=self.max_body_bytes)
        app.on_cleanup.append(self._close_sandbox)
        r = app.router
        r.add_post("/generate", self.generate)
        r.add_get("/health", self.health)
        r.add_get("/health_generate", self.health_generate)
        r.add_get("/get_model_info", self.get_model_info)
        r.add_get("/model_info", self.get_model_info)
        r.add_get("/get_server_info", self.get_server_info)
        r.add_get("/server_info", self.get_server_info)
        r.add_route("GET", "/flush_cache", self.flush_cache)
        r.add_route("POST", "/flush_cache", self.flush_cache)
        r.add_post("/update_weights_from_disk", self.update_weights_from_disk)
        r.add_post("/abort_request", self.abort_request)
        r.add_post("/pause_generation", self.pause_generation)
        r.add_post("/continue_generation", self.continue_generation)
        r.add_post("/release_memory_occupation", self.not_supported)
        r.add_post("/resume_memory_occupation", self.not_supported)
        r.add_get("/v1/models", self.v1_models)
        r.add_post("/v1/completions", self.v1_completions)
        r.add_post("/v1/chat/completions", self.v1_chat_completions)
        return app

    async def _close_sandbox(self, app: web.Application) -> None:
        await self.template_sandbox.close()

    # ------------------------------------------------------------------------- helpers
    async def _json(self, request: web.Request, required: bool = True) -> Any:
        """The body as a JSON object. Over ``INLINE_BYTES`` it is parsed on a worker thread and
        the request is marked ``large`` (its validation then runs off the loop too)."""
        raw = await read_body(request, self.limits)
        request[_LARGE] = len(raw) > INLINE_BYTES
        if not raw.strip():
            if required:
                raise InvalidRequestError("request body is empty; expected a JSON object")
            return {}
        return await self._offload(request, _parse_json_object, raw)

    @staticmethod
    async def _offload(request: web.Request, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` inline for small requests, on a worker thread for large ones."""
        if request.get(_LARGE):
            return await asyncio.to_thread(fn, *args)
        return fn(*args)

    def _encode(self, text: Any, where: str) -> list[int]:
        _expect(isinstance(text, str), f"{where} must be a string")
        if self.tokenizer is None:
            raise InvalidRequestError("this server has no tokenizer: send input_ids, not text")
        _check_unicode(text, where)
        bound = self._max_token_chars
        if bound is not None and len(text) > bound * self.engine.config.max_length:
            raise InvalidRequestError(f"{where} has {len(text)} characters: more than the "
                                      f"context length of {self.engine.config.max_length} "
                                      f"tokens can hold")
        return list(self.tokenizer.encode(text))

    def _decode_token(self, token: int) -> str | None:
        if self.tokenizer is None:
            return None
        return self.tokenizer.decode([token])

    async def _run(self, request: web.Request, prompts: list[list[int]],
                   samplings: list[SamplingParams], rids: list[str | None],
                   session_ids: list[str | None]) -> list[list[GenerateResult]]:
        """Submit every prompt (all or nothing; on a worker thread for large requests) and
        await the results. A client that goes away aborts them all."""
        submitted: list[concurrent.futures.Future] = []
        cancelled = threading.Event()
        try:
            await self._offload(request, self._submit_all, prompts, samplings, rids,
                                session_ids, submitted, cancelled)
            return await _wait_all(submitted)
        except asyncio.CancelledError:  # client went away: free the slots
            cancelled.set()  # a submitting thread stops and aborts what it submitted since
            for future in list(submitted):
                self.engine.abort(future.rid)
            raise

    def _submit_all(self, prompts: list[list[int]], samplings: list[SamplingParams],
                    rids: list[str | None], session_ids: list[str | None],
                    submitted: list[concurrent.futures.Future],
                    cancelled: threading.Event) -> None:
        """Validate every prompt, then submit them into ``submitted``; on any failure, or once
        ``cancelled`` is set, abort the ones submitted (the flag is checked after each submit,
        so every request is aborted by this thread or by the cancelled handler)."""
        for ids, sp in zip(prompts, samplings):
            self.engine.validate(ids, sp)
        try:
            for ids, sp, rid, sid in zip(prompts, samplings, rids, session_ids):
                submitted.append(self.engine.submit(ids, sp, session_id=sid, rid=rid))
                if cancelled.is_set():
                    raise asyncio.CancelledError
        except BaseException:
            for future in submitted:
                self.engine.abort(future.rid)
            raise

    # ------------------------------------------------------------------------ /generate
    async def generate(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        plan = await self._offload(request, self._plan_generate, body)
        results = await self._run(request, plan.prompts, plan.samplings, plan.rids, plan.sessions)
        return await self._offload(request, self._generate_response, plan, results)

    def _generate_response(self, plan: "_GeneratePlan",
                           results: list[list[GenerateResult]]) -> web.Response:
        out = [self._generate_json(r, plan.return_logprob, plan.text_in_lp)
               for per_prompt in results for r in per_prompt]
        if not plan.batched and plan.samplings[0].n == 1:
            return web.json_response(out[0])
        return web.json_response(out)

    def _check_batch(self, count: int) -> None:
        """A batch larger than the admission queue could never be admitted whole."""
        limit = self.engine.config.max_queue
        _expect(count <= limit, f"a batch of {count} prompts exceeds the server's admission "
                                f"queue ({limit} requests)")

    def _check_ids(self, prompt: Any, where: str) -> None:
        """A non-empty list of integers shorter than the context (length checked first, so a
        huge list is refused without walking it)."""
        _expect(isinstance(prompt, list) and len(prompt) > 0,
                f"{where} must be a non-empty list of integers")
        limit = self.engine.config.max_length
        _expect(len(prompt) < limit, f"{where} has {len(prompt)} tokens: a prompt must be "
                                     f"shorter than the context length {limit}")
        _expect(all(_is_int(t) for t in prompt), f"{where} must be a non-empty list of integers")

    def _plan_generate(self, body: dict) -> "_GeneratePlan":
        """Validate a ``/generate`` body and tokenize its prompts (no engine call)."""
        _check_fields(body, _GENERATE_FIELDS, "/generate")
        _reject_unsupported(body, _GENERATE_UNSUPPORTED, "/generate")
        has_text, has_ids = body.get("text") is not None, body.get("input_ids") is not None
        _expect(has_text != has_ids, "/generate needs exactly one of 'text' or 'input_ids'")
        if body.get("return_logprob") and body.get("logprob_start_len", -1) not in (-1, None):
            raise InvalidRequestError("input-token logprobs (logprob_start_len >= 0) are not "
                                      "supported; only output_token_logprobs")
        if has_text:
            text = body["text"]
            batched = isinstance(text, list)
            texts = text if batched else [text]
            _expect(len(texts) > 0, "text must not be an empty list")
            self._check_batch(len(texts))
            prompts = [self._encode(t, f"text[{i}]" if batched else "text")
                       for i, t in enumerate(texts)]
        else:
            ids = body["input_ids"]
            _expect(isinstance(ids, list) and len(ids) > 0,
                    "input_ids must be a non-empty list of integers (or a list of such lists)")
            batched = isinstance(ids[0], list)
            prompts = ids if batched else [ids]
            self._check_batch(len(prompts))
            for i, p in enumerate(prompts):
                self._check_ids(p, f"input_ids[{i}]" if batched else "input_ids")
        count = len(prompts)
        raw_sp = body.get("sampling_params")
        if isinstance(raw_sp, list):
            _expect(len(raw_sp) == count, f"sampling_params has {len(raw_sp)} entries for "
                                          f"{count} prompts")
            samplings = [parse_sampling_params(s, f"sampling_params[{i}]")
                         for i, s in enumerate(raw_sp)]
        else:
            samplings = [parse_sampling_params(raw_sp)] * count
        rids = self._per_prompt(body.get("rid"), count, "rid")
        session = body.get("session_id")
        if session is None and isinstance(body.get("session_params"), dict):
            session = body["session_params"].get("id")
        sessions = self._per_prompt(session, count, "session_id")
        return_logprob = body.get("return_logprob", False)
        text_in_lp = body.get("return_text_in_logprobs", False)
        _expect(isinstance(return_logprob, bool), "return_logprob must be a boolean")
        _expect(isinstance(text_in_lp, bool), "return_text_in_logprobs must be a boolean")
        return _GeneratePlan(prompts, samplings, rids, sessions, return_logprob, text_in_lp,
                             batched)

    @staticmethod
    def _per_prompt(value: Any, count: int, name: str) -> list[Any]:
        if value is None:
            return [None] * count
        if isinstance(value, list):
            _expect(len(value) == count, f"{name} has {len(value)} entries for {count} prompts")
            _expect(all(isinstance(v, str) for v in value), f"{name} entries must be strings")
            return value
        _expect(isinstance(value, str), f"{name} must be a string")
        _expect(count == 1, f"a batch of {count} prompts needs a list of {count} {name}s")
        return [value]

    def _generate_json(self, r: GenerateResult, return_logprob: bool, text_in_lp: bool
                       ) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "id": r.rid, "finish_reason": r.finish_reason_json(),
            "prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens,
            "cached_tokens": r.cached_tokens, "weight_version": r.weight_version,
            "e2e_latency": r.latency_s}
        if return_logprob:
            meta["output_token_logprobs"] = [
                [lp, t, self._decode_token(t) if text_in_lp else None]
                for lp, t in zip(r.output_logprobs, r.output_ids)]
            meta["output_token_logprobs_raw"] = r.output_logprobs_raw
            meta["input_token_logprobs"] = []
        return {"text": r.text, "output_ids": r.output_ids, "meta_info": meta}

    # ---------------------------------------------------------------- admin endpoints
    async def health(self, request: web.Request) -> web.Response:
        if await self.engine.health():
            return web.json_response({})
        return _error_response(503, "engine is not healthy", "unavailable")

    async def health_generate(self, request: web.Request) -> web.Response:
        if not await self.engine.health():
            return _error_response(503, "engine is not healthy", "unavailable")
        if self.engine.paused:
            return web.json_response({"status": "paused"})
        token = self.engine.model_config.bos_token_id or 0
        try:
            await asyncio.wait_for(self.engine.generate(
                [token], SamplingParams(max_new_tokens=1, temperature=0.0)), timeout=60)
        except (asyncio.TimeoutError, OverloadedError) as e:
            return _error_response(503, f"health generation failed: {type(e).__name__}",
                                   "unavailable")
        return web.json_response({})

    async def get_model_info(self, request: web.Request) -> web.Response:
        return web.json_response({
            "model_path": self.model_path, "tokenizer_path": self.tokenizer_path,
            "is_generation": True, "preferred_sampling_params": None,
            "weight_version": self.engine.weight_version, "has_image_understanding": False,
            "has_audio_understanding": False, "model_type": self.engine.model_config.model_type,
            "architectures": [self.engine.model_config.to_hf_dict()["architectures"][0]]})

    async def get_server_info(self, request: web.Request) -> web.Response:
        cfg = self.engine.config
        return web.json_response({
            "version": SERVER_VERSION, "sglang_api_version": SGLANG_API_VERSION,
            "model_path": self.model_path, "tokenizer_path": self.tokenizer_path,
            "served_model_name": self.served_model_name,
            "max_running_requests": cfg.max_batch, "max_total_num_tokens":
                cfg.max_batch * cfg.max_length, "context_length": cfg.max_length,
            "engine_config": {k: (list(v) if isinstance(v, tuple) else v)
                              for k, v in vars(cfg).items()},
            "dtype": self.engine.model_config.dtype, "weight_version": self.engine.weight_version,
            "paused": self.engine.paused, "load": self.engine.load(),
            "stats": self.engine.stats.as_dict(), "uptime_s": time.time() - self.started})

    async def flush_cache(self, request: web.Request) -> web.Response:
        n = await self.engine.flush_cache()
        return web.Response(text=f"Cache flushed ({n} cached sessions dropped).\n")

    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        args = parse_body(body, _UPDATE_WEIGHTS_SPEC, "/update_weights_from_disk")
        path = args["model_path"]
        _expect(bool(path), "model_path must be a non-empty string")
        version = args["weight_version"]
        resolved = self._allowed_weights_path(path)
        if resolved is None:  # the same answer whether or not the path exists
            return self._weights_failure(
                f"model_path {path!r} is not inside a directory this server may load weights "
                f"from (--weights-dir)")
        if not os.path.isdir(resolved):
            return self._weights_failure(f"model_path {path!r} is not a directory")
        async with self._weights_lock:
            try:
                new_version = await self.engine.update_weights(
                    path=resolved, version=None if version is None else str(version),
                    flush_cache=args["flush_cache"], abort_all=args["abort_all_requests"])
            except (ValueError, OSError, TypeError) as e:
                return self._weights_failure(f"failed to load {path}: {e}")
        self.model_path = path
        return web.json_response({"success": True, "num_paused_requests": 0,
                                  "message": f"Succeeded to update model weights "
                                             f"(weight_version {new_version})."})

    def _allowed_weights_path(self, path: str) -> str | None:
        """``path`` with symbolic links resolved, if it lies inside an allowed weights directory
        (else None; nothing is checked on disk before that, so the answer never tells whether
        a path outside exists)."""
        if "\0" in path:
            return None
        resolved = os.path.realpath(path)
        for root in self.weights_dirs:
            if resolved == root or resolved.startswith(root.rstrip(os.sep) + os.sep):
                return resolved
        return None

    @staticmethod
    def _weights_failure(message: str) -> web.Response:
        return web.json_response({"success": False, "num_paused_requests": 0,
                                  "message": message}, status=400)

    async def abort_request(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        args = parse_body(body, _ABORT_SPEC, "/abort_request")
        if args["abort_all"]:
            n = self.engine.abort_all()
            return web.json_response({"aborted": n})
        rid = args["rid"]
        _expect(isinstance(rid, str) and rid, "rid must be a non-empty string")
        found = self.engine.abort(rid)
        return web.json_response({"aborted": int(found)})

    async def pause_generation(self, request: web.Request) -> web.Response:
        body = await self._json(request, required=False)
        mode = parse_body(body, _PAUSE_SPEC, "/pause_generation")["mode"]
        self.engine.pause(mode)
        return web.json_response({"message": f"Generation paused ({mode})."})

    async def continue_generation(self, request: web.Request) -> web.Response:
        body = await self._json(request, required=False)
        parse_body(body, _CONTINUE_SPEC, "/continue_generation")
        self.engine.resume()
        return web.json_response({"message": "Generation continued."})

    async def not_supported(self, request: web.Request) -> web.Response:
        return _error_response(501, f"{request.path} is not supported by the embedded engine",
                               "not_implemented")

    # ------------------------------------------------------------------------- OpenAI
    async def v1_models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{
            "id": self.served_model_name, "object": "model", "created": int(self.started),
            "owned_by": "agentrl-jax", "root": self.model_path,
            "max_model_len": self.engine.config.max_length}]})

    _OPENAI_COMMON = {"model", "max_tokens", "temperature", "top_p", "n", "stop", "seed",
                      "stream", "stream_options", "user", "frequency_penalty", "presence_penalty",
                      "logit_bias", "logprobs", "top_k", "min_p", "ignore_eos", "stop_token_ids",
                      "skip_special_tokens", "no_stop_trim", "session_id", "rid",
                      "repetition_penalty", "min_tokens", "metadata", "store", "service_tier"}
    _OPENAI_UNSUPPORTED = {"stream": False, "frequency_penalty": 0.0, "presence_penalty": 0.0,
                           "logit_bias": None, "repetition_penalty": 1.0, "min_tokens": 0,
                           "stream_options": None}

    def _openai_sampling(self, body: dict, max_tokens: Any) -> SamplingParams:
        n = body.get("n", 1)
        _expect(_is_int(n) and n >= 1, "n must be an integer >= 1")
        _expect(max_tokens is None or (_is_int(max_tokens) and max_tokens >= 0),
                "max_tokens must be a non-negative integer")
        raw = {"max_new_tokens": max_tokens, "temperature": body.get("temperature"),
               "top_p": body.get("top_p"), "n": n, "stop": body.get("stop"),
               "seed": body.get("seed"), "top_k": body.get("top_k"),
               "min_p": body.get("min_p"), "ignore_eos": body.get("ignore_eos"),
               "stop_token_ids": body.get("stop_token_ids"),
               "skip_special_tokens": body.get("skip_special_tokens"),
               "no_stop_trim": body.get("no_stop_trim")}
        return parse_sampling_params({k: v for k, v in raw.items() if v is not None}, "request")

    def _check_model(self, body: dict) -> None:
        _expect(isinstance(body.get("model", ""), str), "model must be a string")

    @staticmethod
    def _usage(results: list[GenerateResult]) -> dict[str, Any]:
        prompt = results[0].prompt_tokens if results else 0
        completion = sum(r.completion_tokens for r in results)
        return {"prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": results[0].cached_tokens
                                          if results else 0}}

    def _max_tokens_default(self, prompt_len: int) -> int:
        return max(1, self.engine.config.max_length - prompt_len)

    async def v1_completions(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        prompts, sampling, logprobs = await self._offload(request, self._plan_completions, body)
        results = await self._run(request, prompts, [sampling] * len(prompts),
                                  [None] * len(prompts), [body.get("session_id")] * len(prompts)
                                  if len(prompts) == 1 else [None] * len(prompts))
        answer = await self._offload(request, self._completions_json, body, results, logprobs)
        return web.json_response(answer)

    def _plan_completions(self, body: dict) -> tuple[list[list[int]], SamplingParams, Any]:
        """Validate a ``/v1/completions`` body: (prompts, sampling, logprobs)."""
        allowed = self._OPENAI_COMMON | {"prompt", "echo", "suffix", "best_of"}
        _check_fields(body, allowed, "/v1/completions")
        _reject_unsupported(body, {**self._OPENAI_UNSUPPORTED, "echo": False, "suffix": None},
                            "/v1/completions")
        self._check_model(body)
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            prompts = [self._encode(prompt, "prompt")]
        elif isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
            self._check_ids(prompt, "prompt")
            prompts = [prompt]
        elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            self._check_batch(len(prompt))
            prompts = [self._encode(p, f"prompt[{i}]") for i, p in enumerate(prompt)]
        elif isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
            self._check_batch(len(prompt))
            for i, p in enumerate(prompt):
                self._check_ids(p, f"prompt[{i}]")
            prompts = prompt
        else:
            raise InvalidRequestError("prompt must be a string, a list of strings, a list of "
                                      "token ids or a list of token-id lists")
        logprobs = body.get("logprobs")
        _expect(logprobs is None or (_is_int(logprobs) and 0 <= logprobs <= 1),
                "logprobs must be 0 or 1 (top alternatives are not supported)")
        best_of = body.get("best_of")
        _expect(best_of in (None, body.get("n", 1)), "best_of != n is not supported")
        max_tokens = body.get("max_tokens", 16)
        sampling = self._openai_sampling(body, max_tokens)
        sid = body.get("session_id")
        _expect(sid is None or isinstance(sid, str), "session_id must be a string")
        return prompts, sampling, logprobs

    def _completions_json(self, body: dict, results: list[list[GenerateResult]],
                          logprobs: Any) -> dict[str, Any]:
        """The OpenAI ``text_completion`` answer."""
        choices = []
        flat = [r for per in results for r in per]
        for i, r in enumerate(flat):
            choice: dict[str, Any] = {"index": i, "text": r.text or "",
                                      "finish_reason": r.finish_reason, "logprobs": None,
                                      "matched_stop": r.matched_stop}
            if logprobs is not None:
                tokens = [self._decode_token(t) or "" for t in r.output_ids]
                offsets, pos = [], 0
                for t in tokens:
                    offsets.append(pos)
                    pos += len(t)
                choice["logprobs"] = {"tokens": tokens, "token_logprobs": r.output_logprobs,
                                      "top_logprobs": None, "text_offset": offsets}
            choices.append(choice)
        usage = {"prompt_tokens": sum(per[0].prompt_tokens for per in results),
                 "completion_tokens": sum(r.completion_tokens for r in flat)}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
                "created": int(time.time()), "model": body.get("model") or self.served_model_name,
                "choices": choices, "usage": usage}

    async def v1_chat_completions(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        messages, kwargs, template = await self._offload(request, self._plan_chat, body)
        text = await self._render_chat(request, messages, kwargs, template)
        ids = await self._offload(request, self._encode_rendered, text)
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        if max_tokens is None:
            max_tokens = self._max_tokens_default(len(ids))
        sampling = self._openai_sampling(body, max_tokens)
        logprobs = body.get("logprobs", False)
        _expect(isinstance(logprobs, bool), "logprobs must be a boolean")
        sid, rid = body.get("session_id"), body.get("rid")
        _expect(sid is None or isinstance(sid, str), "session_id must be a string")
        _expect(rid is None or isinstance(rid, str), "rid must be a string")
        results = (await self._run(request, [ids], [sampling], [rid], [sid]))[0]
        return web.json_response(self._chat_json(body, results, logprobs))

    def _plan_chat(self, body: dict) -> tuple[list[dict[str, str]], dict[str, Any], str | None]:
        """Validate a chat body: (messages, template kwargs, client template or None)."""
        allowed = self._OPENAI_COMMON | {"messages", "max_completion_tokens", "top_logprobs",
                                         "tools", "tool_choice", "response_format",
                                         "parallel_tool_calls", "reasoning_effort",
                                         "chat_template_kwargs", "continue_final_message"}
        _check_fields(body, allowed, "/v1/chat/completions")
        _reject_unsupported(body, {**self._OPENAI_UNSUPPORTED, "tools": None,
                                   "tool_choice": None, "top_logprobs": 0,
                                   "parallel_tool_calls": None, "reasoning_effort": None,
                                   "continue_final_message": False}, "/v1/chat/completions")
        rf = body.get("response_format")
        _expect(rf is None or rf == {"type": "text"},
                "response_format other than {'type': 'text'} is not supported")
        self._check_model(body)
        if self.tokenizer is None:
            raise InvalidRequestError("this server has no tokenizer, chat is unavailable")
        messages = body.get("messages")
        _expect(isinstance(messages, list) and len(messages) > 0,
                "messages must be a non-empty list")
        clean = [self._chat_message(m, i) for i, m in enumerate(messages)]
        raw_kwargs = body.get("chat_template_kwargs") or {}
        _expect(isinstance(raw_kwargs, dict), "chat_template_kwargs must be an object")
        kwargs = dict(raw_kwargs)
        reserved = sorted(_RESERVED_TEMPLATE_KWARGS & set(kwargs))
        _expect(not reserved, f"chat_template_kwargs: {reserved} cannot be set by a request")
        template = kwargs.pop("chat_template", None)
        if template is not None:
            _expect(self.allow_request_chat_template,
                    "chat_template_kwargs.chat_template: client-supplied chat templates are "
                    "disabled on this server (start it with --allow-request-chat-template)")
            _expect(isinstance(template, str) and template,
                    "chat_template_kwargs.chat_template must be a non-empty string")
        return clean, kwargs, template

    @staticmethod
    def _chat_message(m: Any, i: int) -> dict[str, str]:
        """One message as ``{"role", "content"}`` (text content or OpenAI text parts)."""
        _expect(isinstance(m, dict) and isinstance(m.get("role"), str),
                f"messages[{i}] must be an object with a string 'role'")
        content = m.get("content")
        if isinstance(content, list):  # OpenAI content parts
            parts = []
            for part in content:
                _expect(isinstance(part, dict) and part.get("type") == "text"
                        and isinstance(part.get("text"), str),
                        f"messages[{i}].content: only text parts are supported")
                parts.append(part["text"])
            content = "".join(parts)
        _expect(isinstance(content, str), f"messages[{i}].content must be a string")
        return {"role": m["role"], "content": content}

    async def _render_chat(self, request: web.Request, messages: list[dict[str, str]],
                           kwargs: dict[str, Any], template: str | None) -> str:
        """The prompt text: the model's own template (trusted; on a worker thread for large
        requests) or a client template (in the sandbox process, with a deadline)."""
        max_chars = self.max_body_bytes + (self._max_token_chars or 64) * self.engine.config.max_length
        if template is not None:
            special = dict(getattr(self.tokenizer, "special_tokens_map", {}) or {})
            try:
                return await self.template_sandbox.render(template, messages,
                                                          {**special, **kwargs}, max_chars)
            except TemplateError as e:
                raise InvalidRequestError(str(e)) from None
        return await self._offload(request, self._apply_model_template, messages, kwargs)

    def _apply_model_template(self, messages: list[dict[str, str]],
                              kwargs: dict[str, Any]) -> str:
        try:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                      add_generation_prompt=True, **kwargs)
        except Exception as e:  # noqa: BLE001 -- template errors are the request's fault
            raise InvalidRequestError(f"cannot render the chat template: {e}") from None
        _expect(isinstance(text, str), "the chat template did not render to text")
        return text

    def _encode_rendered(self, text: str) -> list[int]:
        """Token ids of a rendered chat (its special tokens are already in the text)."""
        _check_unicode(text, "the rendered chat")
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _chat_json(self, body: dict, results: list[GenerateResult],
                   logprobs: bool) -> dict[str, Any]:
        """The OpenAI ``chat.completion`` answer."""
        choices = []
        for i, r in enumerate(results):
            choice: dict[str, Any] = {
                "index": i, "message": {"role": "assistant", "content": r.text or "",
                                        "tool_calls": None},
                "logprobs": None, "finish_reason": r.finish_reason,
                "matched_stop": r.matched_stop}
            if logprobs:
                content = []
                for lp, t in zip(r.output_logprobs, r.output_ids):
                    s = self._decode_token(t) or ""
                    content.append({"token": s, "logprob": lp, "bytes": list(s.encode()),
                                    "top_logprobs": []})
                choice["logprobs"] = {"content": content}
            choices.append(choice)
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
                "created": int(time.time()), "model": body.get("model") or self.served_model_name,
                "choices": choices, "usage": self._usage(results)}


# --------------------------------------------------------------------------- running it
class ServerThread:
    """Run a ``RolloutServer`` on its own event loop in a background thread (tests, notebooks,
    colocated setups). ``start()`` returns the base URL."""

    def __init__(self, server: RolloutServer, host: str = "127.0.0.1", port: int = 0):
        self.server, self.host, self.port = server, host, port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> str:
        """Start serving (raises ``ValueError`` for a non-loopback host without an API key)."""
        require_key_off_loopback(self.host, self.server.limits.api_key)
        self._thread = threading.Thread(target=self._run, name="rollout-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError("server did not start")
        if self._error is not None:
            raise RuntimeError(f"server failed to start: {self._error}") from self._error
        return self.url

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            limits = self.server.limits
            self._runner = web.AppRunner(self.server.app(), access_log=None,
                                         handler_cancellation=True, **limits.runner_kwargs())
            loop.run_until_complete(self._runner.setup())
            site = GuardedSite(self._runner, self.host, self.port,
                               max_connections=limits.max_connections,
                               refusal_body=_REFUSAL_BODY)
            loop.run_until_complete(site.start())
            self.port = site.port  # the bound port (port=0 picks one)
        except BaseException as e:  # noqa: BLE001
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        loop.run_forever()
        loop.run_until_complete(self._runner.cleanup())
        loop.close()

    def stop(self) -> None:
        if self._loop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=30)


def build_server(model: str = "smollm2", max_batch: int = 32, max_length: int = 4096,
                 dtype: str | None = None, **engine_kwargs: Any) -> RolloutServer:
    from agentrl_jax.models.pretrained import load_pretrained

    pretrained = load_pretrained(model)
    config = EngineConfig(max_batch=max_batch, max_length=max_length, dtype=dtype,
                          **engine_kwargs)
    engine = Engine(pretrained, config)
    return RolloutServer(engine, model_path=pretrained.path)


_REFUSAL_BODY = json.dumps({"error": {"message": "too many connections; retry later",
                                       "type": "overloaded", "code": 503}}).encode()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="SGLang-compatible rollout server (embedded JAX "
                                            "engine)")
    p.add_argument("--model", "--model-path", dest="model", default="smollm2",
                   help="known name (smollm2), HF directory or .gguf file")
    p.add_argument("--host", default="127.0.0.1",
                   help="interface to bind (default loopback; any other needs --api-key)")
    p.add_argument("--api-key", default=os.environ.get(API_KEY_ENV) or None,
                   help="require 'Authorization: Bearer <key>' on every route but /health* "
                        f"(default: ${API_KEY_ENV})")
    p.add_argument("--weights-dir", action="append", default=[],
                   help="a directory /update_weights_from_disk may load from (repeatable; the "
                        "served model's own directory always may)")
    p.add_argument("--read-timeout", type=float, default=DEFAULT_READ_TIMEOUT_S,
                   help="seconds allowed for a request's headers and for its body (408)")
    p.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS,
                   help="open connections at most (503 and closed beyond)")
    p.add_argument("--allow-request-chat-template", action="store_true",
                   help="accept chat_template_kwargs.chat_template (rendered in a child process)")
    p.add_argument("--chat-template-timeout", type=float, default=2.0,
                   help="seconds a client chat template may take to render")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--max-batch", type=int, default=32, help="slots decoded together")
    p.add_argument("--max-length", type=int, default=4096, help="context length per slot")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default=None)
    p.add_argument("--weights-dtype", choices=["float32", "bfloat16"], default=None)
    p.add_argument("--decode-steps", type=int, default=16)
    p.add_argument("--prefill-chunks", default="64,256,1024")
    p.add_argument("--prefill-tokens", type=int, default=4096)
    p.add_argument("--max-queue", type=int, default=4096)
    p.add_argument("--max-body-mb", type=float, default=DEFAULT_MAX_BODY_BYTES / 2**20)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--log-level", default="info")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:  # before the model is loaded: refuse at once
        require_key_off_loopback(args.host, args.api_key)
        Limits(max_body=int(args.max_body_mb * 2**20), read_timeout=args.read_timeout,
               max_connections=args.max_connections, api_key=args.api_key)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    from agentrl_jax.models.pretrained import load_pretrained

    pretrained = load_pretrained(args.model)
    config = EngineConfig(max_batch=args.max_batch, max_length=args.max_length, dtype=args.dtype,
                          weights_dtype=args.weights_dtype, decode_steps=args.decode_steps,
                          prefill_chunks=tuple(int(x) for x in args.prefill_chunks.split(",")),
                          prefill_tokens=args.prefill_tokens, max_queue=args.max_queue)
    log.info("compiling the engine (%s)", config)
    engine = Engine(pretrained, config)
    server = RolloutServer(engine, model_path=pretrained.path,
                           served_model_name=args.served_model_name,
                           max_body_bytes=int(args.max_body_mb * 2**20), api_key=args.api_key,
                           weights_dirs=args.weights_dir, read_timeout=args.read_timeout,
                           max_connections=fit_connection_limit(args.max_connections),
                           allow_request_chat_template=args.allow_request_chat_template,
                           chat_template_timeout_s=args.chat_template_timeout)
    log.info("serving %s on http://%s:%d (weights may load from %s)", pretrained.path,
             args.host, args.port, server.weights_dirs)
    # handler_cancellation: a client that disconnects cancels its handler, which aborts the
    # request in the engine (frees its slot) instead of generating for nobody.
    try:
        run_app(server.app(), host=args.host, port=args.port, limits=server.limits,
                refusal_body=_REFUSAL_BODY, handler_cancellation=True)
    finally:
        engine.close()


if __name__ == "__main__":
    main()
