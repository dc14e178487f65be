"""Compiled functions shared by Learner objects with the same model / config / mesh (tests,
restarts in one process): a new Learner does not recompile. Builders close over locals only,
never over a Learner (the cache outlives learners)."""

from __future__ import annotations

from typing import Any, Callable

_JIT_CACHE: dict[Any, Any] = {}


def cached(key: Any, build: Callable[[], Any]) -> Any:
    """``build()`` once per ``key``; the same object afterwards."""
    if key not in _JIT_CACHE:
        _JIT_CACHE[key] = build()
    return _JIT_CACHE[key]


__all__ = ["cached"]
