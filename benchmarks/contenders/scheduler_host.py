"""Host (CPU) time only: the engine thread's Python work around its device calls, the way it
was against the way it is now, side by side in one process on the same synthetic data. No
device, no JAX call.

* prefill rows (``first_turns`` .. ``chunked``): the part of ``Scheduler.run_prefill`` before
  the jitted prefill (plan, the rows' tokens / positions / slots, the KV length), which
  ``benchmarks/speed/rollout_profile.py`` reports as "host: prefill rows": one isolated write per row
  from the prompt's list of ints, against ``prefill_plan.build_rows`` (one write per run of a
  sequence's rows, from the prompt's int32 array made at admission);
* ``finish_kv``: in ``Scheduler.finish`` (part of "host: decode results, stops, finishing"),
  the ids a finished session's slot keeps for the prefix cache, for the sequences one decode
  call finishes: ``np.asarray((input_ids + out_ids)[:kv_len])`` (a list of thousands of ints
  converted a finish), against ``Scheduler.cached_tokens`` (a slice of the prompt's array).

    python3 benchmarks/contenders/scheduler_host.py                 # ~1 minute on 2 cores
    python3 benchmarks/contenders/scheduler_host.py --calls 500 --json out.json

Two settings for each:

* ``alone``: nothing else runs in the process;
* ``busy``: another Python thread is busy (as the rollout's event-loop thread is while the
  episodes parse, tokenise and talk to the environment servers) and counts its GIL handoffs.
  The engine thread shares the GIL with it: it loses the GIL once per 5 ms of its own running
  (the switch interval) and may lose it whenever it releases it (NumPy does around loops of
  more than 500 elements: ``np.zeros`` / ``np.full`` / ``np.arange`` / large copies, which the
  per-row way did ~once a row); each loss costs up to 5 ms before it gets the GIL back.

Prefill queues (``cursor``: the prefix the session cache already holds; packed rows of 64
tokens, at most 64 rows a call, as ``prefill_attention=flash_in_cache`` with
``prefill_tokens`` 4096):

* ``first_turns``: 256 new episodes, prompts of 200-300 tokens (~4-5 rows each);
* ``later_turns``: 256 episodes' next turns, 40-140 new tokens after 300-2500 cached;
* ``mixed``: 64-256 sequences of 20-300 tokens left, half with a cached prefix;
* ``chunked``: ``mixed`` planned one row per sequence (``plan_chunked``, chunks 64/256/1024).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from agentrl_jax.rollout.contract import SamplingParams
from agentrl_jax.rollout.engine.prefill_plan import (
    build_rows,
    plan_chunked,
    plan_packed,
)
from agentrl_jax.rollout.engine.requests import DONE, PREFILL, Request, Seq
from agentrl_jax.rollout.engine.scheduler import Scheduler

MAX_BATCH, MAX_LENGTH, PIECE, ROW_BUCKETS = 256, 3072, 64, (4, 16, 64)
CHUNK_ROWS = [(64, 64), (256, 16), (1024, 4)]  # prefill_tokens 4096


def isolated(req: Request, fn: Callable[..., Any], *args: Any) -> bool:
    """``Scheduler.isolated`` without a failure (nothing fails here)."""
    try:
        fn(*args)
        return True
    except Exception:  # noqa: BLE001
        return False


def plan(queue: list[Seq], packed: bool) -> tuple[int, int, list]:
    if packed:
        return plan_packed(queue, PIECE, ROW_BUCKETS)
    return plan_chunked(queue, CHUNK_ROWS)


def old_rows(queue: list[Seq], packed: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The per-row way (``Scheduler.run_prefill`` before ``build_rows``): ``(slot_ids [rows],
    tokens [rows, chunk], positions [rows, chunk], kv)``, one isolated write per row from the
    prompt's list of ints."""
    chunk, rows, pieces = plan(queue, packed)
    slot_ids = np.full((rows,), MAX_BATCH, np.int32)
    tokens = np.zeros((rows, chunk), np.int32)
    positions = np.full((rows, chunk), MAX_LENGTH, np.int32)

    def prefill_row(seq: Seq, start: int, n: int, tok: np.ndarray, pos: np.ndarray) -> None:
        tok[:n] = seq.req.input_ids[start:start + n]
        pos[:n] = np.arange(start, start + n)

    for r, (seq, start, n) in enumerate(pieces):
        if seq.state != DONE and isolated(seq.req, prefill_row, seq, start, n, tokens[r],
                                          positions[r]):
            slot_ids[r] = seq.slot
    counts = []
    for r, (seq, start, n) in enumerate(pieces):
        if seq.state == DONE or slot_ids[r] == MAX_BATCH:
            tokens[r], positions[r], slot_ids[r], n = 0, MAX_LENGTH, MAX_BATCH, 0
        counts.append(n)
    kv = max((start + n for (_, start, _), n in zip(pieces, counts)), default=0)
    return slot_ids, tokens, positions, kv


