"""Live environment instances of one server and the counters behind ``GET /stats``."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import secrets
import time

from environments.core.base import TextEnvironment


@dataclasses.dataclass(eq=False)
class Session:
    """One environment instance and its episode state.

    ``lock`` serializes the calls made on this instance; ``finished`` is set once an episode has
    ended (done or truncated) so that a further step is refused until the next reset.
    """

    env_id: str
    env: TextEnvironment
    task_id: str
    seed: int | None
    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    last_used: float = dataclasses.field(default_factory=time.monotonic)
    finished: bool = False
    closed: bool = False
    steps: int = 0
    failed: bool = False  # a reset or step of this instance raised: never reuse it
    list_actions: int = 0  # > 0: append up to this many valid actions to each observation
    # False: no action list in the observation text (``listed_actions`` in info only); the
    # instance is told too (``TextEnvironment.action_text``), for families that list their own
    action_text: bool = True

    def touch(self) -> None:
        """Mark the session as used now (for idle reaping)."""
        self.last_used = time.monotonic()


@dataclasses.dataclass
class Stats:
    """Counters served by ``GET /stats``."""

    started: float = dataclasses.field(default_factory=time.monotonic)
    sessions_created: int = 0
    sessions_closed: int = 0
    sessions_reaped: int = 0
    sessions_reused: int = 0  # creates served by a spare instance (Family.reuse_instances)
    spares_replaced: int = 0  # spares that failed their reset and were replaced by a new instance
    steps: int = 0
    resets: int = 0
    batches: int = 0
    invalid_actions: int = 0
    errors: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    def as_dict(self) -> dict:
        return {
            "uptime_s": round(time.monotonic() - self.started, 3),
            "sessions_created": self.sessions_created,
            "sessions_closed": self.sessions_closed,
            "sessions_reaped": self.sessions_reaped,
            "sessions_reused": self.sessions_reused,
            "spares_replaced": self.spares_replaced,
            "steps": self.steps,
            "resets": self.resets,
            "batches": self.batches,
            "invalid_actions": self.invalid_actions,
            "errors_total": sum(self.errors.values()),
            "errors": {str(status): n for status, n in sorted(self.errors.items())},
        }


class CapacityError(Exception):
    """No free session slot (the server answers 503)."""


class SessionTable:
    """The id -> session map with a capacity limit that also counts creations in progress."""

    def __init__(self, max_sessions: int) -> None:
        if max_sessions < 1:
            raise ValueError("max_sessions must be >= 1")
        self.max_sessions = max_sessions
        self._sessions: dict[str, Session] = {}
        self._pending = 0

    def __len__(self) -> int:
        return len(self._sessions)

    @property
    def pending(self) -> int:
        """Creations that hold a slot but have not finished."""
        return self._pending

    def reserve(self) -> None:
        """Hold a slot for a session being created; raises ``CapacityError`` when full."""
        if len(self._sessions) + self._pending >= self.max_sessions:
            raise CapacityError(f"capacity reached ({self.max_sessions} sessions)")
        self._pending += 1

    def release(self) -> None:
        """Give back a slot held by ``reserve`` (call it whether or not the creation worked)."""
        self._pending -= 1

    def add(self, env: TextEnvironment, task_id: str, seed: int | None) -> Session:
        """Store a new session under a fresh random id (its slot was reserved beforehand)."""
        env_id = secrets.token_hex(8)
        while env_id in self._sessions:  # pragma: no cover - 64 random bits
            env_id = secrets.token_hex(8)
        session = Session(env_id=env_id, env=env, task_id=task_id, seed=seed)
        self._sessions[env_id] = session
        return session

    def get(self, env_id: str) -> Session | None:
        return self._sessions.get(env_id)

    def pop(self, env_id: str) -> Session | None:
        return self._sessions.pop(env_id, None)

    def pop_all(self) -> list[Session]:
        sessions = list(self._sessions.values())
        self._sessions.clear()
        return sessions

    def idle(self, idle_timeout: float) -> list[Session]:
        """Sessions unused for longer than ``idle_timeout`` seconds and not in a call now."""
        deadline = time.monotonic() - idle_timeout
        return [s for s in self._sessions.values() if s.last_used < deadline and not s.lock.locked()]
