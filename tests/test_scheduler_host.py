"""The engine thread's prefill-row building (``prefill_plan.build_rows`` via
``Scheduler.run_prefill``) against the plain per-row loop it replaced, on randomised queues:
packed (several rows per sequence) and chunked plans, sequences already done, sequences whose
row writing fails (before or after writing part of a row), requests of several sequences.

Both run ``Scheduler.run_prefill`` on a host-only harness (no device: the prefill call is a
stub that records its arguments) built twice from the same seed; everything must be equal: the
call's slot ids, tokens, positions and KV length, the counters, each sequence's cursor /
KV length / state, the queue left, the sequences whose prefill finished and the failed requests.
Also: ``Scheduler.cached_tokens`` (a finished session's prefix) against the list expression it
replaced, and ``copy_blocks`` writing in blocks that keep the GIL.
"""

from __future__ import annotations

import concurrent.futures
import logging
import types
from typing import Any

import numpy as np
import pytest

from agentrl_jax.rollout.contract import SamplingParams
from agentrl_jax.rollout.engine.compiled import EngineFunctions
from agentrl_jax.rollout.engine.engine_config import EngineConfig
from agentrl_jax.rollout.engine.inbox import EngineInbox
from agentrl_jax.rollout.engine.prefill_plan import (
    GIL_SAFE,
    build_rows,
    copy_blocks,
    plan_packed,
    runs,
)
from agentrl_jax.rollout.engine.requests import (
    DONE,
    FORK_WAIT,
    PREFILL,
    EngineStats,
    Request,
    Seq,
)
from agentrl_jax.rollout.engine.scheduler import Scheduler


class _Cache:
    keys = [np.zeros((1,), np.float32)]


class Harness:
    """The scheduler's prefill path with no device: a real ``Scheduler`` and ``EngineInbox``,
    a prefill function that records its arguments, and ``prefill_done`` recording which
    sequences finished their prefill."""

    def __init__(self, config: EngineConfig, packed: bool):
        self.calls: list[tuple[np.ndarray, ...]] = []
        self.finished: list[str] = []
        self.all_requests: list[Request] = []
        self.inbox = EngineInbox(max_queue=1 << 20)
        functions = EngineFunctions(decode=None, prefill=self._prefill, copy_rows=None,
                                    merge=None)
        weights = types.SimpleNamespace(state=None, leaves=None, merged=None, version="0")
        kv = types.SimpleNamespace(cache=_Cache(), released=False)
        self.scheduler = Scheduler(config, functions, weights, kv, self.inbox, EngineStats(),
                                   None, 49152, packed)
        self.scheduler.prefill_done = self._prefill_done

    def _prefill(self, state: Any, cache: Any, rows: np.ndarray, chunk: int, kv: int) -> _Cache:
        """The call's one host array, read with the layout written out here: the tokens
        ``[R, chunk]``, the positions ``[R, chunk]``, the slot ids ``[R]``."""
        assert rows.dtype == np.int32 and rows.ndim == 1
        n_rows = len(rows) // (2 * chunk + 1)
        assert len(rows) == n_rows * (2 * chunk + 1)
        n = n_rows * chunk
        self.calls.append((rows[2 * n:].copy(), rows[:n].reshape(n_rows, chunk).copy(),
                           rows[n:2 * n].reshape(n_rows, chunk).copy(), np.int64(kv)))
        return cache

    def _prefill_done(self, seq: Seq) -> None:
        self.finished.append(f"{seq.req.rid}/{seq.index}")


