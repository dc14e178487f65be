"""Soak test of an environment server: many steps over many sessions, resources sampled over time.

Starts a BabyAI server on loopback (or uses ``--url`` + ``--pid``), then runs ``--steps`` steps
spread over ``--sessions`` sessions (``--concurrency`` sessions live at a time; each session is
created, stepped ``steps / sessions`` times with a seeded mix of primitives, macros, checks and
invalid actions, reset when its episode ends, and closed). The server's resident memory (RSS),
open file descriptors and threads are sampled every ``--interval`` seconds from ``/proc``.

Flat means: once the warm-up (the first ``--warmup`` fraction of the sessions, and at least
``--concurrency`` of them, so every client connection is open by then) is over, the final sample
(taken after every session was closed) is within ``--rss-margin-mb`` + ``--rss-margin``
(relative) of the post-warm-up RSS, with at most ``FD_SLACK`` more file descriptors and no more
threads than then.

    python benchmarks/checks/soak_env.py --steps 100000 --sessions 1000 --json soak.json

Exit status 0 when flat, 1 otherwise. ``run_soak`` is what ``tests/test_soak_env.py`` calls.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from environments.core.client import EnvClient, EnvServerError  # noqa: E402
from agentrl_common.processes import start_env_server  # noqa: E402

FD_SLACK = 2  # connections the client's pool may (re)open after the warm-up
PRIMITIVES = ("turn left", "turn right", "move forward", "move forward", "pickup", "toggle", "drop")


@dataclasses.dataclass
class Sample:
    """One reading of the server process."""

    t: float  # seconds since the soak started
    steps: int  # steps answered so far
    sessions_done: int  # sessions closed so far
    rss_mb: float
    fds: int
    threads: int


@dataclasses.dataclass
class SoakReport:
    """What a soak measured, and whether the server's resources stayed flat."""

    steps: int
    sessions: int
    seconds: float
    status_counts: dict[str, int]
    warm: Sample
    final: Sample
    peak_rss_mb: float
    flat: bool
    reasons: list[str]
    samples: list[Sample]

    def summary(self) -> str:
        return (
            f"{self.steps} steps / {self.sessions} sessions in {self.seconds:.1f} s "
            f"({self.steps / max(self.seconds, 1e-9):.0f} steps/s); statuses {self.status_counts}; "
            f"RSS {self.warm.rss_mb:.1f} MB after warm-up -> {self.final.rss_mb:.1f} MB final "
            f"(peak {self.peak_rss_mb:.1f}); fds {self.warm.fds} -> {self.final.fds}; "
            f"threads {self.warm.threads} -> {self.final.threads}; "
            f"{'FLAT' if self.flat else 'NOT FLAT: ' + '; '.join(self.reasons)}"
        )

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["samples"] = [dataclasses.asdict(s) for s in self.samples]
        return out


def read_proc(pid: int) -> tuple[float, int, int]:
    """(RSS in MB, open file descriptors, threads) of process ``pid`` from /proc."""
    rss_kb, threads = 0, 0
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                rss_kb = int(line.split()[1])
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    return rss_kb / 1024, len(os.listdir(f"/proc/{pid}/fd")), threads


def babyai_action(rng: random.Random, available: list[str]) -> str:
    """45% primitive, 35% a listed macro, 10% check, 10% invalid text."""
    r = rng.random()
    if r < 0.45:
        return rng.choice(PRIMITIVES)
    if r < 0.80:
        macros = [a for a in available if a.startswith(("go ", "pick up "))]
        return rng.choice(macros) if macros else "move forward"
    if r < 0.90:
        return "check available actions"
    return "jump over the wall"


class _Soak:
    """The load: a queue of sessions worked off by ``concurrency`` tasks."""

    def __init__(self, client: EnvClient, pid: int, sessions: int, steps_per_session: int, seed: int) -> None:
        self.client, self.pid = client, pid
        self.sessions, self.steps_per_session = sessions, steps_per_session
        self.seed = seed
        self.steps = 0
        self.sessions_done = 0
        self.statuses: dict[str, int] = {}
        self.samples: list[Sample] = []
        self.started = time.monotonic()

    def sample(self) -> Sample:
        rss, fds, threads = read_proc(self.pid)
        s = Sample(round(time.monotonic() - self.started, 3), self.steps, self.sessions_done, round(rss, 2), fds, threads)
        self.samples.append(s)
        return s

    def _count(self, key: str) -> None:
        self.statuses[key] = self.statuses.get(key, 0) + 1

    async def run_session(self, k: int, train_size: int) -> None:
        """One session: create, step (resetting ended episodes), close. An error answer is
        counted by status and ends the session."""
        rng = random.Random(self.seed * 1_000_003 + k)
        try:
            env_id, _, info = await self.client.create(split="train", index=rng.randrange(train_size))
        except EnvServerError as error:
            self._count(str(error.status))
            return
        self._count("200")
        available = info.get("available_actions", [])
        try:
            for _ in range(self.steps_per_session):
                result = await self.client.step(env_id, babyai_action(rng, available))
                self._count("200")
                self.steps += 1
                available = result.info.get("available_actions", available)
                if result.done or result.truncated:
                    available = (await self.client.reset(env_id)).info.get("available_actions", [])
                    self._count("200")
        except EnvServerError as error:
            self._count(str(error.status))
        finally:
            closed = await self.client.close(env_id)
            self._count("200" if closed else "404")
            self.sessions_done += 1

    async def worker(self, queue: asyncio.Queue, train_size: int) -> None:
        while True:
            try:
                k = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            await self.run_session(k, train_size)


