"""Environment instances kept after their session closed, for the next ``/create``.

A family whose instances are expensive to start and can play any task after a ``reset`` (a
MiniWoB++ instance owns a headless Chromium, whose start costs far more than a reset onto
another task: docs/PERFORMANCE.md, "MiniWoB++: reused browsers") declares
``Family.reuse_instances``.
Its server then keeps a closed session's instance here instead of closing it, and the next
``/create`` resets that instance onto its task instead of starting a new one. An agent that
plays one episode per session (create, steps, close) then starts one browser per concurrent
episode, not one per episode.

The pool never holds more than ``limit`` instances and hands out the most recently released
one first. Live sessions plus spare instances never exceed the server's ``max_sessions``: a new
instance is made only when no spare is left, and a close moves one instance from live to spare.
"""

from __future__ import annotations

import time
from typing import Callable

from environments.core.base import TextEnvironment


class SpareInstances:
    """Idle environment instances, at most ``limit`` (0: none are kept)."""

    def __init__(self, limit: int, clock: Callable[[], float] = time.monotonic) -> None:
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        self.limit = limit
        self._clock = clock
        self._idle: list[tuple[TextEnvironment, float]] = []  # (instance, released at)

    def __len__(self) -> int:
        return len(self._idle)

    def take(self) -> TextEnvironment | None:
        """The most recently released instance (removed from the pool), or None."""
        return self._idle.pop()[0] if self._idle else None

    def offer(self, env: TextEnvironment) -> bool:
        """Keep ``env`` for a later ``take``; False when the pool is full (the caller closes it)."""
        if len(self._idle) >= self.limit:
            return False
        self._idle.append((env, self._clock()))
        return True

    def expired(self, idle_timeout: float) -> list[TextEnvironment]:
        """Remove and return the instances idle for longer than ``idle_timeout`` seconds."""
        now = self._clock()
        old = [env for env, released in self._idle if now - released > idle_timeout]
        self._idle = [(env, t) for env, t in self._idle if now - t <= idle_timeout]
        return old

    def drain(self) -> list[TextEnvironment]:
        """Remove and return every instance (server shutdown)."""
        envs = [env for env, _ in self._idle]
        self._idle = []
        return envs


__all__ = ["SpareInstances"]
