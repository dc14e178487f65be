"""The rollout server's handlers of SGLang's native HTTP API (``/generate``, health, model and
server info, cache and weight management, abort, sessions, memory release, pause / continue),
a mixin of :class:`~agentrl_jax.rollout.servers.app.RolloutServer`."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from typing import Any

from aiohttp import web

from agentrl_jax.rollout.contract import GenerateResult, OverloadedError, SamplingParams
from agentrl_jax.rollout.servers.api_models import (AbortRequest, CloseSessionRequest,
                                                    ContinueRequest, GenerateRequest,
                                                    MemoryOccupationRequest, PauseRequest,
                                                    UpdateWeightsRequest)
from agentrl_jax.rollout.servers.protocol import (SERVER_VERSION, SGLANG_API_VERSION, GeneratePlan,
                                                  error_response)

log = logging.getLogger(__name__)


class NativeRoutes:
    """SGLang 0.5.x routes; ``self`` is a ``RolloutServer``."""

    # ------------------------------------------------------------------------ /generate
    async def generate(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        plan = await self._offload(request, self._plan_generate, body)
        results = await self._run(request, plan.prompts, plan.samplings, plan.rids, plan.sessions)
        return await self._offload(request, self._generate_response, plan, results)

    def _generate_response(self, plan: "GeneratePlan",
                           results: list[list[GenerateResult]]) -> web.Response:
        out = [self._generate_json(r, plan.return_logprob, plan.text_in_lp)
               for per_prompt in results for r in per_prompt]
        if not plan.batched and plan.samplings[0].n == 1:
            return web.json_response(out[0])
        return web.json_response(out)

    def _plan_generate(self, body: dict) -> "GeneratePlan":
        """Validate a ``/generate`` body and tokenize its prompts (no engine call)."""
        req = self._validate(GenerateRequest, body, "/generate")
        if req.text is not None:
            prompts = [self._encode(t, f"text[{i}]" if req.batched else "text")
                       for i, t in enumerate(req.texts())]
        else:
            prompts = req.token_ids()
        return GeneratePlan(prompts, req.samplings(), req.per_prompt("rid"),
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
        return error_response(503, "engine is not healthy", "unavailable")

    async def health_generate(self, request: web.Request) -> web.Response:
        if not await self.engine.health():
            return error_response(503, "engine is not healthy", "unavailable")
        if self.engine.paused:
            return web.json_response({"status": "paused"})
        token = self.engine.model_config.bos_token_id or 0
        try:
            await asyncio.wait_for(self.engine.generate(
                [token], SamplingParams(max_new_tokens=1, temperature=0.0)), timeout=60)
        except (asyncio.TimeoutError, OverloadedError) as e:
            return error_response(503, f"health generation failed: {type(e).__name__}",
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
            cancel = threading.Event()  # set when the client goes away or the server stops
            self.weight_loads.add(cancel)
            try:
                new_version = await self.engine.update_weights(
                    path=resolved, version=None if version is None else str(version),
                    flush_cache=args.flush_cache, abort_all=args.abort_all_requests,
                    cancel=cancel)
            except asyncio.CancelledError:
                cancel.set()  # the loader stops before its next tensor
                log.warning("/update_weights_from_disk %s: cancelled (client gone)", path)
                raise
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as e:  # noqa: BLE001 -- a panic from native code included
                if cancel.is_set():
                    return self._weights_failure(f"loading {path} was cancelled: the server is "
                                                 "shutting down", status=503)
                return self._weights_failure(f"failed to load {path}: "
                                             f"{str(e).strip() or type(e).__name__}")
            finally:
                self.weight_loads.discard(cancel)
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
    def _weights_failure(message: str, status: int = 400) -> web.Response:
        """The failure answer of ``/update_weights_from_disk``, logged in one line."""
        log.warning("/update_weights_from_disk refused (%d): %s", status, message)
        return web.json_response({"success": False, "num_paused_requests": 0,
                                  "message": message}, status=status)

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
            return error_response(409, str(e), "conflict")
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
