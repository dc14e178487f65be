"""The engine thread: takes work from the inbox, runs commands between steps, runs scheduling
steps while there are requests, hands finished results over when it goes idle, and recovers
from a failed step (``failures.py``) so the thread never dies.

:class:`EngineLoop` owns the ``threading.Thread``; its collaborators own everything else.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from agentrl_jax.rollout.engine.failures import FailurePolicy
from agentrl_jax.rollout.engine.inbox import EngineInbox
from agentrl_jax.rollout.engine.kv_memory import KVCacheMemory
from agentrl_jax.rollout.engine.requests import EngineStats
from agentrl_jax.rollout.engine.scheduler import Scheduler

log = logging.getLogger(__name__)


class EngineLoop:
    """The engine's background thread (``thread``, started by ``start``). ``allocate_cache``:
    allocates a released KV cache (and what goes with it) before a step that needs it."""

    def __init__(self, inbox: EngineInbox, scheduler: Scheduler, failures: FailurePolicy,
                 kv: KVCacheMemory, stats: EngineStats, allocate_cache: Callable[[], int]):
        self._inbox = inbox
        self._scheduler = scheduler
        self._failures = failures
        self._kv = kv
        self._stats = stats
        self._allocate_cache = allocate_cache
        self.thread = threading.Thread(target=self._run, name="agentrl-engine", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def alive(self) -> bool:
        return self.thread.is_alive()

    def join(self, timeout: float) -> None:
        """Wait for the thread to end (not from the thread itself)."""
        if threading.current_thread() is not self.thread:
            self.thread.join(timeout=timeout)

    def _busy(self) -> bool:
        return self._scheduler.busy

    def _run(self) -> None:
        inbox, scheduler, stats = self._inbox, self._scheduler, self._stats
        while True:
            if scheduler.deliveries:
                with inbox.cv:
                    idle = inbox.idle(scheduler.busy)
                if idle:  # no device call will launch: hand over what finished (outside the
                    scheduler.deliver()  # lock: a result's callbacks may submit again)
            work = inbox.wait_for_work(self._busy)
            if work is None:
                break
            commands, incoming, waited = work
            stats.idle_time_s += waited
            scheduler.enqueue(incoming)
            for fn, future in commands:
                try:
                    future.set_result(fn())
                except BaseException as e:  # noqa: BLE001 -- reported to the caller
                    future.set_exception(e)
            if inbox.paused:
                continue
            t0 = time.perf_counter()
            try:
                self._step()
            except Exception as e:  # noqa: BLE001 -- never let the engine thread die
                log.exception("engine step failed")
                self._failures.recover(e)
            stats.step_time_s += time.perf_counter() - t0
        self._failures.shutdown()

    def _step(self) -> None:
        if self._kv.released:  # (release_kv_cache while the engine was idle)
            if not self._scheduler.waiting:  # woken by a command only: stay released
                return
            self._allocate_cache()
        self._scheduler.step()


__all__ = ["EngineLoop"]
