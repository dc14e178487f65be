"""Query-string validation for the viewer's HTTP API: every parameter is checked (type, range,
known names) and a bad one raises :class:`~agentrl_jax.viewer.api.ViewerError` (HTTP 400) with
a message naming the parameter and what it accepts."""

from __future__ import annotations

import math
from typing import Mapping

from agentrl_jax.viewer.api import ViewerError
from agentrl_jax.viewer.index import SORT_KEYS, Query

MAX_INT = 2**31 - 1
MAX_OFFSET = 10**9
MAX_LIMIT = 500
MAX_TEXT = 500
KINDS = ("train", "eval", "other")
STATUSES = ("done", "max_turns", "context_limit", "env_error", "engine_error", "unknown")
#: the episode-list parameters (besides ``run``)
QUERY_PARAMS = ("kind", "env", "task", "status", "step_min", "step_max", "reward_min",
                "reward_max", "turns_min", "turns_max", "success", "invalid", "error", "q",
                "sort", "order", "offset", "limit")


def check_names(params: Mapping[str, str], allowed: tuple[str, ...]) -> None:
    """Unknown parameter names are errors (a typo would otherwise silently not filter)."""
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ViewerError(f"unknown parameter(s) {', '.join(unknown)}; this endpoint takes "
                          f"{', '.join(allowed) or 'none'}")
    for name in params:
        if len(params.getall(name) if hasattr(params, "getall") else [params[name]]) > 1:
            raise ViewerError(f"parameter {name} is given more than once")


def get_int(params: Mapping[str, str], name: str, default: int | None = None,
            lo: int = 0, hi: int = MAX_INT, required: bool = False) -> int | None:
    raw = params.get(name)
    if raw is None or raw == "":
        if required:
            raise ViewerError(f"parameter {name} is required (an integer)")
        return default
    text = raw.strip()
    if len(text) > 19 or not (text.isdigit() or (text[:1] == "-" and text[1:].isdigit())):
        raise ViewerError(f"parameter {name}={raw[:40]!r} is not an integer in [{lo}, {hi}]")
    value = int(text)
    if not lo <= value <= hi:
        raise ViewerError(f"parameter {name}={value} is out of range [{lo}, {hi}]")
    return value


def get_float(params: Mapping[str, str], name: str) -> float | None:
    raw = params.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = float(raw) if len(raw) <= 40 else math.nan
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ViewerError(f"parameter {name}={raw[:40]!r} is not a finite number")
    return value


def get_bool(params: Mapping[str, str], name: str, default: bool | None = None
             ) -> bool | None:
    raw = params.get(name)
    if raw is None or raw == "":
        return default
    low = raw.lower()
    if low in ("1", "true", "yes"):
        return True
    if low in ("0", "false", "no"):
        return False
    raise ViewerError(f"parameter {name}={raw[:40]!r} is not a boolean (true / false)")


def get_text(params: Mapping[str, str], name: str) -> str | None:
    raw = params.get(name)
    if raw is None or raw == "":
        return None
    if len(raw) > MAX_TEXT:
        raise ViewerError(f"parameter {name} is longer than {MAX_TEXT} characters")
    if "\x00" in raw:
        raise ViewerError(f"parameter {name} contains a NUL character")
    return raw


def get_choices(params: Mapping[str, str], name: str, choices: tuple[str, ...] | None
                ) -> tuple[str, ...] | None:
    """A comma-separated list; with ``choices``, every item must be one of them."""
    raw = get_text(params, name)
    if raw is None:
        return None
    items = tuple(x for x in (s.strip() for s in raw.split(",")) if x)
    if choices is not None:
        bad = [x for x in items if x not in choices]
        if bad:
            raise ViewerError(f"parameter {name}: unknown value(s) {', '.join(bad)[:100]} "
                              f"(choices: {', '.join(choices)})")
    return items or None


def parse_query(params: Mapping[str, str]) -> Query:
    """A :class:`Query` from the episode-list parameters (see :data:`QUERY_PARAMS`)."""
    sort = params.get("sort") or "order"
    if sort not in SORT_KEYS:
        raise ViewerError(f"parameter sort={sort[:40]!r} is not one of {', '.join(SORT_KEYS)}")
    order = params.get("order") or "asc"
    if order not in ("asc", "desc"):
        raise ViewerError(f"parameter order={order[:40]!r} is not asc or desc")
    ranges = {}
    for name in ("step", "turns"):
        lo = get_int(params, f"{name}_min", None, -1)
        hi = get_int(params, f"{name}_max", None, -1)
        if lo is not None and hi is not None and lo > hi:
            raise ViewerError(f"{name}_min={lo} is larger than {name}_max={hi}")
        ranges[name] = (lo, hi)
    rlo, rhi = get_float(params, "reward_min"), get_float(params, "reward_max")
    if rlo is not None and rhi is not None and rlo > rhi:
        raise ViewerError(f"reward_min={rlo} is larger than reward_max={rhi}")
    return Query(kinds=get_choices(params, "kind", KINDS),
                 envs=get_choices(params, "env", None),
                 task=get_text(params, "task"),
                 statuses=get_choices(params, "status", STATUSES),
                 step_min=ranges["step"][0], step_max=ranges["step"][1],
                 reward_min=rlo, reward_max=rhi,
                 turns_min=ranges["turns"][0], turns_max=ranges["turns"][1],
                 success=get_bool(params, "success"), invalid=get_bool(params, "invalid"),
                 error=get_bool(params, "error"), search=get_text(params, "q"),
                 sort=sort, descending=order == "desc",
                 offset=get_int(params, "offset", 0, 0, MAX_OFFSET),
                 limit=get_int(params, "limit", 50, 1, MAX_LIMIT))