async def _sampler(soak: _Soak, interval: float, stop: asyncio.Event) -> None:
    while not stop.is_set():
        soak.sample()
        try:
            await asyncio.wait_for(stop.wait(), interval)
        except asyncio.TimeoutError:
            pass


async def soak_server(
    url: str,
    pid: int,
    *,
    steps: int = 100_000,
    sessions: int = 1000,
    concurrency: int = 50,
    warmup: float = 0.2,
    interval: float = 1.0,
    seed: int = 0,
    rss_margin_mb: float = 8.0,
    rss_margin: float = 0.05,
    max_seconds: float = 1800.0,
    batch: bool | None = None,
) -> SoakReport:
    """Drive the server at ``url`` (process ``pid``) and judge flatness (see the module doc).
    ``batch``: the client's ``POST /batch`` grouping (``EnvClient(batch=...)``; None: as the
    server's ``/health`` says)."""
    if sessions < 1 or steps < sessions:
        raise ValueError("need sessions >= 1 and steps >= sessions")
    async with EnvClient(url, max_connections=concurrency, timeout=60, batch=batch) as client:
        train_size = len(await client.tasks("train"))
        soak = _Soak(client, pid, sessions, steps // sessions, seed)
        warm_sessions = min(sessions, max(1, int(sessions * warmup), concurrency))

        async def phase(first: int, last: int) -> None:
            queue: asyncio.Queue = asyncio.Queue()
            for k in range(first, last):
                queue.put_nowait(k)
            workers = [soak.worker(queue, train_size) for _ in range(min(concurrency, last - first))]
            await asyncio.wait_for(asyncio.gather(*workers), max_seconds)

        stop = asyncio.Event()
        sampler = asyncio.create_task(_sampler(soak, interval, stop))
        try:
            await phase(0, warm_sessions)
            warm = soak.sample()
            await phase(warm_sessions, sessions)
            await asyncio.sleep(min(1.0, interval))  # let the last closes settle
            final = soak.sample()
        finally:
            stop.set()
            await sampler
    return _judge(soak, warm, final, rss_margin_mb, rss_margin)


def _judge(soak: _Soak, warm: Sample, final: Sample, rss_margin_mb: float, rss_margin: float) -> SoakReport:
    reasons = []
    failed = sum(n for status, n in soak.statuses.items() if not status.startswith("2"))
    if failed:
        reasons.append(f"{failed} error answers")
    limit = warm.rss_mb * (1 + rss_margin) + rss_margin_mb
    if final.rss_mb > limit:
        reasons.append(f"RSS {final.rss_mb:.1f} MB > {limit:.1f} MB allowed after warm-up {warm.rss_mb:.1f} MB")
    if final.fds > warm.fds + FD_SLACK:
        reasons.append(f"file descriptors {warm.fds} -> {final.fds}")
    if final.threads > warm.threads:
        reasons.append(f"threads {warm.threads} -> {final.threads}")
    return SoakReport(
        steps=soak.steps,
        sessions=soak.sessions_done,
        seconds=round(time.monotonic() - soak.started, 2),
        status_counts=dict(sorted(soak.statuses.items())),
        warm=warm,
        final=final,
        peak_rss_mb=max(s.rss_mb for s in soak.samples),
        flat=not reasons,
        reasons=reasons,
        samples=soak.samples,
    )


def run_soak(family: str = "babyai", server_args: tuple[str, ...] = (), **kwargs: Any) -> SoakReport:
    """Start a ``family`` server on loopback, soak it, stop it."""
    with start_env_server(family, extra_args=list(server_args)) as server:
        return asyncio.run(soak_server(server.url, server.pid, **kwargs))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=50, help="sessions live at a time")
    parser.add_argument("--warmup", type=float, default=0.2, help="fraction of the sessions before the reference sample")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rss-margin-mb", type=float, default=8.0)
    parser.add_argument("--rss-margin", type=float, default=0.05, help="relative RSS margin")
    parser.add_argument("--url", default=None, help="soak a running server (needs --pid) instead of starting one")
    parser.add_argument("--pid", type=int, default=None)
    parser.add_argument("--json", default=None, help="write the report (all samples) here")
    args = parser.parse_args(argv)
    options = dict(
        steps=args.steps, sessions=args.sessions, concurrency=args.concurrency, warmup=args.warmup,
        interval=args.interval, seed=args.seed, rss_margin_mb=args.rss_margin_mb, rss_margin=args.rss_margin,
    )  # fmt: skip
    if args.url:
        if args.pid is None:
            parser.error("--url needs --pid (the server process to sample)")
        report = asyncio.run(soak_server(args.url, args.pid, **options))
    else:
        report = run_soak("babyai", **options)
    print(report.summary())
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    if args.json:
        Path(args.json).write_text(json.dumps(report.as_dict(), indent=1))
    return 0 if report.flat else 1


if __name__ == "__main__":
    sys.exit(main())
