"""agentrl_common/loop_clock.py: the event loop's CPU seconds by callback, against the thread's
own CPU clock read around known work."""

from __future__ import annotations

import asyncio
import asyncio.events
import gc
import threading
import time

import pytest

from agentrl_common.loop_clock import LoopCallbackClock

BURN_S = 0.02  # CPU seconds a burner step spends
STEPS = 5


def burn(seconds: float) -> None:
    """Spin until this thread has used ``seconds`` of CPU."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


async def burner() -> None:
    for _ in range(STEPS):
        burn(BURN_S)
        await asyncio.sleep(0)


async def sleeper() -> None:
    for _ in range(STEPS):
        await asyncio.sleep(0.01)


def plain_callback(done: asyncio.Future) -> None:
    burn(BURN_S)
    done.set_result(None)


async def workload() -> None:
    done = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_soon(plain_callback, done)
    await asyncio.gather(burner(), sleeper(), done)


def test_each_callback_is_charged_the_cpu_it_used():
    """The burner's steps are charged at least the CPU they burned and no more than the loop
    thread used in all; the sleeper (no work) almost nothing; a plain ``call_soon`` callback
    is named by its function."""
    original = asyncio.events.Handle._run
    clock = LoopCallbackClock()
    gc.disable()  # a full collection of the test process's heap would land in some callback
    try:
        cpu0 = time.thread_time()
        with clock:
            asyncio.run(workload())
        thread_cpu = time.thread_time() - cpu0
    finally:
        gc.enable()
    assert asyncio.events.Handle._run is original  # restored
    burner_s, calls = clock.cpu_s["task:burner"], clock.calls["task:burner"]
    assert STEPS * BURN_S <= burner_s <= thread_cpu
    assert calls >= STEPS + 1
    assert clock.cpu_s["task:sleeper"] < BURN_S
    assert BURN_S <= clock.cpu_s["plain_callback"] <= thread_cpu - burner_s
    assert clock.total_s <= thread_cpu
    assert [row["name"] for row in clock.top(2)] == ["task:burner", "plain_callback"]


def test_callbacks_of_another_threads_loop_are_not_counted():
    """A loop running in another thread while the clock is on: its burner is not charged."""
    clock = LoopCallbackClock()
    with clock:
        other = threading.Thread(target=lambda: asyncio.run(burner()))
        other.start()
        other.join()
        asyncio.run(sleeper())
    assert "task:burner" not in clock.cpu_s
    assert clock.calls["task:sleeper"] >= STEPS


def test_one_clock_at_a_time():
    with LoopCallbackClock():
        with pytest.raises(RuntimeError, match="another LoopCallbackClock"):
            LoopCallbackClock().__enter__()
