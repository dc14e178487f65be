"""The engine thread's scheduling: admitting queued requests into free decode slots (with
prefix-cache reuse and forks of ``n > 1`` samples), batched chunked prefill, the jitted decode
steps, stop tokens / stop strings, finishing a sequence into its ``GenerateResult``, and failing
one request alone when its host-side work raises. :class:`Scheduler` owns the slots and the
queues; only the engine thread (``engine_loop.py``) runs it.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import time
from typing import Any, Callable

import jax
import numpy as np

from agentrl_jax.rollout.contract import GenerateResult
from agentrl_jax.rollout.engine.compiled import (ACT, MINP, POS, REM, STOP, TEMP, TOK, TOPK,
                                                 TOPP, EngineFunctions)
from agentrl_jax.rollout.engine.engine_config import EngineConfig
from agentrl_jax.rollout.engine.failures import fail_future, request_error
from agentrl_jax.rollout.engine.inbox import EngineInbox
from agentrl_jax.rollout.engine.kv_memory import KVCacheMemory
from agentrl_jax.rollout.engine.prefill_plan import (build_rows, copy_blocks, plan_chunked,
                                                     plan_packed, positions_upto)
from agentrl_jax.rollout.engine.requests import (DECODE, DONE, FORK_WAIT, PREFILL, EngineStats,
                                                 Request, Seq)
from agentrl_jax.rollout.engine.sampling import sampling_mode
from agentrl_jax.rollout.engine.slot_buffers import SlotBuffers
from agentrl_jax.rollout.engine.slots import SlotTable, join_blocks, session_prefix
from agentrl_jax.rollout.engine.stop_strings import detokenize
from agentrl_jax.rollout.engine.weights import EngineWeights

log = logging.getLogger(__name__)


class Scheduler:
    """The engine thread's scheduling: admission, prefill, forks, decode, finishing.

    Owns: ``slots`` (the slot table and session prefix cache, ``slots.py``), ``slot_seq``
    (slot -> the sequence in it), the queues -- ``waiting`` requests without slots,
    ``prefill_queue`` sequences to prefill, ``fork_ready`` prefilled sequences whose row is
    copied to others -- ``prompt_leaders`` (a prompt's key, ``Request.prompt_key``, -> the
    sequence prefilling it, for ``share_prompts``), ``buffers`` (the per-slot decode state and
    outputs, ``slot_buffers.py``) and ``deliveries`` (finished requests whose futures are not
    set yet). It uses, without owning them: the compiled ``functions``, the served ``weights``, the
    ``kv`` cache memory, the ``inbox`` (it reports requests that leave the queue or finish)
    and the shared ``stats`` counters. Only the engine thread calls it.
    """

    def __init__(self, config: EngineConfig, functions: EngineFunctions, weights: EngineWeights,
                 kv: KVCacheMemory, inbox: EngineInbox, stats: EngineStats, tokenizer: Any,
                 vocab_size: int, packed_prefill: bool):
        self.config = config
        self.functions = functions
        self.weights = weights
        self.kv = kv
        self.inbox = inbox
        self.stats = stats
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.packed_prefill = packed_prefill
        c = config
        self.buffers = SlotBuffers(c.max_batch, c.max_length, c.max_stop_ids)
        self.slots = SlotTable(c.max_batch)
        self.slot_seq: dict[int, Seq] = {}
        self.waiting: collections.deque[Request] = collections.deque()
        self.prefill_queue: list[Seq] = []
        self.fork_ready: list[Seq] = []
        self.prompt_leaders: dict[bytes, Seq] = {}
        self.deliveries: list[Request] = []

    @property
    def busy(self) -> bool:
        """Whether any request is queued or running here."""
        return bool(self.waiting or self.slot_seq or self.prefill_queue or self.fork_ready)

    def enqueue(self, requests: list[Request]) -> None:
        """New requests from the inbox join the end of the waiting queue."""
        self.waiting.extend(requests)

    def load(self) -> dict[str, int]:
        return {"running": len(self.slot_seq), "free_slots": self.slots.num_free,
                "cached_slots": self.slots.num_cached}

    def reset(self) -> None:
        """Forget every request and cached prefix (after a failed device call; their futures
        are failed by the caller): empty queues, every slot free and inactive."""
        self.waiting.clear()
        self.prefill_queue, self.fork_ready = [], []
        self.prompt_leaders.clear()
        self.slot_seq.clear()
        self.buffers.reset()
        self.slots = SlotTable(self.config.max_batch)

    def step(self) -> None:
        """One scheduling step: admit, up to ``prefill_calls_per_step`` prefill calls, the
        row copies of forks, one decode call."""
        self.admit()
        for _ in range(self.config.prefill_calls_per_step):  # prefill first, bounded
            if not self.prefill_queue:
                break
            self.run_prefill()
        if self.fork_ready:
            self.run_forks()
        if any(s.state == DECODE for s in self.slot_seq.values()):
            self.run_decode()
        if self.deliveries and not (self.prefill_queue or self.fork_ready or any(
                s.state == DECODE for s in self.slot_seq.values())):
            self.deliver()  # the next step launches nothing that the hand-over could overlap

    # -------------------------------------------------------------------- fault isolation
    def isolated(self, req: Request, fn: Callable[..., Any], *args: Any) -> bool:
        """``fn(*args)``, host-side work of ``req`` alone; if it raises, ``req`` fails (and
        only it: ``fail_request``). Returns whether it succeeded."""
        try:
            fn(*args)
            return True
        except Exception as e:  # noqa: BLE001 -- reported to the request's caller
            self.fail_request(req, e)
            return False

    def fail_request(self, req: Request, error: BaseException) -> None:
        """Fail one request after an error in its own host-side work (``failures.py`` names
        the error); every other request goes on. Its sequences leave the queues and their
        slots (no prefix is cached from them: their KV may be incomplete)."""
        exc = request_error(req, error)
        self.inbox.finished(req.rid)
        if req in self.waiting:
            self.waiting.remove(req)
            self.inbox.dequeued()
        for seq in req.seqs:
            if seq.state == PREFILL:
                self.orphan_followers(seq)
            if seq in self.prefill_queue:
                self.prefill_queue.remove(seq)
            if seq in self.fork_ready:
                self.fork_ready.remove(seq)
            if seq.slot is not None:
                slot = seq.slot
                self.buffers.deactivate(slot, forget_stop_mask=True)
                if self.slot_seq.get(slot) is seq:
                    del self.slot_seq[slot]
                self.slots.release(slot)
                seq.slot = None
            seq.state = DONE
        fail_future(req.future, exc)

    # ----------------------------------------------------------------------- admission
    def admit(self) -> None:
        while self.waiting:
            req = self.waiting[0]
            if req.aborted:
                self.waiting.popleft()
                self.inbox.dequeued()
                for seq in req.seqs:
                    self.isolated(req, self.finish, seq, "abort", None)
                continue
            n = req.sampling.n
            if self.slots.available < n:
                return
            self.waiting.popleft()
            self.inbox.dequeued()
            self.isolated(req, self.admit_one, req)

    def admit_one(self, req: Request) -> None:
        """Give a request its slots and queue its prefill (or activate it at once)."""
        c = self.config
        n = req.sampling.n
        self.stats.requests += 1
        ids = req.ids()
        L = len(req.input_ids)
        first = req.seqs[0]
        session = req.session_id if c.session_cache else None
        slot, reuse = self.slots.acquire_for_session(session, ids, max_reuse=L - 1)
        self.bind(first, slot)
        first.cursor = first.kv_len = first.cached_tokens = reuse
        self.stats.prompt_tokens += L * n
        self.stats.cached_tokens += reuse
        for seq in req.seqs[1:]:
            self.bind(seq, self.slots.acquire())
            seq.state = FORK_WAIT
            seq.cached_tokens = L - 1
            self.stats.cached_tokens += L - 1
            first.forks.append(seq)
        key = req.prompt_key() if c.share_prompts and reuse < L - 1 else None
        leader = self.prompt_leaders.get(key) if key is not None and n == 1 else None
        if leader is not None and (leader.state != PREFILL or leader.slot is None):
            leader = None  # ended without its prefill (its followers were re-queued then)
        if leader is not None:  # the same prompt is being prefilled: wait, copy its row
            first.state = FORK_WAIT
            first.cached_tokens = L - 1
            self.stats.cached_tokens += L - 1 - reuse
            self.stats.shared_prompts += 1
            leader.forks.append(first)
        elif reuse < L - 1:
            first.state = PREFILL
            self.stats.prefill_tokens += L - 1 - reuse
            self.prefill_queue.append(first)
            if key is not None:
                first.prompt_key = key
                self.prompt_leaders[key] = first
        else:
            self.prefill_done(first)
        self.stats.prefill_tokens += n  # the last prompt token, fed by the first decode step

    def drop_leader(self, seq: Seq) -> None:
        """``seq`` no longer prefills a prompt others may share (its prefill ended)."""
        key, seq.prompt_key = seq.prompt_key, None
        if key is not None and self.prompt_leaders.get(key) is seq:
            del self.prompt_leaders[key]

    def orphan_followers(self, seq: Seq) -> None:
        """``seq`` ends before its prefill did: the sequences of other requests that waited to
        copy its row prefill their prompts themselves."""
        self.drop_leader(seq)
        own = []
        for f in seq.forks:
            if f.req is seq.req:
                own.append(f)
            elif f.state == FORK_WAIT and f.slot is not None:
                f.state = PREFILL
                f.cursor = f.kv_len = f.cached_tokens = 0
                self.stats.prefill_tokens += f.prompt_len - 1
                self.prefill_queue.append(f)
        seq.forks = own

    def bind(self, seq: Seq, slot: int) -> None:
        seq.slot = slot
        self.slot_seq[slot] = seq
        self.buffers.ints[slot, ACT] = 0

    def prefill_done(self, seq: Seq) -> None:
        self.drop_leader(seq)
        if seq.forks:
            self.fork_ready.append(seq)
            seq.state = FORK_WAIT
        else:
            self.activate(seq)

    def activate(self, seq: Seq) -> None:
        """Make a prefilled sequence decodable (``SlotBuffers.activate``)."""
        seq.state = DECODE
        seq.kv_len = seq.prompt_len - 1
        self.buffers.activate(seq, self.vocab_size, self.tokenizer)

    # ------------------------------------------------------------------------- prefill
    def run_prefill(self) -> None:
        c = self.config
        queue = self.prefill_queue
        if self.packed_prefill:  # rows of PACKED_ROW tokens, several per sequence
            chunk, rows, pieces = plan_packed(queue, c.chunk_buckets[0], c.packed_row_buckets())
        else:  # one row per sequence, the chunk bucket that prefills the most
            chunk, rows, pieces = plan_chunked(
                queue, [(ch, c.prefill_rows(ch)) for ch in c.chunk_buckets])
        call_rows, counts = build_rows(
            pieces, rows, chunk, c.max_batch, c.max_length, self.write_rows,
            lambda seq: seq.state != DONE, lambda seq: seq.slot)
        kv = c.prefill_kv(chunk, max((start + n for (_, start, _), n in zip(pieces, counts)),
                                     default=0))
        t0 = self.stats.clocks()
        kv_memory = self.kv
        kv_memory.cache = self.functions.prefill(self.weights.leaves, kv_memory.cache,
                                                  call_rows.packed, chunk, kv)
        t_dispatched = time.perf_counter()
        self.deliver()  # (deliver_after_launch) while the device computes
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
            if seq.state == DONE or n == 0:  # failed while its rows were built
                continue
            seq.cursor = seq.kv_len = start + n
            if seq.cursor >= seq.prompt_len - 1 and seq not in done:
                done.append(seq)
        self.prefill_queue = [s for s in queue
                              if s.state != DONE and s.cursor < s.prompt_len - 1]
        for seq in done:
            self.isolated(seq.req, self.prefill_done, seq)
        t_wait = self.stats.clocks()
        jax.block_until_ready(kv_memory.cache.keys[0])
        self.stats.prefill_window(t0, t_dispatched, t_wait)

    def write_rows(self, seq: Seq, start: int, n: int, tokens: np.ndarray,
                   positions: np.ndarray) -> bool:
        """``prefill_row`` for ``seq`` alone (``isolated``): whether it succeeded."""
        return self.isolated(seq.req, self.prefill_row, seq, start, n, tokens, positions)

    @staticmethod
    def prefill_row(seq: Seq, start: int, n: int, tokens: np.ndarray, positions: np.ndarray
                    ) -> None:
        """Write a sequence's ``n`` prompt tokens from position ``start`` into a prefill row, or
        consecutive rows of one call: ``tokens`` / ``positions`` int32 ``[>= n]`` (1-D, the
        rows flattened); in blocks that keep the GIL (``prefill_plan.copy_blocks``)."""
        end = start + n
        copy_blocks(tokens, seq.req.ids()[start:end])
        copy_blocks(positions, positions_upto(end)[start:end])

    def run_forks(self) -> None:
        """Copy the prefilled prompt row of each ``n > 1`` request to its other samples."""
        c = self.config
        pairs = []
        for seq in self.fork_ready:  # (a sequence of another request may have ended waiting)
            pairs.extend((seq.slot, f.slot) for f in seq.forks
                         if f.state == FORK_WAIT and f.slot is not None)
        for i in range(0, len(pairs), c.copy_rows):
            call = np.zeros((2, c.copy_rows), np.int32)  # [source row, target row]
            call[1] = c.max_batch  # (unused columns: a target row the copy drops)
            for j, (a, b) in enumerate(pairs[i:i + c.copy_rows]):
                call[0, j], call[1, j] = a, b
            self.kv.cache = self.functions.copy_rows(self.kv.cache, call)
            self.stats.copy_calls += 1
        for seq in list(self.fork_ready):
            if seq.state == DONE:
                continue
            self.isolated(seq.req, self.activate, seq)
            for f in seq.forks:
                if f.state == FORK_WAIT:
                    self.isolated(f.req, self.activate, f)
        self.fork_ready = []

    # -------------------------------------------------------------------------- decode
    def run_decode(self) -> None:
        c = self.config
        waiting_for_slot = bool(self.waiting) and self.slots.available < \
            self.waiting[0].sampling.n
        buffers = self.buffers
        act = buffers.ints[:, ACT] > 0
        f = buffers.floats
        mode = sampling_mode(np.where(act, f[:, TEMP], 0.0), buffers.ints[:, TOPK], f[:, TOPP],
                             f[:, MINP])
        t0 = self.stats.clocks()
        weights, kv_memory = self.weights, self.kv
        kv_memory.cache, outs, steps = self.functions.decode(
            (weights.leaves, weights.merged), kv_memory.cache, buffers.ints, buffers.floats,
            np.int32(c.decode_steps),
            np.bool_(waiting_for_slot), mode)
        t_dispatched = time.perf_counter()
        self.deliver()  # (deliver_after_launch) while the device computes
        t_wait = self.stats.clocks()
        toks, lps, raws, valid, steps = jax.device_get((*outs, steps))
        self.stats.decode_window(t0, t_dispatched, t_wait)
        steps = int(steps)
        self.stats.decode_calls += 1
        self.stats.decode_steps += steps
        recorded = buffers.record(toks, lps, raws, valid, steps)
        if recorded is None:
            return
        active, n, last = recorded
        ints = buffers.ints
        total = int(n.sum())
        self.stats.decode_slot_steps += total
        self.stats.generated_tokens += total
        stop_hit = (ints[active, STOP:] == last[:, None]).any(axis=1)
        length_hit = ints[active, REM] <= 0
        check = buffers.has_stop_str[active]  # stop strings: only if a new token may complete one
        found: dict[int, np.ndarray | None] = {}  # slot -> where a stop string may end
        if check.any():
            try:
                found = buffers.stop_candidates(toks[:steps], valid[:steps], active[check],
                                                n[check])
                check[check] = [slot in found for slot in active[check].tolist()]
            except Exception:  # noqa: BLE001 -- check each such slot alone (after_decode)
                log.exception("stop-string pre-check failed; checking every slot")
        attention = active[stop_hit | length_hit | check]
        for slot in attention.tolist():  # only slots that (may) finish need Python work
            seq = self.slot_seq.get(slot)
            if seq is None or seq.state != DECODE:
                continue
            self.isolated(seq.req, self.after_decode, seq, found.get(slot))

    def after_decode(self, seq: Seq, candidates: np.ndarray | None = None) -> None:
        """Finish a decoding sequence at its earliest stop event in token order, as if each
        decode call made one step: a stop string completed before its last token, else its
        last token a stop id (the device ends a slot there), else a stop string completed by
        its last token, else a spent budget. ``candidates``: the output positions of this
        decode call that may complete a stop string (``SlotBuffers.stop_candidates``)."""
        slot, ints = seq.slot, self.buffers.ints
        tok = int(ints[slot, TOK])
        stop_id = tok in seq.stop_set
        if seq.req.sampling.stop and self.check_stop_strings(seq, candidates, stop_id):
            pass  # finished inside
        elif stop_id:
            self.finish(seq, "stop", tok)
        elif ints[slot, REM] <= 0:
            self.finish(seq, "length", None)

    def check_stop_strings(self, seq: Seq, candidates: np.ndarray | None = None,
                           before_last: bool = False) -> bool:
        """Finish ``seq`` at the first stop string in its output past ``stop_checked`` (only
        before its last token if ``before_last``: ``SlotBuffers.cut_at_stop_string``)."""
        sp = seq.req.sampling
        hit = self.buffers.cut_at_stop_string(seq.slot, self.tokenizer, sp, candidates,
                                              before_last)
        if hit is None:
            return False
        text, index, matched = hit
        seq.stop_text = text if sp.no_stop_trim else text[:index]
        self.finish(seq, "stop", matched)
        return True

    # ------------------------------------------------------------------------- finishing
    def abort_request(self, req: Request) -> None:
        if not self.inbox.is_running(req.rid):
            return
        if req in self.waiting:
            self.waiting.remove(req)
            self.inbox.dequeued()
        for seq in req.seqs:
            if seq.state != DONE:
                self.isolated(req, self.finish, seq, "abort", None)

    def finish(self, seq: Seq, reason: str, matched: int | str | None) -> None:
        if seq.state == DONE:
            return
        req = seq.req
        if seq.state == PREFILL:
            self.orphan_followers(seq)
        if seq.state == PREFILL and seq in self.prefill_queue:
            self.prefill_queue.remove(seq)
        if seq in self.fork_ready:
            self.fork_ready.remove(seq)
        was_decoding = seq.state == DECODE
        seq.state = DONE
        if seq.slot is not None:
            slot = seq.slot
            if was_decoding:  # collect the output from the slot buffers
                seq.out_ids, seq.logprobs, seq.logprobs_raw = self.buffers.output(slot)
                seq.kv_len = min(int(self.buffers.ints[slot, POS]),
                                 seq.prompt_len + len(seq.out_ids))
            self.buffers.deactivate(slot)
            self.slot_seq.pop(slot, None)
            session = req.session_id if (self.config.session_cache and seq.index == 0) else None
            head = tail = None
            if session is not None and seq.kv_len > 0:
                head, tail = self.cached_parts(seq)
            self.slots.release(slot, session, head, tail)
            seq.slot = None
        if reason == "abort":
            self.stats.aborted += 1
        req.results[seq.index] = self.result(seq, reason, matched)
        if all(r is not None for r in req.results):
            self.inbox.finished(req.rid)
            self.deliveries.append(req)
            if not self.config.deliver_after_launch:
                self.deliver()

    def deliver(self) -> None:
        """Set the futures of the finished requests ``finish`` queued. With
        ``deliver_after_launch`` this runs right after a device call is launched, or when the
        engine is about to go idle (``EngineLoop``, ``step``, ``FailurePolicy.recover`` /
        ``shutdown``); else at once from ``finish``. Each result wakes the event loop (a thread
        that wants the GIL)."""
        pending, self.deliveries = self.deliveries, []
        for req in pending:
            if not req.future.done():
                try:
                    req.future.set_result(list(req.results))
                except concurrent.futures.InvalidStateError:
                    pass

    @staticmethod
    def cached_parts(seq: Seq) -> tuple[np.ndarray, np.ndarray | None]:
        """The ids whose KV ``seq``'s slot row holds (``slots.session_prefix``)."""
        return session_prefix(seq.req.ids(), seq.out_ids, seq.kv_len)

    @staticmethod
    def cached_tokens(seq: Seq) -> np.ndarray:
        """``cached_parts`` joined: int32 ``[min(kv_len, L + len(out))]``."""
        head, tail = Scheduler.cached_parts(seq)
        return head if tail is None else join_blocks(head, tail)

    def result(self, seq: Seq, reason: str, matched: int | str | None) -> GenerateResult:
        req, sp = seq.req, seq.req.sampling
        text = None
        if self.tokenizer is not None:
            if seq.stop_text is not None:
                text = seq.stop_text
            else:
                ids = seq.out_ids
                if reason == "stop" and isinstance(matched, int) and not sp.no_stop_trim:
                    ids = ids[:-1]
                text = detokenize(self.tokenizer, ids, sp.skip_special_tokens)
        return GenerateResult(
            output_ids=list(seq.out_ids), output_logprobs=list(seq.logprobs),
            finish_reason=reason, matched_stop=matched, prompt_tokens=seq.prompt_len,
            cached_tokens=seq.cached_tokens, output_logprobs_raw=list(seq.logprobs_raw),
            text=text, rid=req.rid, weight_version=self.weights.version,
            latency_s=time.perf_counter() - req.created)

__all__ = ["Scheduler"]