def new_rows(queue: list[Seq], packed: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """What ``Scheduler.run_prefill`` does now: ``build_rows``, one isolated
    ``Scheduler.prefill_row`` per run of a sequence's rows."""
    chunk, rows, pieces = plan(queue, packed)

    def write(seq: Seq, start: int, n: int, tok: np.ndarray, pos: np.ndarray) -> bool:
        return isolated(seq.req, Scheduler.prefill_row, seq, start, n, tok, pos)

    call_rows, counts = build_rows(
        pieces, rows, chunk, MAX_BATCH, MAX_LENGTH, write, lambda s: s.state != DONE,
        lambda s: s.slot)
    kv = max((start + n for (_, start, _), n in zip(pieces, counts)), default=0)
    return call_rows.slot_ids, call_rows.tokens, call_rows.positions, kv


def make_queue(rng: np.random.Generator, count: int, left: tuple[int, int],
               cached: tuple[int, int], cached_share: float) -> list[Seq]:
    """``count`` queued sequences with ``left`` tokens to prefill after a cached prefix of
    ``cached`` tokens (for a ``cached_share`` of them), each in its own slot; the prompts'
    ids arrays are made at admission, as the engine does."""
    queue = []
    for i in range(count):
        prefix = int(rng.integers(*cached)) if rng.random() < cached_share else 0
        L = min(MAX_LENGTH - 1, prefix + int(rng.integers(*left)) + 1)
        req = Request(f"r{i}", rng.integers(0, 49152, L).tolist(), SamplingParams(), None,
                      concurrent.futures.Future(), seed=i)
        req.ids()
        seq = Seq(req, 0, [])
        req.seqs = [seq]
        seq.state, seq.slot, seq.cursor = PREFILL, i % MAX_BATCH, min(prefix, L - 2)
        queue.append(seq)
    return queue


def queues(seed: int) -> dict[str, tuple[list[Seq], bool]]:
    rng = np.random.default_rng(seed)
    return {
        "first_turns": (make_queue(rng, 256, (200, 300), (0, 1), 0.0), True),
        "later_turns": (make_queue(rng, 256, (40, 140), (300, 2500), 1.0), True),
        "mixed": (make_queue(rng, int(rng.integers(64, 257)), (20, 300), (1, 1500), 0.5), True),
        "chunked": (make_queue(rng, int(rng.integers(64, 257)), (20, 300), (1, 1500), 0.5),
                    False),
    }


class Busy:
    """A Python thread spinning while the block runs (another thread wanting the GIL). It
    counts ``handoffs``: the times it got the GIL back after losing it (a gap of more than
    20 us between two of its iterations): the engine thread's forced switches (one per 5 ms of
    its own running) and the releases the spinner won."""

    def __enter__(self) -> Busy:
        self.stop = threading.Event()
        self.handoffs = 0
        self.thread = threading.Thread(target=self._spin, daemon=True)
        self.thread.start()
        time.sleep(0.02)
        return self

    def _spin(self) -> None:
        clock, last = time.perf_counter, time.perf_counter()
        while not self.stop.is_set():
            now = clock()
            if now - last > 20e-6:
                self.handoffs += 1
            last = now

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


class _Alone:
    handoffs = 0

    def __enter__(self) -> _Alone:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def time_calls(fn: Callable[[], Any], calls: int, repeats: int) -> float:
    """The median over ``repeats`` of the mean seconds per call over ``calls`` calls."""
    fn()
    means = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        means.append((time.perf_counter() - t0) / calls)
    return statistics.median(means)


def old_cached_tokens(seq: Seq) -> np.ndarray:
    """What ``Scheduler.finish`` kept for a finished session's slot before: the prompt list
    plus the output list, cut at ``kv_len``, converted to int32."""
    full = seq.req.input_ids + seq.out_ids
    return np.asarray(full[:min(seq.kv_len, len(full))], np.int32)


def finished_sessions(rng: np.random.Generator, count: int) -> list[Seq]:
    """``count`` decoded sequences of BabyAI-like sessions: 300-3000 prompt tokens (later
    turns hold the whole episode), 1-24 output tokens, their KV up to the last output token."""
    seqs = []
    for i in range(count):
        L = int(rng.integers(300, 3000))
        req = Request(f"f{i}", rng.integers(0, 49152, L).tolist(), SamplingParams(), None,
                      concurrent.futures.Future(), seed=i)
        req.ids()  # made at admission
        seq = Seq(req, 0, [])
        seq.out_ids = rng.integers(0, 49152, int(rng.integers(1, 25))).tolist()
        seq.kv_len = L + len(seq.out_ids) - 1
        seqs.append(seq)
    return seqs


def report(rows: list[dict[str, Any]], name: str, setting: str, unit: str, size: int,
           timed: tuple[float, float, float, float]) -> None:
    t_old, t_new, h_old, h_new = timed
    row = {"part": name, "setting": setting, "size": size, "old_ms": 1e3 * t_old,
           "new_ms": 1e3 * t_new, "ratio": t_old / t_new, "old_handoffs": h_old,
           "new_handoffs": h_new, "unit": unit}
    rows.append(row)
    hand = f"{h_old:9.2f} {h_new:9.2f}" if setting == "busy" else f"{'':9s} {'':9s}"
    print(f"{name:12s} {setting:7s} {size:5d} {row['old_ms']:12.3f} {row['new_ms']:12.3f} "
          f"{row['ratio']:7.1f}x {hand}")


def compare(old: Callable[[], Any], new: Callable[[], Any], setting: str, calls: int,
            repeats: int) -> tuple[float, float, float, float]:
    """Seconds a call, old and new, and the busy thread's GIL handoffs a call."""
    out = []
    for fn in (old, new):
        with Busy() if setting == "busy" else _Alone() as ctx:
            h0 = ctx.handoffs
            t = time_calls(fn, calls, repeats)
            out.append((t, (ctx.handoffs - h0) / (calls * (repeats + 1) + 1)))
    return out[0][0], out[1][0], out[0][1], out[1][1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=200, help="calls per timing")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--finishes", type=int, default=50,
                   help="sequences finished by one decode call (BabyAI on an H200: ~50)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    rows: list[dict[str, Any]] = []
    print("ms per call (host CPU only); handoffs: the busy thread's GIL handoffs per call")
    print(f"{'part':12s} {'setting':7s} {'size':>5s} {'old ms/call':>12s} {'new ms/call':>12s} "
          f"{'old/new':>8s} {'old hand':>9s} {'new hand':>9s}")
    for name, (queue, packed) in queues(args.seed).items():
        old, new = old_rows(queue, packed), new_rows(queue, packed)
        for a, b in zip(old, new):  # the same call, both ways
            np.testing.assert_array_equal(a, b)
        for setting in ("alone", "busy"):
            report(rows, name, setting, "prefill call (rows)", len(old[0]),
                   compare(lambda: old_rows(queue, packed), lambda: new_rows(queue, packed),
                           setting, args.calls, args.repeats))
    seqs = finished_sessions(np.random.default_rng(args.seed), args.finishes)
    for seq in seqs:
        np.testing.assert_array_equal(old_cached_tokens(seq), Scheduler.cached_tokens(seq))
    for setting in ("alone", "busy"):
        report(rows, "finish_kv", setting, "decode call (finished sessions)", len(seqs),
               compare(lambda: [old_cached_tokens(s) for s in seqs],
                       lambda: [Scheduler.cached_tokens(s) for s in seqs],
                       setting, max(1, args.calls // 4), args.repeats))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