def reference_run_prefill(h: Harness) -> None:
    """``Scheduler.run_prefill`` as it was: one isolated write per row, from the prompt list."""
    from agentrl_jax.rollout.engine.prefill_plan import plan_chunked

    self = h.scheduler
    c = self.config
    queue = self.prefill_queue
    if self.packed_prefill:
        chunk, rows, pieces = plan_packed(queue, c.chunk_buckets[0], c.packed_row_buckets())
    else:
        chunk, rows, pieces = plan_chunked(
            queue, [(ch, c.prefill_rows(ch)) for ch in c.chunk_buckets])
    slot_ids = np.full((rows,), c.max_batch, np.int32)
    tokens = np.zeros((rows, chunk), np.int32)
    positions = np.full((rows, chunk), c.max_length, np.int32)

    def row(seq: Seq, start: int, n: int, tok: np.ndarray, pos: np.ndarray) -> None:
        h.prefill_row_hook(seq, start, n)
        tok[:n] = seq.req.input_ids[start:start + n]
        pos[:n] = np.arange(start, start + n)
        h.prefill_row_hook(seq, start, n, after=True)

    for r, (seq, start, n) in enumerate(pieces):
        if seq.state != DONE and self.isolated(seq.req, row, seq, start, n, tokens[r],
                                                positions[r]):
            slot_ids[r] = seq.slot
    counts = []
    for r, (seq, start, n) in enumerate(pieces):
        if seq.state == DONE or slot_ids[r] == c.max_batch:
            tokens[r], positions[r], slot_ids[r], n = 0, c.max_length, c.max_batch, 0
        counts.append(n)
    kv = c.prefill_kv(chunk, max((start + n for (_, start, _), n in zip(pieces, counts)),
                                 default=0))
    packed = np.concatenate([tokens.reshape(-1), positions.reshape(-1), slot_ids])
    self.kv.cache = self.functions.prefill(self.weights.leaves, self.kv.cache, packed, chunk, kv)
    stats, used = self.stats, sum(n > 0 for n in counts)
    stats.prefill_calls += 1
    stats.prefill_positions += rows * chunk
    stats.prefill_rows += rows
    stats.prefill_rows_used += used
    stats.prefill_used_positions += used * chunk
    stats.prefill_row_tokens += sum(counts)
    stats.prefill_kv_sum += kv
    done = []
    for (seq, start, _), n in zip(pieces, counts):
        if seq.state == DONE or n == 0:
            continue
        seq.cursor = seq.kv_len = start + n
        if seq.cursor >= seq.prompt_len - 1 and seq not in done:
            done.append(seq)
    self.prefill_queue = [s for s in queue if s.state != DONE and s.cursor < s.prompt_len - 1]
    for seq in done:
        self.isolated(seq.req, self.prefill_done, seq)


def build(seed: int, packed: bool, max_length: int = 3072) -> Harness:
    """A harness with a random prefill queue (the same one for the same seed): 1-200 requests
    of 2-``max_length`` tokens, prefix-cache cursors, a few requests of several sequences
    (only the first prefills), a few already done, a few whose rows fail (``fail``: at once;
    ``fail_late``: after writing; ``fail_other``: failing another request's sequence)."""
    rng = np.random.default_rng(seed)
    c = EngineConfig(max_batch=256, max_length=max_length, prefill_tokens=4096,
                     prefill_chunks=(64, 256, 1024), prefill_kv_buckets=())
    h = Harness(c, packed)
    for i in range(int(rng.integers(1, 200))):
        L = int(rng.integers(2, max_length + 1)) if rng.random() < 0.2 else \
            int(rng.integers(2, 320))
        req = Request(f"r{i}", rng.integers(0, 49152, L).tolist(), SamplingParams(),
                      None, concurrent.futures.Future(), seed=i)
        req.seqs = [Seq(req, k, []) for k in range(1 if rng.random() < 0.9 else 3)]
        h.inbox.submit(req)
        h.all_requests.append(req)  # (a failed request leaves the inbox)
        first = req.seqs[0]
        for seq in req.seqs:
            seq.slot = h.scheduler.slots.acquire()
            h.scheduler.slot_seq[seq.slot] = seq
            seq.state = PREFILL if seq is first else FORK_WAIT
        first.cursor = first.kv_len = int(rng.integers(0, L - 1)) if rng.random() < 0.5 else 0
        u = rng.random()
        req.fault = ("done" if u < 0.05 else "fail" if u < 0.1 else "fail_late" if u < 0.15
                     else "fail_other" if u < 0.18 else None)
        if req.fault == "done":
            first.state = DONE
        h.scheduler.prefill_queue.append(first)
    return h


