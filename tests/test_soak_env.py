"""A short soak of the BabyAI server (``benchmarks/checks/soak_env.py``): memory, file descriptors and
threads stay flat over create / step / close storms (before: RSS grew 139 -> 208 MB over four
storms while ``gc.set_threshold(20_000, 20, 50)`` let closed levels pile up)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks" / "checks"))

from soak_env import run_soak  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def test_babyai_server_stays_flat_over_session_storms():
    # 10,000 short sessions, 400 live at a time: each wave of closes leaves 400 minigrid levels
    # (reference cycles) to the collector. One request per create / step / close
    # (batch=False): the client then holds its 400 connections from the warm-up on, so any
    # descriptor the server gains later is a leak. The server's RSS rises in steps to a plateau
    # of ~101-103 MB (2 cores, three CPU hogs beside it, 16,000 steps sampled every 0.5 s: 94 MB
    # by ~500 steps, 99 by ~1,400, 101-102 between 4,700 and 5,800, then flat to the end), but
    # where the steps fall varies: one CI run had 94.2 MB at 4,000 steps and 103.2 at 10,000 (the
    # same plateau), which a 4,000-step warm-up judged as growth. So the warm-up is 10,000 of
    # 20,000 steps, and the judged window, 10,000 steps, is longer than the 6,000 before: a leak
    # at the rate before the gc fix (+8.7 MB in 6,000 steps, and growing) fails it by more.
    report = run_soak("babyai", steps=20000, sessions=10000, concurrency=400, warmup=0.5,
                      interval=1.0, rss_margin_mb=3.0, rss_margin=0.02, batch=False)
    print(report.summary())
    assert report.steps == 20000 and report.sessions == 10000
    assert report.flat, report.summary()


def test_babyai_server_stays_flat_over_batched_session_storms():
    # The same storms through POST /batch (the client's default for BabyAI). Memory, threads and
    # answers must stay as flat; the client's connection pool grows on demand here (one
    # connection per batch in flight: measured 59 -> 67 descriptors after the warm-up, then
    # flat), so descriptors are held to the pool's limit instead of the warm-up count.
    report = run_soak("babyai", steps=4000, sessions=2000, concurrency=400, warmup=0.4, interval=1.0,
                      rss_margin_mb=3.0, rss_margin=0.02, batch=True)
    print(report.summary())
    assert report.steps == 4000 and report.sessions == 2000
    assert set(report.status_counts) == {"200"}, report.summary()
    assert all(r.startswith("file descriptors") for r in report.reasons), report.summary()
    assert report.final.fds <= report.warm.fds + 400, report.summary()
