"""The rollout server's OpenAI-compatible handlers (``/v1/models``, ``/v1/completions``,
``/v1/chat/completions``, non-streaming), a mixin of
:class:`~agentrl_jax.rollout.servers.app.RolloutServer`; chat templates are the model's own or,
when allowed, the request's, rendered in the sandbox process."""

from __future__ import annotations

import time
import uuid
from typing import Any

from aiohttp import web

from agentrl_jax.rollout.contract import GenerateResult, InvalidRequestError
from agentrl_jax.rollout.servers.api_models import ChatCompletionRequest, CompletionRequest
from agentrl_jax.rollout.servers.chat_template_sandbox import TemplateError
from agentrl_jax.rollout.servers.protocol import check_unicode, expect


class OpenAIRoutes:
    """OpenAI routes; ``self`` is a ``RolloutServer``."""

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
        expect(isinstance(text, str), "the chat template did not render to text")
        return text

    def _encode_rendered(self, text: str) -> list[int]:
        """Token ids of a rendered chat (its special tokens are already in the text)."""
        check_unicode(text, "the rendered chat")
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
