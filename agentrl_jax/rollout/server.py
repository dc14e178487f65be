"""SGLang-compatible HTTP server over the embedded engine (aiohttp).

Follows the HTTP API of SGLang 0.5.x (``sglang.srt.entrypoints.http_server``): ``/generate``,
``/health``, ``/health_generate``, ``/get_model_info``, ``/get_server_info``, ``/flush_cache``,
``/update_weights_from_disk``, ``/abort_request``, ``/pause_generation``,
``/continue_generation`` and the OpenAI-compatible ``/v1/models``, ``/v1/completions`` and
``/v1/chat/completions`` (non-streaming). See docs/ROLLOUT.md for the field-by-field coverage.

    python -m agentrl_jax.rollout.server --model smollm2 --port 30000

Every malformed request gets a 4xx JSON ``{"error": {"message", "type", "code"}}``; a full
admission queue gets 503 with ``Retry-After``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import threading
import time
import uuid
from typing import Any

from aiohttp import web

from agentrl_jax.rollout.base import (BackendUnavailableError, GenerateResult, InvalidRequestError,
                                      OverloadedError, SamplingParams)
from agentrl_jax.rollout.engine import Engine, EngineConfig

log = logging.getLogger(__name__)

SGLANG_API_VERSION = "0.5.x"
SERVER_VERSION = f"agentrl-jax 0.1.0 (SGLang {SGLANG_API_VERSION} HTTP API)"
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024


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
    except InvalidRequestError as e:
        return _error_response(400, str(e))
    except OverloadedError as e:
        return _error_response(503, str(e), "overloaded",
                               {"Retry-After": str(max(1, round(e.retry_after)))})
    except BackendUnavailableError as e:
        return _error_response(503, str(e), "unavailable", {"Retry-After": "5"})
    except web.HTTPRequestEntityTooLarge as e:
        return _error_response(413, f"request body too large: {e.text}", "request_too_large")
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


def _check_fields(body: dict, allowed: set[str], where: str) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise InvalidRequestError(f"{where}: unknown field(s) {unknown}; supported fields: "
                                  f"{sorted(allowed)}")


def _reject_unsupported(body: dict, unsupported: dict[str, Any], where: str) -> None:
    """Fields of the upstream API this server does not implement: accepted only at their
    default value."""
    for key, default in unsupported.items():
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


class RolloutServer:
    """The aiohttp application around one ``Engine``."""

    def __init__(self, engine: Engine, model_path: str | None = None,
                 tokenizer_path: str | None = None, served_model_name: str | None = None,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES):
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.model_path = model_path or engine.model_path or "random"
        self.tokenizer_path = tokenizer_path or self.model_path
        self.served_model_name = served_model_name or os.path.basename(
            str(self.model_path).rstrip("/")) or "default"
        self.max_body_bytes = max_body_bytes
        self.started = time.time()
        self._weights_lock = asyncio.Lock()

    def app(self) -> web.Application:
        app = web.Application(middlewares=[_error_middleware], client_max_size=self.max_body_bytes)
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

    # ------------------------------------------------------------------------- helpers
    async def _json(self, request: web.Request, required: bool = True) -> Any:
        raw = await request.read()  # raises HTTPRequestEntityTooLarge above the limit
        if not raw.strip():
            if required:
                raise InvalidRequestError("request body is empty; expected a JSON object")
            return {}
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError, depth
            raise InvalidRequestError(f"request body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise InvalidRequestError(f"request body must be a JSON object, got "
                                      f"{type(body).__name__}")
        return body

    def _encode(self, text: Any, where: str) -> list[int]:
        _expect(isinstance(text, str), f"{where} must be a string")
        if self.tokenizer is None:
            raise InvalidRequestError("this server has no tokenizer: send input_ids, not text")
        return list(self.tokenizer.encode(text))

    def _decode_token(self, token: int) -> str | None:
        if self.tokenizer is None:
            return None
        return self.tokenizer.decode([token])

    async def _run(self, prompts: list[list[int]], samplings: list[SamplingParams],
                   rids: list[str | None], session_ids: list[str | None]
                   ) -> list[list[GenerateResult]]:
        """Submit every prompt (all or nothing) and await the results."""
        for ids, sp in zip(prompts, samplings):
            self.engine.validate(ids, sp)
        futures, submitted = [], []
        try:
            for ids, sp, rid, sid in zip(prompts, samplings, rids, session_ids):
                fut = self.engine.submit(ids, sp, session_id=sid, rid=rid)
                futures.append(fut)
                submitted.append(fut.rid)
        except BaseException:
            for rid in submitted:
                self.engine.abort(rid)
            raise
        try:
            return list(await asyncio.gather(
                *[asyncio.shield(asyncio.wrap_future(f)) for f in futures]))
        except asyncio.CancelledError:  # client went away: free the slots
            for rid in submitted:
                self.engine.abort(rid)
            raise

    # ------------------------------------------------------------------------ /generate
    async def generate(self, request: web.Request) -> web.Response:
        body = await self._json(request)
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
            prompts = [self._encode(t, f"text[{i}]") for i, t in enumerate(texts)]
        else:
            ids = body["input_ids"]
            _expect(isinstance(ids, list) and len(ids) > 0,
                    "input_ids must be a non-empty list of integers (or a list of such lists)")
            batched = isinstance(ids[0], list)
            prompts = ids if batched else [ids]
            for i, p in enumerate(prompts):
                _expect(isinstance(p, list) and len(p) > 0 and all(_is_int(t) for t in p),
                        f"input_ids[{i}] must be a non-empty list of integers" if batched
                        else "input_ids must be a non-empty list of integers")
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
        results = await self._run(prompts, samplings, rids, sessions)
        out = [self._generate_json(r, return_logprob, text_in_lp)
               for per_prompt in results for r in per_prompt]
        if not batched and samplings[0].n == 1:
            return web.json_response(out[0])
        return web.json_response(out)

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
        _check_fields(body, {"model_path", "load_format", "abort_all_requests", "weight_version",
                             "flush_cache", "is_async", "torch_empty_cache", "keep_pause",
                             "recapture_cuda_graph", "token_step", "manual_load_format"},
                      "/update_weights_from_disk")
        path = body.get("model_path")
        _expect(isinstance(path, str) and path, "model_path must be a non-empty string")
        load_format = body.get("load_format")
        _expect(load_format in (None, "auto", "safetensors"),
                f"load_format {load_format!r} is not supported (auto or safetensors)")
        version = body.get("weight_version")
        _expect(version is None or isinstance(version, (str, int)),
                "weight_version must be a string")
        if not os.path.isdir(path):
            return web.json_response({"success": False, "num_paused_requests": 0,
                                      "message": f"model_path {path!r} is not a directory"},
                                     status=400)
        async with self._weights_lock:
            try:
                new_version = await self.engine.update_weights(
                    path=path, version=None if version is None else str(version),
                    flush_cache=bool(body.get("flush_cache", True)),
                    abort_all=bool(body.get("abort_all_requests", False)))
            except (ValueError, OSError, TypeError) as e:
                return web.json_response({"success": False, "num_paused_requests": 0,
                                          "message": f"failed to load {path}: {e}"}, status=400)
        self.model_path = path
        return web.json_response({"success": True, "num_paused_requests": 0,
                                  "message": f"Succeeded to update model weights "
                                             f"(weight_version {new_version})."})

    async def abort_request(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        _check_fields(body, {"rid", "abort_all", "abort_message"}, "/abort_request")
        if body.get("abort_all"):
            n = self.engine.abort_all()
            return web.json_response({"aborted": n})
        rid = body.get("rid")
        _expect(isinstance(rid, str) and rid, "rid must be a non-empty string")
        found = self.engine.abort(rid)
        return web.json_response({"aborted": int(found)})

    async def pause_generation(self, request: web.Request) -> web.Response:
        body = await self._json(request, required=False)
        _check_fields(body, {"mode"}, "/pause_generation")
        mode = body.get("mode", "abort")
        _expect(mode in ("abort", "retract", "in_place"),
                f"mode must be abort, retract or in_place, got {mode!r}")
        self.engine.pause(mode)
        return web.json_response({"message": f"Generation paused ({mode})."})

    async def continue_generation(self, request: web.Request) -> web.Response:
        body = await self._json(request, required=False)
        _check_fields(body, {"torch_empty_cache"}, "/continue_generation")
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
        allowed = self._OPENAI_COMMON | {"prompt", "echo", "suffix", "best_of"}
        _check_fields(body, allowed, "/v1/completions")
        _reject_unsupported(body, {**self._OPENAI_UNSUPPORTED, "echo": False, "suffix": None},
                            "/v1/completions")
        self._check_model(body)
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            prompts = [self._encode(prompt, "prompt")]
        elif isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
            prompts = [prompt]
        elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            prompts = [self._encode(p, f"prompt[{i}]") for i, p in enumerate(prompt)]
        elif isinstance(prompt, list) and prompt and all(
                isinstance(p, list) and p and all(_is_int(t) for t in p) for p in prompt):
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
        results = await self._run(prompts, [sampling] * len(prompts),
                                  [None] * len(prompts), [body.get("session_id")] * len(prompts)
                                  if len(prompts) == 1 else [None] * len(prompts))
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
        return web.json_response({"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
                                  "created": int(time.time()),
                                  "model": body.get("model") or self.served_model_name,
                                  "choices": choices, "usage": usage})

    async def v1_chat_completions(self, request: web.Request) -> web.Response:
        body = await self._json(request)
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
        clean = []
        for i, m in enumerate(messages):
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
            clean.append({"role": m["role"], "content": content})
        kwargs = body.get("chat_template_kwargs") or {}
        _expect(isinstance(kwargs, dict), "chat_template_kwargs must be an object")
        try:
            text = self.tokenizer.apply_chat_template(clean, tokenize=False,
                                                      add_generation_prompt=True, **kwargs)
        except Exception as e:  # noqa: BLE001 -- template errors are the request's fault
            raise InvalidRequestError(f"cannot render the chat template: {e}") from None
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        if max_tokens is None:
            max_tokens = self._max_tokens_default(len(ids))
        sampling = self._openai_sampling(body, max_tokens)
        logprobs = body.get("logprobs", False)
        _expect(isinstance(logprobs, bool), "logprobs must be a boolean")
        sid, rid = body.get("session_id"), body.get("rid")
        _expect(sid is None or isinstance(sid, str), "session_id must be a string")
        _expect(rid is None or isinstance(rid, str), "rid must be a string")
        results = (await self._run([ids], [sampling], [rid], [sid]))[0]
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
        return web.json_response({"id": f"chatcmpl-{uuid.uuid4().hex}",
                                  "object": "chat.completion", "created": int(time.time()),
                                  "model": body.get("model") or self.served_model_name,
                                  "choices": choices, "usage": self._usage(results)})


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
            self._runner = web.AppRunner(self.server.app(), access_log=None,
                                         handler_cancellation=True)
            loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, self.host, self.port)
            loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]  # the bound port (port=0)
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


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="SGLang-compatible rollout server (embedded JAX "
                                            "engine)")
    p.add_argument("--model", "--model-path", dest="model", default="smollm2",
                   help="known name (smollm2), HF directory or .gguf file")
    p.add_argument("--host", default="127.0.0.1")
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
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
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
                           max_body_bytes=int(args.max_body_mb * 2**20))
    log.info("serving %s on http://%s:%d", pretrained.path, args.host, args.port)
    # handler_cancellation: a client that disconnects cancels its handler, which aborts the
    # request in the engine (frees its slot) instead of generating for nobody.
    web.run_app(server.app(), host=args.host, port=args.port, access_log=None, print=None,
                handler_cancellation=True)
    engine.close()


if __name__ == "__main__":
    main()
