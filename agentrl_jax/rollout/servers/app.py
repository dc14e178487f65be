"""The aiohttp application of the rollout server around one ``Engine``: its state, the
middlewares and route table, body parsing / validation (on a worker thread for large bodies)
and submitting prompts to the engine. The handlers are in ``routes.py`` (SGLang's native API)
and ``openai_routes.py`` (the OpenAI-compatible one)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import time
from typing import Any, Callable, Sequence

from aiohttp import web

from agentrl_common.httpguard import (DEFAULT_MAX_CONNECTIONS, DEFAULT_READ_TIMEOUT_S, Limits,
                                     api_key_middleware, read_body, request_guard_middleware)
from agentrl_common.httpguard import allowed_hosts as hosts_for
from agentrl_jax.rollout.contract import GenerateResult, InvalidRequestError, SamplingParams
from agentrl_jax.rollout.engine.engine import Engine
from agentrl_jax.rollout.servers.api_fields import validate_request
from agentrl_jax.rollout.servers.chat_template_sandbox import TemplateSandbox
from agentrl_jax.rollout.servers.openai_routes import OpenAIRoutes
from agentrl_jax.rollout.servers.protocol import (DEFAULT_MAX_BODY_BYTES, INLINE_BYTES, LARGE_BODY, M,
                                                  T, default_weights_dirs, error_middleware,
                                                  error_response, parse_json_object, refused,
                                                  token_char_bound, wait_all)
from agentrl_jax.rollout.servers.routes import NativeRoutes


class RolloutServer(NativeRoutes, OpenAIRoutes):
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
        self._max_token_chars = token_char_bound(self.tokenizer)
        self.started = time.time()
        self._weights_lock = asyncio.Lock()
        #: the cancel flags of the weight loads in progress (set all on shutdown)
        self.weight_loads: set[threading.Event] = set()
        self.allowed_hosts = tuple(allowed_hosts)

    def app(self, host: str = "127.0.0.1") -> web.Application:
        """The application for a server bound to ``host`` (whose names ``Host`` headers may
        use). Read-only routes are GET, every state-changing one POST only."""
        guard = request_guard_middleware(hosts_for(host, self.allowed_hosts), refused)
        middlewares: list[Callable] = [guard, error_middleware]
        if self.limits.api_key:
            middlewares.insert(1, api_key_middleware(
                self.limits.api_key, lambda status, message, headers: error_response(
                    status, message, "unauthorized", headers)))
        app = web.Application(middlewares=middlewares, client_max_size=self.max_body_bytes)
        app.on_shutdown.append(self._cancel_weight_loads)
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

    async def _cancel_weight_loads(self, app: web.Application) -> None:
        """On shutdown (SIGTERM): stop every weight load before its next tensor, so the
        server exits promptly instead of waiting for the loader thread."""
        for cancel in list(self.weight_loads):
            cancel.set()

    async def _close_sandbox(self, app: web.Application) -> None:
        await self.template_sandbox.close()

    # ------------------------------------------------------------------------- helpers
    async def _json(self, request: web.Request, required: bool = True) -> Any:
        """The body as a JSON object. Over ``INLINE_BYTES`` it is parsed on a worker thread and
        the request is marked ``large`` (its validation then runs off the loop too)."""
        raw = await read_body(request, self.limits)
        request[LARGE_BODY] = len(raw) > INLINE_BYTES
        if not raw.strip():
            if required:
                raise InvalidRequestError("request body is empty; expected a JSON object")
            return {}
        return await self._offload(request, parse_json_object, raw)

    @staticmethod
    async def _offload(request: web.Request, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` inline for small requests, on a worker thread for large ones."""
        if request.get(LARGE_BODY):
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
        options = self.engine.model_config.option_token_ids
        if options:  # option_count's upper bound; without options the engine refuses any
            context["option_tokens"] = len(options)
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
            return await wait_all(submitted)
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
