"""The fixed-size record an episode gets in a trajectory file's index (:data:`RECORD`) and the
values it is built from: summary fields as int32 / float, the episode's searchable text.
(``viewer/record.py`` is the other side: the checked fields of one episode the page shows.)"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

#: one index record per episode (little-endian, fixed size: the cache file is an array of these)
RECORD = np.dtype([
    ("offset", "<i8"),  # byte offset of the line in the JSONL file (.gz: of its gzip member)
    ("length", "<i4"),  # bytes of the line, without the newline
    ("member_length", "<i8"),  # .gz: compressed bytes of the line's member (plain files: 0)
    ("inner", "<i8"),  # .gz: the line's offset in its decompressed member (plain files: 0)
    ("step", "<i4"),  # training step (-1: not recorded)
    ("env", "<i4"),  # code into the file's "env" vocabulary
    ("task", "<i4"),  # code into the "task" vocabulary
    ("status", "<i4"),  # code into the "status" vocabulary
    ("reward", "<f8"),
    ("success", "i1"),
    ("num_turns", "<i4"),
    ("invalid", "<i4"),  # invalid_actions
    ("n_tokens", "<i4"),  # len(token_ids) (-1: not recorded)
    ("n_trained", "<i4"),  # sum(loss_mask) (-1: not recorded)
    ("group_id", "<i4"),
    ("sample_index", "<i4"),
    ("policy_version", "<i4"),
    ("horizon", "<i4"),
    ("has_error", "i1"),  # a non-empty "error" field
    ("parse_failures", "<i4"),  # replies the parser could not read (-1: unknown)
    ("context_tokens", "<i4"),  # the final context length (-1: unknown; record.context_tokens)
    ("text_offset", "<i8"),  # the episode's searchable text in the text file
    ("text_length", "<i4"),
])
VOCAB_COLUMNS = ("env", "task", "status")
ERROR_STATUSES = ("env_error", "engine_error")
_INT32_MAX = 2**31 - 1
_READ_CHUNK = 8 << 20  # bytes read per block while indexing
_TEXT_SEP = b"\x00"  # between two episodes' texts: a search term cannot contain it


def default_cache_dir() -> str:
    """``$AGENTRL_JAX_CACHE/viewer`` (default ``~/.cache/agentrl_jax/viewer``)."""
    root = os.environ.get("AGENTRL_JAX_CACHE",
                          os.path.join(os.path.expanduser("~"), ".cache", "agentrl_jax"))
    return os.path.join(root, "viewer")


def as_int(value: Any, default: int = -1) -> int:
    """An int32 from a JSON value (bools, floats and numeric strings too), else ``default``."""
    try:
        v = int(value)
    except (TypeError, ValueError, OverflowError):
        return default
    return v if -_INT32_MAX <= v <= _INT32_MAX else default


def count_column(value: int | None) -> int:
    """A count for an int32 column: ``-1`` when unknown (``None``) or beyond int32."""
    return value if value is not None and value <= _INT32_MAX else -1


def _float(value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError, OverflowError):
        return 0.0
    return v if math.isfinite(v) else 0.0


def episode_text(ep: dict[str, Any]) -> str:
    """The searchable text of an episode (lower-cased): env, task id, episode id, status, error
    and every message except the system prompt (the same long instructions in every episode of
    an environment, which would make every episode match its words)."""
    parts = [str(ep.get(k) or "") for k in ("env", "task_id", "episode_id", "status", "error")]
    messages = ep.get("messages")
    for m in messages if isinstance(messages, list) else ():  # a malformed record: no messages
        if isinstance(m, dict) and m.get("role") != "system":
            parts.append(str(m.get("content") or ""))
    return "\n".join(parts).lower().replace("\x00", " ")
