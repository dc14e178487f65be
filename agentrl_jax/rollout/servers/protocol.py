"""What every route of the rollout server shares: the JSON error shape (``HTTPError``,
``{"error": {"message", "type", "code"}}``), body parsing and text checks, waiting for a batch of
engine futures without a task per future, and the limits' constants."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import logging
import os
import threading
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel

from agentrl_common.httpguard import GuardError
from agentrl_jax.rollout.contract import (BackendUnavailableError, InvalidRequestError,
                                               OverloadedError, RequestFailedError, SamplingParams)
from agentrl_jax.rollout.servers.api_fields import json_type
from agentrl_jax.rollout.servers.chat_template_sandbox import TemplateBusy

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
LARGE_BODY = web.RequestKey("large_body", bool)  # set by _json: validate this request off the loop


def refused(status: int, message: str, headers: dict[str, str]) -> web.Response:
    """The answer to a request ``request_guard_middleware`` refuses (403, 415, 421)."""
    kind = {403: "forbidden", 415: "unsupported_media_type", 421: "misdirected_request"}
    return error_response(status, message, kind.get(status, "invalid_request_error"), headers)


class HTTPError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.headers = status, message, type_, headers


def error_response(status: int, message: str, type_: str = "invalid_request_error",
                    headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": {"message": message, "type": type_, "code": status},
                              "object": "error", "message": message}, status=status,
                             headers=headers)


@web.middleware
async def error_middleware(request: web.Request, handler):
    try:
        return await handler(request)
    except HTTPError as e:
        return error_response(e.status, e.message, e.type, e.headers)
    except GuardError as e:  # body too large / too slow: answer, then close the connection
        response = error_response(e.status, e.message, "request_too_large" if e.status == 413
                                   else "request_timeout", e.headers)
        response.force_close()
        return response
    except TemplateBusy as e:
        return error_response(503, str(e), "overloaded", {"Retry-After": "1"})
    except InvalidRequestError as e:
        return error_response(400, str(e))
    except RequestFailedError as e:  # one request failed alone; the engine logged its cause
        return error_response(500, str(e), "request_failed")
    except OverloadedError as e:
        return error_response(503, str(e), "overloaded",
                               {"Retry-After": str(max(1, round(e.retry_after)))})
    except BackendUnavailableError as e:
        return error_response(503, str(e), "unavailable", {"Retry-After": "5"})
    except web.HTTPRequestEntityTooLarge as e:
        response = error_response(413, f"request body too large: {e.text}", "request_too_large")
        response.force_close()
        return response
    except web.HTTPException as e:
        if e.status >= 400:  # 404, 405 (with its Allow header), ...
            allow = {"Allow": e.headers["Allow"]} if "Allow" in e.headers else None
            return error_response(e.status, e.reason or "error", "http_error", allow)
        raise
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001 -- never crash the server
        log.exception("unhandled error in %s %s", request.method, request.path)
        return error_response(500, f"internal error: {type(e).__name__}: {e}", "server_error")


# ------------------------------------------------------------------------------ validation
# Request bodies are declared in api_models.py (pydantic); what is left here is JSON parsing
# and the checks that need the tokenizer.
def expect(cond: bool, message: str) -> None:
    if not cond:
        raise InvalidRequestError(message)


def parse_json_object(raw: bytes) -> dict:
    """``raw`` as a JSON object (InvalidRequestError otherwise, lone surrogates included)."""
    try:
        body = _orjson.loads(raw) if _orjson is not None else json.loads(raw)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError, depth
        raise InvalidRequestError(f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise InvalidRequestError(f"request body must be a JSON object, got {json_type(body)}")
    return body


def check_unicode(text: str, where: str) -> None:
    """Text must be encodable as UTF-8 (no lone surrogates such as ``"\\ud800"``)."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidRequestError(f"{where} is not valid Unicode (a lone surrogate "
                                      f"code point)") from None


async def wait_all(futures: list[concurrent.futures.Future]) -> list[Any]:
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


def token_char_bound(tokenizer: Any) -> int | None:
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
class GeneratePlan:
    """A validated ``/generate`` request: what to submit and how to answer."""

    prompts: list[list[int]]
    samplings: list[SamplingParams]
    rids: list[str | None]
    sessions: list[str | None]
    return_logprob: bool
    text_in_lp: bool
    batched: bool
