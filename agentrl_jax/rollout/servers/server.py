"""SGLang-compatible HTTP server over the embedded engine (aiohttp).

Follows the HTTP API of SGLang 0.5.x (``sglang.srt.entrypoints.http_server``): ``/generate``,
``/health``, ``/health_generate``, ``/get_model_info``, ``/get_server_info``, ``/flush_cache``,
``/update_weights_from_disk``, ``/abort_request``, ``/pause_generation``,
``/continue_generation``, ``/close_session`` (here: free a finished episode's cached prefix),
``/release_memory_occupation`` / ``/resume_memory_occupation`` (the KV cache only) and the
OpenAI-compatible ``/v1/models``, ``/v1/completions`` and
``/v1/chat/completions`` (non-streaming). See docs/ROLLOUT.md for the field-by-field coverage.

    python -m agentrl_jax.rollout.servers.server --model smollm2 --port 30000

Every malformed request gets a 4xx JSON ``{"error": {"message", "type", "code"}}``; a full
admission queue gets 503 with ``Retry-After``. Request bodies are declared pydantic models
(``api_models.py``); their validation errors are 400s naming the failing fields.

Limits (``agentrl_common.httpguard``): an optional API key (``--api-key``, as SGLang's:
``Authorization: Bearer <key>`` on every route but ``/health*``; required to bind a
non-loopback address), a body size limit (413), read timeouts for headers and bodies (408), a
connection limit (503), weight loading confined to ``--weights-dir`` directories, and client
chat templates refused unless ``--allow-request-chat-template`` (then rendered in a killable
child process with a deadline). Bodies over ``INLINE_BYTES`` are parsed and validated on a
worker thread, so one large request does not hold up the event loop. Requests a web page could
send are refused (``httpguard.request_guard_middleware``): every state-changing route is POST
only (405 otherwise, ``/flush_cache`` included) and takes ``Content-Type: application/json``
only (415), a foreign ``Origin`` is 403, and on loopback (or with ``--allowed-host``) a ``Host``
that is not one of the server's names is 421 (DNS rebinding).

Engine defaults follow the backend as the trainer's engine does
(``rollout.engine.sizing``: ``fit_engine_slots`` and ``engine_prefill``): on CPU at most as many slots
as fit a sixth of host RAM, and one-sequence prefill calls; see ``engine_config_from_args``.
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
from pydantic import BaseModel

from agentrl_jax.rollout.servers.api_models import (AbortRequest, ChatCompletionRequest,
                                            CloseSessionRequest, CompletionRequest,
                                            ContinueRequest, GenerateRequest,
                                            MemoryOccupationRequest, PauseRequest,
                                            UpdateWeightsRequest, json_type, validate_request)
from agentrl_jax.rollout.backends.base import (BackendUnavailableError, GenerateResult, InvalidRequestError,
                                      OverloadedError, RequestFailedError, SamplingParams)
from agentrl_jax.rollout.servers.chat_template_sandbox import TemplateBusy, TemplateError, TemplateSandbox
from agentrl_jax.rollout.engine.engine import Engine, EngineConfig
from agentrl_jax.rollout.engine.engine_config import DECODE_ATTENTION, parse_prefill_kv_buckets
from agentrl_jax.rollout.engine.sizing import engine_prefill, fit_engine_slots
from agentrl_jax.rollout.engine.forward import DECODE_GEMM
from agentrl_common.httpguard import (DEFAULT_MAX_CONNECTIONS, DEFAULT_READ_TIMEOUT_S, GuardedSite,
                                         GuardError, Limits, api_key_middleware,
                                         fit_connection_limit, freeze_startup_objects,
                                         read_body,
                                         exit_with_parent, require_key_off_loopback, run_app)
from agentrl_common.httpguard import allowed_hosts as hosts_for, request_guard_middleware

try:  # orjson: faster, and it rejects lone surrogates (``"\ud800"``) while parsing
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None

log = logging.getLogger(__name__)

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

SGLANG_API_VERSION = "0.5.x"
SERVER_VERSION = f"agentrl-jax 0.1.0 (SGLang {SGLANG_API_VERSION} HTTP API)"
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024  # ~1M token ids: a batch of 256 full 4096-token prompts
INLINE_BYTES = 256 * 1024  # bodies up to this are parsed and validated on the event loop
API_KEY_ENV = "AGENTRL_ROLLOUT_API_KEY"
_LARGE = web.RequestKey("large_body", bool)  # set by _json: validate this request off the loop


def _refused(status: int, message: str, headers: dict[str, str]) -> web.Response:
    """The answer to a request ``request_guard_middleware`` refuses (403, 415, 421)."""
    kind = {403: "forbidden", 415: "unsupported_media_type", 421: "misdirected_request"}
    return _error_response(status, message, kind.get(status, "invalid_request_error"), headers)


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
    except RequestFailedError as e:  # one request failed alone; the engine logged its cause
        return _error_response(500, str(e), "request_failed")
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
        if e.status >= 400:  # 404, 405 (with its Allow header), ...
            allow = {"Allow": e.headers["Allow"]} if "Allow" in e.headers else None
            return _error_response(e.status, e.reason or "error", "http_error", allow)
        raise
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001 -- never crash the server
        log.exception("unhandled error in %s %s", request.method, request.path)
        return _error_response(500, f"internal error: {type(e).__name__}: {e}", "server_error")


# ------------------------------------------------------------------------------ validation
# Request bodies are declared in api_models.py (pydantic); what is left here is JSON parsing
# and the checks that need the tokenizer.
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
        raise InvalidRequestError(f"request body must be a JSON object, got {json_type(body)}")
    return body


def _check_unicode(text: str, where: str) -> None:
    """Text must be encodable as UTF-8 (no lone surrogates such as ``"\\ud800"``)."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidRequestError(f"{where} is not valid Unicode (a lone surrogate "
                                      f"code point)") from None


