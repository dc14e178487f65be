"""Several ScienceWorld worlds to a JVM (``environments/scienceworld/shared_jvm.py``) on fake
JVMs: how many JVMs start and stop, and one call at a time per JVM (fake Java objects that
record overlaps). The real-JVM tests (interleaved episodes in one JVM solve their tasks with the
gold paths of a separate simulator) are in ``tests/test_env_scienceworld.py``, whose other tests
count the machine's JVMs and so must not run beside them."""

from __future__ import annotations

import threading
import time
import types

import pytest

from environments.scienceworld.pool import SimulatorPool
from environments.scienceworld.shared_jvm import SharedJvms


class FakeInterface:
    """A ``PythonInterface`` stand-in: ``step`` sleeps and records how many calls of its JVM
    ran at once; ``meet`` waits until as many calls as ``jvm.meeting`` has parties are inside."""

    def __init__(self, jvm: "FakeJvm") -> None:
        self.jvm = jvm

    def step(self, action: str) -> str:
        with self.jvm.count_lock:
            self.jvm.running += 1
            self.jvm.most = max(self.jvm.most, self.jvm.running)
        time.sleep(0.02)
        with self.jvm.count_lock:
            self.jvm.running -= 1
        return f"did {action}"

    def meet(self) -> None:
        self.jvm.meeting.wait(timeout=10)  # BrokenBarrierError when the other call never comes


MEETING = threading.Barrier(2)  # shared by every fake JVM: two calls from two JVMs meet


class FakeJvm:
    """A started ``scienceworld.ScienceWorldEnv`` stand-in: only
    ``_gateway.jvm...PythonInterface``."""

    def __init__(self) -> None:
        self.stopped = 0
        self.running = self.most = 0
        self.count_lock = threading.Lock()
        self.meeting = MEETING
        api = types.SimpleNamespace(PythonInterface=lambda: FakeInterface(self))
        runtime = types.SimpleNamespace(pythonapi=api)
        self._gateway = types.SimpleNamespace(
            jvm=types.SimpleNamespace(scienceworld=types.SimpleNamespace(runtime=runtime)))


def fake_pool(size: int, worlds_per_jvm: int) -> tuple[SimulatorPool, SharedJvms, list[FakeJvm]]:
    started: list[FakeJvm] = []

    def start() -> FakeJvm:
        started.append(FakeJvm())
        return started[-1]

    def stop(jvm: FakeJvm) -> None:
        jvm.stopped += 1

    jvms = SharedJvms(worlds_per_jvm, start, stop)
    return SimulatorPool(size, factory=jvms.factory, stopper=jvms.stopper), jvms, started


def test_worlds_fill_each_jvm_before_the_next_starts():
    pool, jvms, started = fake_pool(size=7, worlds_per_jvm=3)
    worlds = [pool.acquire() for _ in range(7)]
    assert len(started) == 3 and jvms.live_jvms() == 3  # ceil(7 / 3)
    per_jvm = [sum(w.host.jvm is j for w in worlds) for j in started]
    assert per_jvm == [3, 3, 1]
    for world in worlds:
        pool.release(world)
    again = [pool.acquire() for _ in range(7)]  # reused: no new JVM
    assert len(started) == 3 and {id(w) for w in again} == {id(w) for w in worlds}
    for world in again:
        pool.release(world)
    pool.shutdown()
    assert [j.stopped for j in started] == [1, 1, 1] and jvms.live_jvms() == 0


def test_a_broken_world_closes_its_jvm_to_new_worlds_and_stops_it_with_the_last():
    pool, jvms, started = fake_pool(size=4, worlds_per_jvm=2)
    a, b = pool.acquire(), pool.acquire()
    assert a.host is b.host and len(started) == 1
    pool.release(a, broken=True)
    assert started[0].stopped == 0  # b still lives in it
    c = pool.acquire()  # no room taken in the broken JVM: a new one
    assert c.host is not b.host and len(started) == 2
    pool.release(b, broken=True)
    assert started[0].stopped == 1 and started[1].stopped == 0
    pool.release(c)
    pool.shutdown()
    assert started[1].stopped == 1


def test_calls_are_one_at_a_time_within_a_jvm_and_parallel_across_jvms():
    pool, _, started = fake_pool(size=4, worlds_per_jvm=2)
    worlds = [pool.acquire() for _ in range(4)]
    assert worlds[0].server.step("look") == "did look"

    def play(world):
        for _ in range(5):
            world.server.step("look")

    threads = [threading.Thread(target=play, args=(w,)) for w in worlds]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [j.most for j in started] == [1, 1]  # never two calls at once in one JVM
    # worlds of two JVMs are inside a call at the same time (a lock shared by all JVMs would
    # keep the second out and break the barrier)
    MEETING.reset()
    errors = []

    def meet(world):
        try:
            world.server.meet()
        except threading.BrokenBarrierError as error:
            errors.append(error)

    pair = [threading.Thread(target=meet, args=(w,)) for w in (worlds[0], worlds[2])]
    assert worlds[0].host is not worlds[2].host
    for thread in pair:
        thread.start()
    for thread in pair:
        thread.join()
    assert not errors
    for world in worlds:
        pool.release(world)
    pool.shutdown()


def test_worlds_per_jvm_must_be_positive():
    with pytest.raises(ValueError, match="worlds_per_jvm"):
        SharedJvms(0, FakeJvm, lambda jvm: None)

