"""An episode record from a run folder, checked before anything shows it.

A run folder is data from outside the viewer (a run someone shared, a file someone edited), so
every field of a record is checked against the type the trainer writes before the episode view
uses it. A field of the wrong type is not shown as it is: its value becomes ``None`` and the
reason goes into ``malformed`` (``{field: "expected an integer, got str '<x>'"}``), which the
page and the export show next to the field. Strings stay strings (the page escapes them).

* :func:`episode_fields` the summary fields (:data:`FIELD_KINDS`) of one record;
* :func:`token_problem` why the token arrays cannot be shown (``None``: they can);
* :func:`list_field` a list field, or ``[]`` plus a ``malformed`` entry;
* :func:`count_field` / :func:`context_tokens` the evaluation counts (``parse_failures``,
  ``context_tokens``), ``None`` when unknown (records written before the fields).
"""

from __future__ import annotations

import math
from typing import Any

from agentrl_jax.agent.trajectory import record_context_tokens

INT_LIMIT = 2**53  # larger integers do not survive a round trip through JavaScript numbers
SHOWN_CHARS = 60  # characters of a bad value quoted in its ``malformed`` entry

#: the summary fields of an episode record and the kind of value the trainer writes
FIELD_KINDS: dict[str, str] = {
    "env": "string", "task_id": "string", "episode_id": "string", "status": "string",
    "error": "string", "step": "integer", "num_turns": "integer", "invalid_actions": "integer",
    "horizon": "integer", "policy_version": "integer", "group_id": "integer",
    "sample_index": "integer", "prompt_length": "integer", "parse_failures": "integer",
    "context_tokens": "integer", "reward": "number",
    "elapsed_s": "number", "success": "boolean",
}
TOKEN_ARRAYS = ("token_ids", "loss_mask", "turn_ids", "logprobs")


def describe_bad(value: Any, expected: str) -> str:
    """``"expected an integer, got str '<img …'"``: the value's type and its start."""
    shown = repr(value)
    if len(shown) > SHOWN_CHARS:
        shown = shown[:SHOWN_CHARS - 1] + "\u2026"
    article = "an" if expected[0] in "aeiou" else "a"
    return f"expected {article} {expected}, got {type(value).__name__} {shown}"


def check_value(value: Any, kind: str) -> tuple[bool, Any]:
    """``(ok, value)`` for one field of ``kind`` (``string`` / ``integer`` / ``number`` /
    ``boolean``). ``None`` is always ok (not recorded). Integers: ints (not bools) or
    integral floats within +-2**53; numbers: ints or floats (non-finite ones pass: the API
    writes them as null); booleans: bools or the integers 0 / 1."""
    if value is None:
        return True, None
    if kind == "string":
        return (True, value) if isinstance(value, str) else (False, None)
    if isinstance(value, bool):
        return (True, value) if kind == "boolean" else (False, None)
    if kind == "integer":
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        ok = isinstance(value, int) and -INT_LIMIT <= value <= INT_LIMIT
        return (True, value) if ok else (False, None)
    if kind == "number":
        return (True, value) if isinstance(value, (int, float)) else (False, None)
    if kind == "boolean":
        return (True, bool(value)) if isinstance(value, int) and value in (0, 1) else (False, None)
    raise ValueError(f"unknown field kind {kind!r}")


def episode_fields(ep: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """``(fields, malformed)``: each field of :data:`FIELD_KINDS` present in ``ep``, with a bad
    value replaced by ``None`` and described in ``malformed``."""
    fields: dict[str, Any] = {}
    malformed: dict[str, str] = {}
    for name, kind in FIELD_KINDS.items():
        if name not in ep:
            continue
        ok, value = check_value(ep[name], kind)
        fields[name] = value
        if not ok:
            malformed[name] = describe_bad(ep[name], kind)
    return fields, malformed


def int_field(ep: dict[str, Any], name: str, default: int = 0) -> int:
    """Field ``name`` as an integer, ``default`` when absent or malformed."""
    ok, value = check_value(ep.get(name), "integer")
    return value if ok and value is not None else default


def count_field(ep: dict[str, Any], name: str) -> int | None:
    """Field ``name`` as a count (an integer >= 0); ``None`` when absent (unknown: a record
    written before the field), malformed or negative."""
    ok, value = check_value(ep.get(name), "integer")
    return value if ok and value is not None and value >= 0 else None


def context_tokens(ep: dict[str, Any]) -> int | None:
    """The episode's final context length (what the engine held at the end, prompt + every
    turn): the recorded ``context_tokens`` when the record has the field (``None`` when it is
    malformed), else, from a full trajectory, ``len(token_ids) - chunk_starts[-1]`` (the last
    chunk of a history window; ``chunk_starts`` absent: ``len(token_ids)``), as
    ``agent.trajectory.record_context_tokens``; ``None`` when neither can be read (a small
    evaluation record from before the field, or token arrays of the wrong type)."""
    if "context_tokens" in ep:
        return count_field(ep, "context_tokens")
    ids, starts = ep.get("token_ids"), ep.get("chunk_starts")
    if not isinstance(ids, list):
        return None
    if starts is not None:
        if not isinstance(starts, list) or not starts:
            return None
        ok, last = check_value(starts[-1], "integer")
        if not ok or last is None or not 0 <= last <= len(ids):
            return None
        starts = [last]
    return record_context_tokens({"token_ids": ids, "chunk_starts": starts})


def list_field(ep: dict[str, Any], name: str, malformed: dict[str, str]) -> list[Any]:
    """Field ``name`` when it is a list; ``[]`` when absent; ``[]`` plus an entry in
    ``malformed`` when it is anything else."""
    value = ep.get(name)
    if value is None:
        return []
    if isinstance(value, list):
        return value
    malformed[name] = describe_bad(value, "list")
    return []


def token_problem(ep: dict[str, Any]) -> str | None:
    """Why the token arrays of ``ep`` cannot be laid out, or ``None`` when they can:
    ``token_ids`` / ``turn_ids`` lists of integers, ``loss_mask`` of integers or booleans,
    ``logprobs`` of numbers or nulls, ``prompt_length`` an integer."""
    wanted = {"token_ids": "integer", "turn_ids": "integer", "loss_mask": "integer",
              "logprobs": "number"}
    for name, kind in wanted.items():
        value = ep.get(name)
        if value is None:
            continue
        if not isinstance(value, list):
            return f"{name}: {describe_bad(value, 'list')}"
        for i, x in enumerate(value):
            if name == "loss_mask" and isinstance(x, bool):
                continue
            ok, _ = check_value(x, kind)
            if not ok or (x is None and name != "logprobs"):
                return f"{name}[{i}]: {describe_bad(x, kind)}"
    ok, _ = check_value(ep.get("prompt_length"), "integer")
    if not ok:
        return f"prompt_length: {describe_bad(ep.get('prompt_length'), 'integer')}"
    return None
