"""The environment protocol's request side: fields read from a JSON body or a query string, each
checked (type, range, length), and the error every check raises (``ProtocolError``: a 4xx status
and a message, answered as ``{"error": message}``). The server core (``server.py``) uses these
for every operation, so a malformed request is refused the same way on every route.
"""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web

from agentrl_common.httpguard import Limits, read_body
from environments.core import jsonio
from environments.core.base import MAX_LISTED_ACTIONS

MAX_TASK_ID_CHARS = 256  # far above any family's ids; longer ones are refused before the family sees them
MAX_QUERY_INT = 10**12  # offsets / limits of GET /tasks
_QUERY_INT = re.compile(r"[0-9]{1,13}")  # canonical non-negative decimal: no sign, space, "_" or non-ASCII digit


class ProtocolError(Exception):
    """A client error with its HTTP status; rendered as ``{"error": message}``."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers


def json_response(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    """A JSON answer encoded with the fast encoder."""
    return web.Response(body=jsonio.dumps(payload), status=status, headers=headers, content_type="application/json")


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return json_response({"error": message}, status=status, headers=headers)


async def read_json(request: web.Request, limits: Limits) -> dict[str, Any]:
    """The request body as a JSON object (400 if malformed, 413 over the size limit, 408 if it
    does not arrive within the read timeout)."""
    body = await read_body(request, limits)
    try:
        data = jsonio.loads(body) if body else None
    except ValueError as error:
        raise ProtocolError(400, f"malformed JSON body: {error}") from None
    if not isinstance(data, dict):
        raise ProtocolError(400, "the body must be a JSON object")
    return data


def query_int(request: web.Request, name: str, default: int | None) -> int | None:
    """Query parameter ``name`` as a non-negative integer written canonically (400 otherwise)."""
    raw = request.query.get(name)
    if raw is None:
        return default
    if _QUERY_INT.fullmatch(raw) is None or int(raw) > MAX_QUERY_INT:
        raise ProtocolError(400, f"{name!r} must be an integer in 0..{MAX_QUERY_INT} written with ASCII digits")
    return int(raw)


def task_id_field(data: dict[str, Any]) -> str | None:
    """``data["task_id"]``: a string of at most ``MAX_TASK_ID_CHARS`` characters (or None)."""
    task_id = optional(data, "task_id", str)
    if task_id is not None and len(task_id) > MAX_TASK_ID_CHARS:
        raise ProtocolError(400, f"field 'task_id' is longer than {MAX_TASK_ID_CHARS} characters")
    return task_id


def _type_name(kind: type | tuple[type, ...]) -> str:
    return "integer" if kind is int else "string" if kind is str else str(kind)


def required(data: dict[str, Any], key: str, kind: type) -> Any:
    """``data[key]``, which must exist and be of ``kind`` (bools are not integers here)."""
    if data.get(key) is None:
        raise ProtocolError(400, f"missing field {key!r}")
    return optional(data, key, kind)


def optional(data: dict[str, Any], key: str, kind: type) -> Any:
    """``data.get(key)`` (``None`` allowed), checked to be of ``kind``."""
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ProtocolError(400, f"field {key!r} must be a {_type_name(kind)}, got {type(value).__name__}")
    return value


def action_text_field(data: dict[str, Any]) -> bool | None:
    """``data["action_text"]``: False keeps every action list out of the observation text (the
    server's ``Valid actions:`` line and a family's own listing, e.g. BabyAI's ``Available
    actions:``); the actions still come in ``info``. None: not given."""
    return optional(data, "action_text", bool)


def list_actions_field(data: dict[str, Any]) -> int | None:
    """``data["list_actions"]``: how many valid actions to list, 0..``MAX_LISTED_ACTIONS``."""
    value = optional(data, "list_actions", int)
    if value is not None and not 0 <= value <= MAX_LISTED_ACTIONS:
        raise ProtocolError(400, f"field 'list_actions' must be in 0..{MAX_LISTED_ACTIONS}, got {value}")
    return value
