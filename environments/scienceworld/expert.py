"""The ScienceWorld expert: each task variation's gold action sequence, from the package.

The HTTP server loads tasks without gold paths (generating one costs time), so the expert keeps
its own simulator (one JVM, started on first use, shared by the process and serialised by a
lock), loads the task with ``generateGoldPath=True`` and reads the sequence. ScienceWorld
variations are deterministic, so the sequence solves the server's episode of the same task id
(with the same simplification string).
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from environments.scienceworld.catalog import parse_task_id

_LOCK = threading.Lock()
_SIM: list[Any] = []  # the expert's simulator, started lazily


def _simulator() -> Any:
    if not _SIM:
        from environments.scienceworld.pool import start_simulator

        _SIM.append(start_simulator())
    return _SIM[0]


@functools.lru_cache(maxsize=4096)
def gold_path(task_id: str, simplifications: str = "") -> tuple[str, ...]:
    """The gold action sequence of ``task_id`` (``"boil/var=21"``)."""
    name, variation = parse_task_id(task_id)
    with _LOCK:
        sim = _simulator()
        sim.load(name, variation, simplifications, generateGoldPath=True)
        return tuple(str(a) for a in sim.get_gold_action_sequence())


def shutdown() -> None:
    """Stop the expert's simulator (if it was started)."""
    from environments.scienceworld.pool import stop_simulator

    with _LOCK:
        while _SIM:
            stop_simulator(_SIM.pop())


class ScienceWorldExpertPolicy:
    """The task's gold action sequence, one action a turn (not interruptible: see the module
    docstring)."""

    interruptible = False

    def __init__(self, task_id: str):
        self.actions = list(gold_path(task_id))

    def act(self, observation: str) -> str | None:
        return self.actions.pop(0) if self.actions else None
