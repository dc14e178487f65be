"""What crosses from the callers' threads to the engine thread: new requests, commands (run on
the engine thread between steps), the pause / close flags and the table of requests in flight.

:class:`EngineInbox` owns that state and the condition variable that guards it. Callers
(``Engine.submit``, ``abort``, ``pause`` ...) put work in from any thread; the engine thread
takes it out (``wait_for_work``) and reports requests that leave (``finished``, ``dequeued``).
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Any, Callable

from agentrl_jax.rollout.contract import (BackendUnavailableError, InvalidRequestError,
                                          OverloadedError)
from agentrl_jax.rollout.engine.requests import Request

Command = tuple[Callable[[], Any], concurrent.futures.Future]


class EngineInbox:
    """The engine's admission queue and command queue.

    Owns (guarded by ``cv``): ``incoming`` requests not yet seen by the engine thread,
    ``commands`` (function, future) pairs, ``requests`` (rid -> request, from ``submit`` until
    its result or failure), ``num_waiting`` (admitted to the queue, not yet given slots; bounded
    by ``max_queue``, public: a new engine config may change it), and the flags ``paused``, ``closed`` and ``error`` (why the engine
    cannot serve any more). ``cv`` is public so a profiler can clock its waits
    (benchmarks/speed/rollout_profile.py).
    """

    def __init__(self, max_queue: int):
        self.cv = threading.Condition()
        self.max_queue = max_queue
        self._incoming: list[Request] = []
        self._commands: list[Command] = []
        self._requests: dict[str, Request] = {}
        self._num_waiting = 0
        self._paused = False
        self._closed = False
        self.error: str | None = None

    # ------------------------------------------------------------------- callers' threads
    @property
    def num_waiting(self) -> int:
        return self._num_waiting

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def closed(self) -> bool:
        return self._closed

    def is_running(self, rid: str) -> bool:
        """Whether request ``rid`` was submitted and has no result or failure yet."""
        with self.cv:
            return rid in self._requests

    def submit(self, req: Request) -> None:
        """Queue ``req`` for the engine thread. Raises ``BackendUnavailableError`` (closed or
        failed engine), ``InvalidRequestError`` (its rid is running) or ``OverloadedError``
        (``max_queue`` requests wait already)."""
        with self.cv:
            if self._closed:
                raise BackendUnavailableError("the engine is closed")
            if self.error is not None:
                raise BackendUnavailableError(f"the engine failed: {self.error}")
            if req.rid in self._requests:
                raise InvalidRequestError(f"a request with rid {req.rid!r} is already running")
            if self._num_waiting + 1 > self.max_queue:
                raise OverloadedError(
                    f"admission queue full ({self._num_waiting} requests waiting, "
                    f"max_queue={self.max_queue}); retry later")
            self._num_waiting += 1
            self._requests[req.rid] = req
            self._incoming.append(req)
            self.cv.notify()

    def mark_aborted(self, rid: str, command: Callable[[Request], Any]) -> bool:
        """Flag request ``rid`` aborted and queue ``command(request)`` for the engine thread;
        False when the request is not running."""
        with self.cv:
            req = self._requests.get(str(rid))
            if req is None:
                return False
            req.aborted = True
            self._commands.append((lambda: command(req), concurrent.futures.Future()))
            self.cv.notify()
        return True

    def running_ids(self) -> list[str]:
        with self.cv:
            return list(self._requests)

    def command(self, fn: Callable[[], Any], quiet_when_closed: bool = False
                ) -> concurrent.futures.Future | None:
        """Run ``fn`` on the engine thread between steps; the future gets its result. Raises
        ``BackendUnavailableError`` once closed (returns ``None`` instead with
        ``quiet_when_closed``)."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self.cv:
            if self._closed:
                if quiet_when_closed:
                    return None
                raise BackendUnavailableError("the engine is closed")
            self._commands.append((fn, future))
            self.cv.notify()
        return future

    def set_paused(self, paused: bool) -> None:
        with self.cv:
            self._paused = paused
            self.cv.notify()

    def close(self) -> bool:
        """Ask the engine thread to stop; False when already closed."""
        with self.cv:
            if self._closed:
                return False
            self._closed = True
            self.cv.notify()
        return True

    # ------------------------------------------------------------------------ engine thread
    def idle(self, busy: bool) -> bool:
        """Nothing for the engine thread to do, given whether it has requests of its own
        (``busy``); call with ``cv`` held."""
        return not self._closed and not self._commands and (
            self._paused or not (self._incoming or busy))

    def wait_for_work(self, busy: Callable[[], bool]
                      ) -> tuple[list[Command], list[Request], float] | None:
        """Block until there is work; ``(commands, incoming requests, seconds waited)``, or
        ``None`` once closed."""
        waited = 0.0
        with self.cv:
            while self.idle(busy()):
                t0 = time.perf_counter()
                self.cv.wait()
                waited += time.perf_counter() - t0
            if self._closed:
                return None
            commands, self._commands = self._commands, []
            incoming, self._incoming = self._incoming, []
        return commands, incoming, waited

    def dequeued(self) -> None:
        """A request left the waiting queue (it got its slots, or was aborted / failed)."""
        with self.cv:
            self._num_waiting -= 1

    def finished(self, rid: str) -> None:
        """Request ``rid`` has its result (or error): it is no longer running."""
        with self.cv:
            self._requests.pop(rid, None)

    def take_all(self, reset_waiting: bool = True) -> list[Request]:
        """Every running request, forgotten (the engine fails them); with ``reset_waiting``
        no request counts as waiting any more."""
        with self.cv:
            requests = list(self._requests.values())
            self._requests.clear()
            if reset_waiting:
                self._num_waiting = 0
        return requests

    def take_commands(self) -> list[Command]:
        with self.cv:
            commands, self._commands = self._commands, []
        return commands


__all__ = ["Command", "EngineInbox"]
