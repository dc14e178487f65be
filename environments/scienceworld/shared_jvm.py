"""Several ScienceWorld worlds in one JVM, their calls taken one at a time.

A simulator of the pool holds one episode for its whole length, so a rollout has at most as many
episodes in flight as the pool has simulators, and each JVM sits idle while its episode waits for
the model. A JVM costs ~0.2 GB at start and grows with use (`docs/PERFORMANCE.md`), so a
16-core, 128 GB machine cannot start one per episode of a 128-episode step. One JVM can hold
many worlds: each ``scienceworld.runtime.pythonapi.PythonInterface`` is a world of its own.
A :class:`JvmHost` takes its worlds' calls one at a time under its lock: without it, worlds
stepped from several threads at once diverge from a fresh JVM's play far more often (5 of 8
action traces against 2 of 8 interleaved one call at a time: the order of the objects a room
lists depends on the JVM's history, as in a reused JVM). Interleaved that way, the gold paths of
12 tasks played a turn of each in turn in 12 worlds of one JVM all finish with score 100
(``benchmarks/speed/sciworld_shared_jvm.py``, ``results/sciworld_shared_jvm/``;
``tests/test_env_scienceworld.py`` checks three).

:class:`SharedJvms` gives :class:`~environments.scienceworld.pool.SimulatorPool` its ``factory``
and ``stopper``: a pool of ``size`` worlds on ``ceil(size / worlds_per_jvm)`` JVMs, each JVM
started when a world needs room and stopped when its last world is discarded.
"""

from __future__ import annotations

import threading
from typing import Any, Callable


class _Serialized:
    """A Java object whose method calls hold ``lock`` (one call at a time in its JVM)."""

    def __init__(self, target: Any, lock: threading.Lock) -> None:
        self._target = target
        self._lock = lock

    def __getattr__(self, name: str) -> Callable[..., Any]:
        member = getattr(self._target, name)

        def call(*args: Any) -> Any:
            with self._lock:
                return member(*args)

        return call


class JvmHost:
    """One JVM (a ``scienceworld.ScienceWorldEnv`` started by ``start_jvm``) and the lock its
    worlds' calls share."""

    def __init__(self, jvm: Any) -> None:
        self.jvm = jvm
        self.lock = threading.Lock()
        self.worlds = 0  # live worlds in this JVM
        self.broken = False  # a world of it raised: no new worlds here

    def new_interface(self) -> Any:
        """A fresh world (``PythonInterface``) in this JVM."""
        with self.lock:
            return self.jvm._gateway.jvm.scienceworld.runtime.pythonapi.PythonInterface()


class World:
    """One world in a shared JVM, with the part of ``scienceworld.ScienceWorldEnv`` the
    environment uses: ``server`` (the ``PythonInterface``, calls serialised) and ``load``.
    ``_gateway`` is the JVM's (``pool.java_pid``; ``valid_actions.valid_action_list`` joins the
    valid actions through it)."""

    def __init__(self, host: JvmHost) -> None:
        self.host = host
        self.server = _Serialized(host.new_interface(), host.lock)
        self._gateway = host.jvm._gateway

    def load(self, task_name: str, variation: int, simplifications: str = "",
             generateGoldPath: bool = False) -> None:  # noqa: N803 (the package's keyword)
        """Load ``task_name`` (a catalog name) at ``variation``, as ``ScienceWorldEnv.load``."""
        self.server.load(task_name, int(variation), simplifications, bool(generateGoldPath))


class SharedJvms:
    """Worlds for a :class:`SimulatorPool`, at most ``worlds_per_jvm`` to a JVM.

    start_jvm / stop_jvm: how to start and stop a JVM (``pool.start_simulator`` /
    ``pool.stop_simulator``; tests pass fakes).
    """

    def __init__(self, worlds_per_jvm: int, start_jvm: Callable[[], Any],
                 stop_jvm: Callable[[Any], None]) -> None:
        if worlds_per_jvm < 1:
            raise ValueError("worlds_per_jvm must be >= 1")
        self.worlds_per_jvm = worlds_per_jvm
        self._start_jvm = start_jvm
        self._stop_jvm = stop_jvm
        self._lock = threading.Lock()
        self._hosts: list[JvmHost] = []
        self.jvms_started = 0

    def factory(self) -> World:
        """A new world, in a JVM with room (a new JVM when none has)."""
        with self._lock:
            host = next((h for h in self._hosts
                         if not h.broken and h.worlds < self.worlds_per_jvm), None)
            if host is not None:
                host.worlds += 1
        if host is None:
            host = JvmHost(self._start_jvm())  # outside the lock: a JVM takes seconds
            host.worlds = 1
            with self._lock:
                self._hosts.append(host)
                self.jvms_started += 1
        try:
            return World(host)
        except BaseException:
            self.stopper_of(host, broken=True)
            raise

    def stopper(self, world: World) -> None:
        """A world discarded by the pool (it raised, or the pool shuts down): its JVM takes no
        new worlds, and is stopped once its last world is gone."""
        self.stopper_of(world.host, broken=True)

    def stopper_of(self, host: JvmHost, broken: bool) -> None:
        with self._lock:
            host.worlds -= 1
            host.broken = host.broken or broken
            stop = host.worlds <= 0
            if stop:
                self._hosts.remove(host)
        if stop:
            self._stop_jvm(host.jvm)

    def live_jvms(self) -> int:
        with self._lock:
            return len(self._hosts)