def inject(h: Harness) -> None:
    """Row writes fail as each request's ``fault`` says (the same way on both paths)."""
    original = Scheduler.prefill_row
    queue = list(h.scheduler.prefill_queue)

    def hook(seq: Seq, start: int, n: int, after: bool = False) -> None:
        fault = seq.req.fault
        if fault == "fail" and not after or fault == "fail_late" and after:
            raise RuntimeError("injected row failure")
        if fault == "fail_other" and after:  # fails the next queued request: after its rows?
            other = queue[(queue.index(seq) + 1) % len(queue)]
            h.scheduler.fail_request(other.req, RuntimeError("failed by another"))

    def row(seq: Seq, start: int, n: int, tokens: np.ndarray, positions: np.ndarray) -> None:
        hook(seq, start, n)
        original(seq, start, n, tokens, positions)
        hook(seq, start, n, after=True)

    h.prefill_row_hook = hook
    h.scheduler.prefill_row = row


def snapshot(h: Harness) -> dict[str, Any]:
    seqs = [s for r in h.all_requests for s in r.seqs]
    failed = [r.rid for r in h.all_requests if r.future.done()]
    assert failed == [r.rid for r in h.all_requests if not h.inbox.is_running(r.rid)]
    stats = {k: v for k, v in h.scheduler.stats.as_dict().items() if "time" not in k}
    return {"stats": stats, "calls": h.calls, "finished": h.finished,
            "failed": failed,
            "queue": [f"{s.req.rid}/{s.index}" for s in h.scheduler.prefill_queue],
            "seqs": [(s.req.rid, s.index, s.cursor, s.kv_len, s.state, s.slot) for s in seqs]}


def assert_same(a: Any, b: Any) -> None:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        assert np.asarray(a).dtype == np.asarray(b).dtype
        np.testing.assert_array_equal(a, b)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k])
    else:
        assert a == b


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("seed", range(12))
def test_run_prefill_matches_the_per_row_loop(seed: int, packed: bool) -> None:
    logger = logging.getLogger("agentrl_jax")
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)  # the injected failures log errors
    try:
        new, ref = build(seed, packed), build(seed, packed)
        inject(new)
        inject(ref)
        for _ in range(50):  # until the queue is empty
            if not ref.scheduler.prefill_queue:
                break
            new.scheduler.run_prefill()
            reference_run_prefill(ref)
            assert_same(snapshot(new), snapshot(ref))
        assert not new.scheduler.prefill_queue
    finally:
        logger.setLevel(level)


def test_runs_merge_only_full_consecutive_rows() -> None:
    a, b = object(), object()
    pieces = [(a, 0, 64), (a, 64, 64), (a, 128, 5), (b, 0, 64), (b, 64, 3), (a, 133, 64),
              (b, 67, 10)]
    assert runs(pieces, 64) == [(a, 0, 0, 133, 3), (b, 3, 0, 67, 2), (a, 5, 133, 64, 1),
                                (b, 6, 67, 10, 1)]
    # a piece that does not continue the run (another start) starts a new one
    assert runs([(a, 0, 64), (a, 100, 64)], 64) == [(a, 0, 0, 64, 1), (a, 1, 100, 64, 1)]


