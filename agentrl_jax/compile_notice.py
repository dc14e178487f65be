"""Announce every compilation of a jitted function, so that a slow one is never silent.

``jax.jit`` compiles on the first call with new argument shapes (a new length bucket of the
train step, a new prefill size of the engine), which takes from a second to minutes and
looked like a hang. :class:`Announced` wraps a jitted function: a call whose shape key it has
not seen yet is announced through the process's announcer,

    compiling the train step for length 1024 ...
    compiling the train step for length 1024 ... done in 41.2 s

and later calls with that key go straight through. The announcer is set once by the job that
prints (``set_announcer(say)``: the trainer, the evaluation and SFT jobs); without one nothing
is printed. Inside ``quiet()`` (a phase already announced as a whole, such as the trainer's
first update) the compiles are not announced again. This module imports nothing of the
library, so every floor (learner, rollout) may use it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Callable, Iterator, Sequence

import jax

_lock = threading.Lock()
_say: Callable[..., None] | None = None
_quiet = threading.local()


def set_announcer(say: Callable[..., None] | None) -> None:
    """Print announcements with ``say(line)`` from now on (None: print nothing)."""
    global _say
    _say = say


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """No announcement from this thread inside the block (its caller announces the phase)."""
    before = getattr(_quiet, "on", False)
    _quiet.on = True
    try:
        yield
    finally:
        _quiet.on = before


def quietly(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` inside :func:`quiet` (for a worker thread's whole call)."""
    with quiet():
        return fn(*args, **kwargs)


def shape_key(values: Sequence[Any]) -> tuple:
    """What a jitted function compiles for: ``(shape, dtype)`` of each array leaf of
    ``values`` (dict leaves in key order), the value itself for anything else (a static
    argument)."""
    out: list[Any] = []

    def visit(v: Any) -> None:
        if hasattr(v, "shape") and hasattr(v, "dtype"):
            out.append((tuple(v.shape), str(v.dtype)))
        elif isinstance(v, dict):
            for k in sorted(v):
                out.append(k)
                visit(v[k])
        elif isinstance(v, (tuple, list)):
            out.append(len(v))
            for x in v:
                visit(x)
        else:
            out.append(v)
    visit(list(values))
    return tuple(out)


_compiles = [0]  # XLA compiles in this process since the counter was installed
_counter_installed = [False]


def _count_compile(event: str, _seconds: float, **_kwargs: Any) -> None:
    if event == "/jax/core/compile/backend_compile_duration":
        with _lock:
            _compiles[0] += 1


def compile_count() -> int:
    """XLA compiles in this process, on every thread, since the first call of this function
    (JAX's ``backend_compile_duration`` monitoring event, which a program loaded from the
    persistent compilation cache raises too: every new executable counts; jit's in-memory
    cache hits do not). The difference of two calls counts the compiles between them."""
    with _lock:
        if not _counter_installed[0]:
            jax.monitoring.register_event_duration_secs_listener(_count_compile)
            _counter_installed[0] = True
        return _compiles[0]


def format_seconds(seconds: float) -> str:
    """``"42.0 s"``, ``"3 min 05 s"``, ``"1 h 02 min"``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


class Announced:
    """``fn`` (a jitted function) whose first call per shape key (outside a trace) is announced as
    ``"compiling <what>"``. ``key_args``: the positions of the arguments that decide the
    compiled shape (the others, e.g. the weights, keep theirs from call to call and are not
    looked at); ``describe(args) -> str``: the announcement's text, e.g. ``"the train step
    for length 1024"``."""

    def __init__(self, fn: Callable[..., Any], key_args: Sequence[int],
                 describe: Callable[[tuple], str]):
        self.fn, self.key_args, self.describe = fn, tuple(key_args), describe
        self.seen: set[tuple] = set()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        keyed = [args[i] for i in self.key_args if i < len(args)]
        if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(keyed)):
            return self.fn(*args, **kwargs)  # traced inside another function: no compile here
        key = shape_key(keyed)
        with _lock:
            new = key not in self.seen
            self.seen.add(key)
        say = _say
        if not new or say is None or getattr(_quiet, "on", False):
            return self.fn(*args, **kwargs)
        what = f"compiling {self.describe(args)}"
        say(f"{what} ...")
        t0 = time.monotonic()
        out = self.fn(*args, **kwargs)
        say(f"{what} ... done in {format_seconds(time.monotonic() - t0)}")
        return out

    def __getattr__(self, name: str) -> Any:  # lower(), eval_shape(), ... of the jitted fn
        return getattr(self.fn, name)


def compile_ahead(calls: Sequence[tuple[Callable[..., Any], tuple]],
                  workers: int | None = None) -> int:
    """Compile ``fn(*args)`` for every ``(fn, args)`` of ``calls`` without running it, all at
    once on ``workers`` threads (default: one per call, at most the CPU count); returns the
    number compiled. ``fn`` is a jitted function (or an :class:`Announced` one): its
    ``lower(*args).compile()`` fills jit's own cache, so the first real call with those shapes
    runs without compiling. XLA compiles outside the GIL, so distinct shapes (an engine's prefill
    buckets) compile side by side instead of one after another. Nothing is donated or
    changed: the arguments may be the live buffers a later call will use."""
    return len(compile_ahead_timed(calls, workers))


def compile_ahead_timed(calls: Sequence[tuple[Callable[..., Any], tuple]],
                        workers: int | None = None) -> list[float]:
    """:func:`compile_ahead`, returning the seconds each call's ``lower().compile()`` took
    (in ``calls``' order; with several threads they overlap, so their sum exceeds the wall
    time, which is about the longest of them when the CPU has a core per thread).

    A failure of one call is raised here (the first failing call's, in ``calls``' order) once
    every thread has finished: the others compile to the end, none is left running."""
    import concurrent.futures
    import os

    def one(call: tuple[Callable[..., Any], tuple]) -> float:
        fn, args = call
        t0 = time.monotonic()
        with quiet():
            fn.lower(*args).compile()
        return time.monotonic() - t0

    calls = list(calls)
    if not calls:
        return []
    n = workers or min(len(calls), os.cpu_count() or 1)
    if n <= 1:
        return [one(call) for call in calls]
    with concurrent.futures.ThreadPoolExecutor(n, thread_name_prefix="compile") as pool:
        futures = [pool.submit(one, call) for call in calls]
    # the pool's exit waited for every call; result() re-raises a call's failure
    return [f.result() for f in futures]
