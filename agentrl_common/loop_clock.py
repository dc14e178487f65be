"""The event loop's CPU seconds by callback: which coroutines and callbacks use the loop's thread.

A rollout's event loop shares its process's GIL with the engine thread, so its CPU time is time
the engine's host work may wait for (docs/PERFORMANCE.md, "Tokenising by lines, and the event
loop's share of the GIL"). A sampling profiler run beside a busy engine records waits for the
CPU and the GIL as much as work; this clock reads the loop thread's own CPU time
(``time.thread_time``: user + system time of this thread only) around every callback the loop
runs (``asyncio.events.Handle._run``), so waiting outside a callback counts nowhere and a
callback's cost is what its thread spent in it.

A callback is named by what it runs: a task's step by its coroutine (``"task:Episode.run"``),
any other callback by its function's qualified name (``"_SelectorSocketTransport._read_ready"``).

    clock = LoopCallbackClock()
    with clock:                       # on the loop's thread, e.g. around an awaited collect
        await pool.collect(...)
    clock.top(8)   # [{"name": "task:Episode.run", "cpu_s": <seconds>, "calls": <count>}, ...]

One clock at a time per process (it replaces ``Handle._run`` on the class while active).
"""

from __future__ import annotations

import asyncio.events
import collections
import threading
import time
from typing import Any

_ACTIVE: list[LoopCallbackClock] = []  # the clock whose wrapper is installed, if any


def callback_name(handle: asyncio.events.Handle) -> str:
    """``"task:<coroutine qualname>"`` for a task's step or wake-up, else the callback's
    qualified name (its type's name when it has none)."""
    callback = handle._callback
    owner = getattr(callback, "__self__", None)
    if isinstance(owner, asyncio.Task):
        coro = owner.get_coro()
        return "task:" + str(getattr(coro, "__qualname__", type(coro).__name__))
    return str(getattr(callback, "__qualname__", None) or type(callback).__name__)


class LoopCallbackClock:
    """CPU seconds and calls per callback name, on the thread that entered the clock."""

    def __init__(self) -> None:
        self.cpu_s: collections.Counter[str] = collections.Counter()
        self.calls: collections.Counter[str] = collections.Counter()
        self._thread: int | None = None
        self._original: Any = None

    def __enter__(self) -> LoopCallbackClock:
        if _ACTIVE:
            raise RuntimeError("another LoopCallbackClock is running in this process")
        self._thread = threading.get_ident()
        self._original = original = asyncio.events.Handle._run
        clock_thread, cpu_s, calls, read = self._thread, self.cpu_s, self.calls, time.thread_time

        def timed_run(handle: asyncio.events.Handle) -> None:
            if threading.get_ident() != clock_thread:
                return original(handle)
            start = read()
            try:
                return original(handle)
            finally:
                name = callback_name(handle)
                cpu_s[name] += read() - start
                calls[name] += 1

        asyncio.events.Handle._run = timed_run  # type: ignore[method-assign]
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        asyncio.events.Handle._run = self._original  # type: ignore[method-assign]
        _ACTIVE.clear()

    @property
    def total_s(self) -> float:
        """CPU seconds inside all callbacks (the loop's own polling and bookkeeping excluded)."""
        return sum(self.cpu_s.values())

    def top(self, n: int = 8) -> list[dict[str, Any]]:
        """The ``n`` callback names with the most CPU, most first."""
        return [{"name": name, "cpu_s": cpu, "calls": self.calls[name]}
                for name, cpu in self.cpu_s.most_common(n)]