async def _wait_all(futures: list[concurrent.futures.Future]) -> list[Any]:
    """The results of ``futures`` (completed by the engine thread), in order. One wake-up of
    the event loop when the last one completes, rather than a task per future (a batch of
    4,096 prompts made 8,192 tasks and held the loop: docs/PERFORMANCE.md)."""
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
    ``chat_template_timeout_s``). ``allowed_hosts``: host names clients use besides the bound
    address's (``httpguard.allowed_hosts``)."""

    def __init__(self, engine: Engine, model_path: str | None = None,
                 tokenizer_path: str | None = None, served_model_name: str | None = None,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, *,
                 api_key: str | None = None, weights_dirs: Sequence[str] = (),
                 read_timeout: float = DEFAULT_READ_TIMEOUT_S,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 allow_request_chat_template: bool = False,
                 chat_template_timeout_s: float = 2.0, allowed_hosts: Sequence[str] = ()):
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
        self.allowed_hosts = tuple(allowed_hosts)

    def app(self, host: str = "127.0.0.1") -> web.Application:
        """The application for a server bound to ``host`` (whose names ``Host`` headers may
        use). Read-only routes are GET, every state-changing one POST only."""
        guard = request_guard_middleware(hosts_for(host, self.allowed_hosts), _refused)
        middlewares: list[Callable] = [guard, _error_middleware]
        if self.limits.api_key:
            middlewares.insert(1, api_key_middleware(
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
        r.add_post("/flush_cache", self.flush_cache)
        r.add_post("/update_weights_from_disk", self.update_weights_from_disk)
        r.add_post("/abort_request", self.abort_request)
        r.add_post("/close_session", self.close_session)
        r.add_post("/pause_generation", self.pause_generation)
        r.add_post("/continue_generation", self.continue_generation)
        r.add_post("/release_memory_occupation", self.release_memory_occupation)
        r.add_post("/resume_memory_occupation", self.resume_memory_occupation)
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

    def _validate(self, model: type[M], body: Any, where: str) -> M:
        """``body`` checked against its declared model (api_models.py) with this server's
        limits; ``InvalidRequestError`` (400) naming the failing fields otherwise."""
        cfg = self.engine.config
        context = {"max_length": cfg.max_length, "max_queue": cfg.max_queue,
                   "max_batch": cfg.max_batch, "max_stop_ids": cfg.max_stop_ids,
                   "vocab_size": self.engine.vocab_size,
                   "allow_request_chat_template": self.allow_request_chat_template}
        return validate_request(model, body, where, context)

    def _encode(self, text: str, where: str) -> list[int]:
        """Token ids of a (validated) prompt text; a text longer than the context could hold
        is refused before it is tokenized."""
        if self.tokenizer is None:
            raise InvalidRequestError("this server has no tokenizer: send input_ids, not text")
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

    def _plan_generate(self, body: dict) -> "_GeneratePlan":
        """Validate a ``/generate`` body and tokenize its prompts (no engine call)."""
        req = self._validate(GenerateRequest, body, "/generate")
        if req.text is not None:
            prompts = [self._encode(t, f"text[{i}]" if req.batched else "text")
                       for i, t in enumerate(req.texts())]
        else:
            prompts = req.token_ids()
        return _GeneratePlan(prompts, req.samplings(), req.per_prompt("rid"),
                             req.per_prompt("session_id"), req.return_logprob,
                             req.return_text_in_logprobs, req.batched)

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
            "devices": [str(d) for d in self.engine.placement.devices],
            "stats": self.engine.stats.as_dict(), "uptime_s": time.time() - self.started})

    async def flush_cache(self, request: web.Request) -> web.Response:
        n = await self.engine.flush_cache()
        return web.Response(text=f"Cache flushed ({n} cached sessions dropped).\n")

    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        args = self._validate(UpdateWeightsRequest, body, "/update_weights_from_disk")
        path, version = args.model_path, args.weight_version
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
                    flush_cache=args.flush_cache, abort_all=args.abort_all_requests)
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
        args = self._validate(AbortRequest, body, "/abort_request")
        if args.abort_all:
            n = self.engine.abort_all()
            return web.json_response({"aborted": n})
        found = self.engine.abort(args.rid)
        return web.json_response({"aborted": int(found)})

    async def close_session(self, request: web.Request) -> web.Response:
        """A finished episode: free its session's cached KV row (``Engine.end_session``)."""
        body = await self._json(request)
        session_id = self._validate(CloseSessionRequest, body, "/close_session").session_id
        self.engine.end_session(session_id)
        return web.json_response({"success": True})

    async def release_memory_occupation(self, request: web.Request) -> web.Response:
        """SGLang's memory saver, for the KV cache only (``Engine.release_kv_cache``): 409
        while requests run."""
        body = await self._json(request, required=False)
        self._validate(MemoryOccupationRequest, body, "/release_memory_occupation")
        try:
            freed = await self.engine.release_kv_cache()
        except RuntimeError as e:
            return _error_response(409, str(e), "conflict")
        return web.json_response({"success": True, "released": ["kv_cache"],
                                  "bytes": freed})

    async def resume_memory_occupation(self, request: web.Request) -> web.Response:
        body = await self._json(request, required=False)
        self._validate(MemoryOccupationRequest, body, "/resume_memory_occupation")
        allocated = await self.engine.resume_kv_cache()
        return web.json_response({"success": True, "resumed": ["kv_cache"],
                                  "bytes": allocated})

    async def pause_generation(self, request: web.Request) -> web.Response:
        body = await self._json(request, required=False)
        mode = self._validate(PauseRequest, body, "/pause_generation").mode
        self.engine.pause(mode)
        return web.json_response({"message": f"Generation paused ({mode})."})

    async def continue_generation(self, request: web.Request) -> web.Response:
        body = await self._json(request, required=False)
        self._validate(ContinueRequest, body, "/continue_generation")
        self.engine.resume()
        return web.json_response({"message": "Generation continued."})

    # ------------------------------------------------------------------------- OpenAI
    async def v1_models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{
            "id": self.served_model_name, "object": "model", "created": int(self.started),
            "owned_by": "agentrl-jax", "root": self.model_path,
            "max_model_len": self.engine.config.max_length}]})

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
        req, prompts = await self._offload(request, self._plan_completions, body)
        sessions = [req.session_id] if len(prompts) == 1 else [None] * len(prompts)
        results = await self._run(request, prompts, [req.sampling(req.max_tokens)] * len(prompts),
                                  [None] * len(prompts), sessions)
        answer = await self._offload(request, self._completions_json, req, results)
        return web.json_response(answer)

    def _plan_completions(self, body: dict) -> tuple[CompletionRequest, list[list[int]]]:
        """Validate a ``/v1/completions`` body and tokenize its prompts."""
        req = self._validate(CompletionRequest, body, "/v1/completions")
        texts, ids = req.prompts()
        if texts is not None:
            single = isinstance(req.prompt, str)
            ids = [self._encode(t, "prompt" if single else f"prompt[{i}]")
                   for i, t in enumerate(texts)]
        return req, ids  # type: ignore[return-value]

    def _completions_json(self, req: CompletionRequest,
                          results: list[list[GenerateResult]]) -> dict[str, Any]:
        """The OpenAI ``text_completion`` answer."""
        choices = []
        flat = [r for per in results for r in per]
        for i, r in enumerate(flat):
            choice: dict[str, Any] = {"index": i, "text": r.text or "",
                                      "finish_reason": r.finish_reason, "logprobs": None,
                                      "matched_stop": r.matched_stop}
            if req.logprobs is not None:
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
                "created": int(time.time()), "model": req.model or self.served_model_name,
                "choices": choices, "usage": usage}

    async def v1_chat_completions(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        req = await self._offload(request, self._plan_chat, body)
        kwargs, template = req.template()
        text = await self._render_chat(request, req.conversation(), kwargs, template)
        ids = await self._offload(request, self._encode_rendered, text)
        max_tokens = req.requested_max_tokens()
        if max_tokens is None:
            max_tokens = self._max_tokens_default(len(ids))
        results = (await self._run(request, [ids], [req.sampling(max_tokens)], [req.rid],
                                   [req.session_id]))[0]
        return web.json_response(self._chat_json(req, results))

    def _plan_chat(self, body: dict) -> ChatCompletionRequest:
        """Validate a chat body (the template is rendered afterwards)."""
        req = self._validate(ChatCompletionRequest, body, "/v1/chat/completions")
        if self.tokenizer is None:
            raise InvalidRequestError("this server has no tokenizer, chat is unavailable")
        return req

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

    def _chat_json(self, req: ChatCompletionRequest,
                   results: list[GenerateResult]) -> dict[str, Any]:
        """The OpenAI ``chat.completion`` answer."""
        choices = []
        for i, r in enumerate(results):
            choice: dict[str, Any] = {
                "index": i, "message": {"role": "assistant", "content": r.text or "",
                                        "tool_calls": None},
                "logprobs": None, "finish_reason": r.finish_reason,
                "matched_stop": r.matched_stop}
            if req.logprobs:
                content = []
                for lp, t in zip(r.output_logprobs, r.output_ids):
                    s = self._decode_token(t) or ""
                    content.append({"token": s, "logprob": lp, "bytes": list(s.encode()),
                                    "top_logprobs": []})
                choice["logprobs"] = {"content": content}
            choices.append(choice)
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
                "created": int(time.time()), "model": req.model or self.served_model_name,
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
            self._runner = web.AppRunner(self.server.app(self.host), access_log=None,
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
    p.add_argument("--allowed-host", action="append", default=[],
                   help="a host name clients reach this server by (repeatable); requests "
                        "naming another Host are refused (421). Default: the loopback names "
                        "on loopback, any Host elsewhere (the API key guards)")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--max-batch", type=int, default=EngineConfig.max_batch,
                   help="slots decoded together, at most: on the CPU backend only as many as "
                        "hold their KV cache in a sixth of host RAM (as the trainer's engine)")
    p.add_argument("--max-length", type=int, default=4096, help="context length per slot")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default=None)
    p.add_argument("--weights-dtype", choices=["float32", "bfloat16"], default=None)
    p.add_argument("--decode-steps", type=int, default=16)
    p.add_argument("--prefill-chunks", default=None,
                   help="chunk sizes of chunked prefill, e.g. 64,256,1024 (default: by backend, "
                        "as the trainer's engine: one sequence per call on CPU)")
    p.add_argument("--prefill-tokens", type=int, default=None,
                   help="tokens per prefill call (default: by backend)")
    p.add_argument("--max-queue", type=int, default=4096)
    p.add_argument("--seed", type=int, default=0, help="sampling seed of requests without one")
    p.add_argument("--decode-attention", choices=list(DECODE_ATTENTION), default="auto",
                   help="auto (ragged_fused on GPU), ragged_fused, ragged or dense "
                        "(EngineConfig.decode_attention)")
    p.add_argument("--decode-gemm", choices=["auto", *DECODE_GEMM], default="auto",
                   help="auto (merged q/k/v and gate/up on cuBLAS for one GPU), xla, merged or "
                        "merged_cublas (EngineConfig.decode_gemm)")
    p.add_argument("--prefill-kv-buckets", default=None,
                   help="'' (whole row), 'auto' or a comma list of lengths "
                        "(EngineConfig.prefill_kv_buckets; default: by backend)")
    p.add_argument("--tensor-parallel", type=int, default=1,
                   help="shard the engine over this process's first N local devices")
    p.add_argument("--parent-pid", type=int, default=None,
                   help="shut down when this process is gone (engine_servers sets it)")
    p.add_argument("--max-body-mb", type=float, default=DEFAULT_MAX_BODY_BYTES / 2**20)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--log-level", default="info")
    return p.parse_args(argv)


