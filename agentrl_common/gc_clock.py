"""Python's garbage collector, process-wide: how long it ran (``gc_totals()``), and the start-up
heap moved out of its reach (``freeze_heap()``).

A full (generation-2) collection walks every tracked container of the process; a run that keeps
a step's episodes as Python lists of token ids holds millions of them, so one such collection
in the middle of a timed section (an update's dispatch loop, an engine thread's decode results)
can stop that thread for a large part of a second. ``gc_totals()`` installs one ``gc.callbacks``
listener the first time it is called and returns, from then on, the seconds spent in
collections on any thread and the number of collections of each generation; the difference of
two calls is what ran between them:

    before = gc_totals()
    ...                                   # the section
    seconds, full = gc_totals().since(before)
"""

from __future__ import annotations

import gc
import threading
import time
from dataclasses import dataclass
from typing import Any

_lock = threading.Lock()
_seconds = [0.0]
_counts = [0, 0, 0]  # collections finished, by generation
_started: dict[int, float] = {}  # thread id -> start of the collection it is running
_installed = [False]


@dataclass(frozen=True)
class GcTotals:
    """Collections since the listener was installed: ``seconds`` spent in them (any thread)
    and ``collections[g]`` finished of generation ``g`` (0, 1, 2)."""

    seconds: float
    collections: tuple[int, int, int]

    def since(self, earlier: GcTotals) -> tuple[float, int]:
        """(seconds, full collections) between ``earlier`` and this reading; a full collection
        is one of generation 2, the one that walks every tracked object."""
        return (self.seconds - earlier.seconds,
                self.collections[2] - earlier.collections[2])


def _on_collection(phase: str, info: dict[str, Any]) -> None:
    now = time.perf_counter()
    ident = threading.get_ident()
    with _lock:
        if phase == "start":
            _started[ident] = now
            return
        began = _started.pop(ident, None)
        if began is not None:
            _seconds[0] += now - began
        generation = info.get("generation")
        if isinstance(generation, int) and 0 <= generation < 3:
            _counts[generation] += 1


def gc_totals() -> GcTotals:
    """The collector's totals so far (the first call installs the listener: from then on)."""
    with _lock:
        if not _installed[0]:
            gc.callbacks.append(_on_collection)
            _installed[0] = True
        return GcTotals(_seconds[0], (_counts[0], _counts[1], _counts[2]))


def freeze_heap() -> None:
    """Move the objects made at start-up (modules, compiled functions, a model, catalogs: they
    live as long as the process) out of the collector's generations, so that a full collection
    scans only the objects requests made. Servers call it at start-up; a training run after its
    first step (``training/rl/loop.py``), when the update is compiled and the engine warm.

    Without it a full collection walks the whole start-up heap while holding the GIL, and the
    event loop (and every other thread) waits for it: in a pytest process that had run most of
    the suite (~1M objects) one full collection stalled a ``/health`` probe in CI
    (docs/PERFORMANCE.md). The collector keeps its default thresholds: an environment's closed
    instances are reference cycles (a minigrid level: rooms <-> neighbours, instructions <->
    env), which only the collector frees, and rarer full collections
    (``gc.set_threshold(20_000, 20, 50)`` was tried) let them pile up: BabyAI's RSS grew
    139 -> 208 MB over four create/close storms."""
    gc.collect()
    gc.freeze()
