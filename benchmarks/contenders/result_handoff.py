"""Handing finished requests from the engine thread to the event loop: one thread-safe future
per request (today) vs one event-loop callback per delivery batch.

Today ``Engine.generate_n`` awaits ``asyncio.wrap_future`` of a ``concurrent.futures.Future``
that the engine thread resolves with ``set_result`` as each request finishes
(``Scheduler.deliver``): per request, the future's callback runs on the engine thread and calls
``loop.call_soon_threadsafe``, which writes a byte to the loop's self-pipe; the loop wakes,
reads it, copies the result into the asyncio future and resumes the episode. The contender: the
engine thread hands a whole delivery batch over with one ``call_soon_threadsafe``, whose
callback sets the batch's asyncio futures on the loop.

No model: ``--episodes`` coroutines each make ``--turns`` requests in a row (a request, await
its result, a little host work), against a stand-in engine thread that every ``--step-ms``
milliseconds (the device's decode call) takes the requests queued so far and finishes them
together, one delivery batch a step. Both hand-offs run in this process, alternately,
``--rounds`` times each; reported per turn: the event-loop thread's CPU (``thread_time``), the
engine thread's CPU, and the wall time of the whole collect.

    python benchmarks/contenders/result_handoff.py [--episodes 256] [--turns 6] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import statistics
import threading
import time
from typing import Any

HANDOFFS = ("future_per_request", "callback_per_batch")


class StandInEngine:
    """A thread that finishes every queued request once per step (``step_s`` of sleep, as a
    device call), handing results over with ``handoff``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, handoff: str, step_s: float):
        self.loop, self.handoff, self.step_s = loop, handoff, step_s
        self._queue: list[tuple[Any, int]] = []
        self._lock = threading.Condition()
        self._stop = False
        self.cpu_s = 0.0
        self.batches = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def submit(self, payload: int) -> Any:
        """The awaitable of one request's result (``payload + 1``)."""
        if self.handoff == "future_per_request":
            future: Any = concurrent.futures.Future()
            waiter = asyncio.wrap_future(future, loop=self.loop)
        else:
            future = waiter = self.loop.create_future()
        with self._lock:
            self._queue.append((future, payload))
            self._lock.notify()
        return waiter

    def _run(self) -> None:
        c0 = time.thread_time()
        while True:
            with self._lock:
                while not self._queue and not self._stop:
                    self._lock.wait()
                if self._stop:
                    break
            time.sleep(self.step_s)  # the device call; the requests that came meanwhile join
            with self._lock:
                batch, self._queue = self._queue, []
            self.batches += 1
            if self.handoff == "future_per_request":
                for future, payload in batch:
                    future.set_result(payload + 1)
            else:
                self.loop.call_soon_threadsafe(_set_all, batch)
        self.cpu_s = time.thread_time() - c0

    def close(self) -> None:
        with self._lock:
            self._stop = True
            self._lock.notify()
        self._thread.join()


def _set_all(batch: list[tuple[asyncio.Future, int]]) -> None:
    for future, payload in batch:
        if not future.done():  # a cancelled waiter is skipped
            future.set_result(payload + 1)


async def collect(handoff: str, episodes: int, turns: int, step_s: float) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    engine = StandInEngine(loop, handoff, step_s)

    async def episode(seed: int) -> int:
        total = 0
        for turn in range(turns):
            total += await engine.submit(seed * 1000 + turn)
            total += sum(range(50))  # a little host work between turns
        return total

    t0, c0 = time.perf_counter(), time.thread_time()
    results = await asyncio.gather(*(episode(i) for i in range(episodes)))
    wall, loop_cpu = time.perf_counter() - t0, time.thread_time() - c0
    engine.close()
    expected = sum(sum(i * 1000 + t + 1 + sum(range(50)) for t in range(turns))
                   for i in range(episodes))
    assert sum(results) == expected, handoff
    n = episodes * turns
    return {"wall_s": wall, "loop_cpu_us_per_turn": 1e6 * loop_cpu / n,
            "engine_cpu_us_per_turn": 1e6 * engine.cpu_s / n, "batches": engine.batches}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--episodes", type=int, default=256)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--step-ms", type=float, default=3.0)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    runs: dict[str, list[dict]] = {h: [] for h in HANDOFFS}
    for _ in range(args.rounds):
        for handoff in HANDOFFS:
            runs[handoff].append(asyncio.run(collect(handoff, args.episodes, args.turns,
                                                     args.step_ms / 1e3)))
    report = {"settings": vars(args), "nproc": os.cpu_count(), "runs": runs, "medians": {}}
    print(f"{args.episodes} episodes x {args.turns} turns, a {args.step_ms} ms step, "
          f"{args.rounds} alternating rounds, medians\n")
    print("| hand-off | wall s | event loop CPU us / turn | engine thread CPU us / turn "
          "| batches |")
    print("|---|---|---|---|---|")
    for handoff in HANDOFFS:
        med = {k: statistics.median(r[k] for r in runs[handoff]) for k in runs[handoff][0]}
        report["medians"][handoff] = med
        print(f"| {handoff} | {med['wall_s']:.3f} | {med['loop_cpu_us_per_turn']:.1f} | "
              f"{med['engine_cpu_us_per_turn']:.1f} | {med['batches']:.0f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return report


if __name__ == "__main__":
    main()