def test_build_rows_random_pieces_against_a_loop() -> None:
    """``build_rows`` on arbitrary pieces (not only planner output) against a per-row loop."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        chunk = int(rng.choice([8, 64, 300]))
        seqs = [list(rng.integers(0, 1000, int(rng.integers(2, 4 * chunk)))) for _ in range(5)]
        pieces = []
        for _ in range(int(rng.integers(0, 12))):
            s = int(rng.integers(0, 5))
            start = int(rng.integers(0, len(seqs[s]) - 1))
            pieces.append((s, start, int(rng.integers(1, min(chunk, len(seqs[s]) - start) + 1))))
        rows = len(pieces) + int(rng.integers(0, 3))
        bad = {int(x) for x in rng.integers(0, 5, 2)}

        def write(s: int, start: int, n: int, tok: np.ndarray, pos: np.ndarray) -> bool:
            if s in bad:
                tok[:1] = 7  # partly written, then failed
                return False
            tok[:n] = np.asarray(seqs[s][start:start + n], np.int32)
            pos[:n] = np.arange(start, start + n)
            return True

        call_rows, counts = build_rows(
            pieces, rows, chunk, 99, 5000, write, lambda s: True, lambda s: 10 + s)
        slot_ids, tokens, positions = call_rows.slot_ids, call_rows.tokens, call_rows.positions
        ref_tok = np.zeros((rows, chunk), np.int32)
        ref_pos = np.full((rows, chunk), 5000, np.int32)
        ref_slots = np.full((rows,), 99, np.int32)
        ref_counts = []
        for r, (s, start, n) in enumerate(pieces):
            if s in bad:
                ref_counts.append(0)
                continue
            ref_tok[r, :n] = seqs[s][start:start + n]
            ref_pos[r, :n] = np.arange(start, start + n)
            ref_slots[r] = 10 + s
            ref_counts.append(n)
        assert counts == ref_counts
        assert_same([slot_ids, tokens, positions], [ref_slots, ref_tok, ref_pos])
        # one host array: tokens, then positions, then slot ids (what the compiled call reads)
        assert call_rows.rows == rows and call_rows.packed.dtype == np.int32
        assert_same(call_rows.packed, np.concatenate([ref_tok.reshape(-1), ref_pos.reshape(-1),
                                                      ref_slots]))


def test_copy_blocks() -> None:
    src = np.arange(3 * GIL_SAFE + 5, dtype=np.int32)
    dst = np.zeros((4 * GIL_SAFE,), np.int32)
    copy_blocks(dst, src)
    assert_same(dst[:len(src)], src)
    assert not dst[len(src):].any()
    copy_blocks(dst[3:700], -1)
    assert (dst[3:700] == -1).all() and dst[2] == 2 and dst[700] == 700


def test_copy_blocks_touch_at_most_gil_safe_elements() -> None:
    """Each NumPy write of ``copy_blocks`` is at most ``GIL_SAFE`` elements (NumPy releases the
    GIL around longer loops: the engine thread would then wait for the event loop)."""
    sizes: list[int] = []

    class Recorder(np.ndarray):
        def __setitem__(self, key: Any, value: Any) -> None:
            sizes.append(len(np.asarray(self)[key]))
            np.asarray(self)[key] = value

    dst = np.zeros((5 * GIL_SAFE,), np.int32).view(Recorder)
    copy_blocks(dst, np.arange(4 * GIL_SAFE + 3, dtype=np.int32))
    copy_blocks(dst, 0)
    assert sizes and max(sizes) <= GIL_SAFE and sum(sizes) == 9 * GIL_SAFE + 3
    assert GIL_SAFE <= 500


def test_cached_tokens_match_the_list_way() -> None:
    """``Scheduler.cached_tokens`` (what a finished session's slot keeps) against the list
    expression it replaced: ``(input_ids + out_ids)[:kv_len]`` as int32."""
    rng = np.random.default_rng(3)
    for i in range(300):
        L = int(rng.integers(2, 3000))
        req = Request(f"r{i}", rng.integers(0, 49152, L).tolist(), SamplingParams(), None,
                      concurrent.futures.Future(), seed=i)
        seq = Seq(req, 0, [])
        seq.out_ids = rng.integers(0, 49152, int(rng.integers(0, 40))).tolist()
        full = req.input_ids + seq.out_ids
        seq.kv_len = int(rng.integers(1, len(full) + 3))
        expected = np.asarray(full[:min(seq.kv_len, len(full))], np.int32)
        assert_same(Scheduler.cached_tokens(seq), expected)