def engine_config_from_args(args: argparse.Namespace, model_config: Any,
                            platform: str) -> EngineConfig:
    """The engine configuration of ``args`` for a model of ``model_config`` on ``platform``
    (``"cpu"``, ``"gpu"``...), sized as the trainer sizes its engine: ``--max-batch`` slots at
    most, fewer on CPU where their KV cache would take more than a sixth of host RAM
    (``rollout.engine.sizing.fit_engine_slots``), and the prefill settings not given on the
    command line from ``rollout.engine.sizing.engine_prefill`` (on CPU one sequence per call over
    small chunks), else ``EngineConfig``'s."""
    sized = engine_prefill(platform)
    chunks = (tuple(int(x) for x in args.prefill_chunks.split(","))
              if args.prefill_chunks is not None
              else sized.get("prefill_chunks", EngineConfig.prefill_chunks))
    tokens = (args.prefill_tokens if args.prefill_tokens is not None
              else sized.get("prefill_tokens", EngineConfig.prefill_tokens))
    kv_buckets = (parse_prefill_kv_buckets(args.prefill_kv_buckets)
                  if args.prefill_kv_buckets is not None
                  else sized.get("prefill_kv_buckets", EngineConfig.prefill_kv_buckets))
    return EngineConfig(
        max_batch=fit_engine_slots(args.max_batch, model_config, args.max_length, args.dtype,
                                   backend=platform),
        max_length=args.max_length, dtype=args.dtype, weights_dtype=args.weights_dtype,
        decode_steps=args.decode_steps, prefill_chunks=chunks, prefill_tokens=tokens,
        max_queue=args.max_queue, seed=args.seed, decode_attention=args.decode_attention,
        decode_gemm=args.decode_gemm, prefill_kv_buckets=kv_buckets)


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
    import jax

    devices = jax.local_devices()
    if not 1 <= args.tensor_parallel <= len(devices):
        raise SystemExit(f"error: --tensor-parallel {args.tensor_parallel}: this process has "
                         f"{len(devices)} local device(s)")
    from agentrl_jax.models.pretrained import load_pretrained

    pretrained = load_pretrained(args.model)
    config = engine_config_from_args(args, pretrained.config, devices[0].platform)
    log.info("compiling the engine (%s) on %d device(s)", config, args.tensor_parallel)
    engine = Engine(pretrained, config, devices=devices[:args.tensor_parallel])
    server = RolloutServer(engine, model_path=pretrained.path,
                           served_model_name=args.served_model_name,
                           max_body_bytes=int(args.max_body_mb * 2**20), api_key=args.api_key,
                           weights_dirs=args.weights_dir, read_timeout=args.read_timeout,
                           max_connections=fit_connection_limit(args.max_connections),
                           allow_request_chat_template=args.allow_request_chat_template,
                           chat_template_timeout_s=args.chat_template_timeout,
                           allowed_hosts=args.allowed_host)
    log.info("serving %s on http://%s:%d (weights may load from %s)", pretrained.path,
             args.host, args.port, server.weights_dirs)
    # handler_cancellation: a client that disconnects cancels its handler, which aborts the
    # request in the engine (frees its slot) instead of generating for nobody.
    app = server.app(args.host)
    app.on_startup.append(freeze_startup_objects)  # the model, compiled engine, modules
    if args.parent_pid is not None:
        async def watch_parent(app: web.Application):
            task = asyncio.create_task(exit_with_parent(args.parent_pid))
            yield
            task.cancel()
        app.cleanup_ctx.append(watch_parent)
    try:
        run_app(app, host=args.host, port=args.port, limits=server.limits,
                refusal_body=_REFUSAL_BODY, handler_cancellation=True)
    finally:
        engine.close()


if __name__ == "__main__":
    main()
