"""``benchmarks/speed/engine_probe.py`` on the real engine thread (``EngineLoop`` and
``EngineInbox``, a scheduler that only sleeps): the probe's parts (steps + idle waits) equal the
engine's own always-on clocks less the step or wait for work in progress at each snapshot
(``open_s``), which the engine counts only once it ends; hand-timed cases with sleeps."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from agentrl_jax.rollout.engine.engine_loop import EngineLoop
from agentrl_jax.rollout.engine.inbox import EngineInbox
from agentrl_jax.rollout.engine.requests import EngineStats
from benchmarks.speed.engine_probe import EngineProbe, engine_view

STEP_S = 0.2  # one scheduling step of the sleeping scheduler
IDLE_S = 0.3  # a wait for work the test holds open


class _SleepingScheduler:
    """What ``EngineLoop`` and the probe call on a scheduler; ``step`` sleeps ``step_s``."""

    def __init__(self) -> None:
        self.busy = False
        self.deliveries: list = []
        self.step_s = 0.0
        self.in_step = threading.Event()

    def enqueue(self, incoming: list) -> None:
        pass

    def step(self) -> None:
        self.in_step.set()
        time.sleep(self.step_s)
        self.in_step.clear()

    def admit(self) -> None:
        pass

    run_prefill = run_forks = run_decode = deliver = admit


def _wait_until(predicate, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "the engine thread did not get there"
        time.sleep(0.005)


@pytest.fixture
def engine():
    inbox, scheduler, stats = EngineInbox(max_queue=8), _SleepingScheduler(), EngineStats()
    failures = SimpleNamespace(shutdown=lambda: None, recover=lambda e: None)
    loop = EngineLoop(inbox, scheduler, failures, SimpleNamespace(released=False), stats,
                      allocate_cache=lambda: 0)
    loop.start()
    yield SimpleNamespace(scheduler=scheduler, inbox=inbox, loop=loop, stats=stats)
    inbox.close()
    loop.join(timeout=5)


def _wake(engine) -> None:
    """One command: the thread leaves its wait for work, runs it, then one step."""
    engine.inbox.command(lambda: None).result(timeout=5)


def _waiting(engine, probe: EngineProbe) -> bool:
    return probe.wait_base is not None and probe.cond.since is not None


def _engine_clocks(view: dict) -> float:
    return view["engine_step_s"] + view["engine_idle_s"]


def test_a_wait_in_progress_is_open_until_it_ends_then_the_engine_counts_it(engine):
    probe = EngineProbe(engine)
    _wake(engine)  # the thread now waits inside the probe's wrapped wait for work
    _wait_until(lambda: _waiting(engine, probe))
    first = probe.snapshot()
    time.sleep(IDLE_S)
    second = probe.snapshot()
    held = engine_view(first, second)
    # the engine's clocks have not moved; the probe saw the whole wait, and all of it is open
    assert _engine_clocks(held) == 0.0
    assert held["idle_s"] >= IDLE_S  # the two snapshots bracket the sleep
    assert held["open_s"] == pytest.approx(held["parts_s"], abs=1e-3)

    _wake(engine)  # the wait ends: the engine adds all of it, the part before `first` too
    _wait_until(lambda: _waiting(engine, probe))
    third = probe.snapshot()
    ended = engine_view(first, third)
    assert _engine_clocks(ended) > IDLE_S
    assert _engine_clocks(ended) == pytest.approx(ended["parts_s"] - ended["open_s"], abs=0.05)


def test_a_step_in_progress_is_open_until_it_ends(engine):
    probe = EngineProbe(engine)
    engine.scheduler.step_s = STEP_S
    threading.Thread(target=_wake, args=(engine,), daemon=True).start()
    _wait_until(engine.scheduler.in_step.is_set)
    time.sleep(STEP_S / 4)
    first = probe.snapshot()  # inside the step: the probe counts it up to now, the engine not
    _wait_until(lambda: _waiting(engine, probe))
    second = probe.snapshot()
    view = engine_view(first, second)
    # the engine counted the whole step once it ended, the probe its stretch after `first`:
    # the two differ by the stretch before it, at least the test's sleep (lower bounds only)
    assert view["engine_step_s"] >= STEP_S
    assert view["engine_step_s"] - (view["parts_s"] - view["idle_s"]) >= STEP_S / 4
    assert _engine_clocks(view) == pytest.approx(view["parts_s"] - view["open_s"], abs=0.05)
