"""The engine thread's scheduling loop: admitting queued requests into free decode slots (with
prefix-cache reuse and forks of ``n > 1`` samples), batched chunked prefill, the jitted decode
steps, stop tokens / stop strings, and finishing a sequence into its ``GenerateResult``. A mixin
of :class:`~agentrl_jax.rollout.engine.engine.Engine`; only the engine thread runs it."""

from __future__ import annotations

import concurrent.futures
import logging
import time

import jax
import numpy as np

from agentrl_jax.rollout.contract import GenerateResult
from agentrl_jax.rollout.engine.compiled import (ACT, CNT, IDX, KEY0, KEY1, MINP, POS, REM, STOP,
                                                 TEMP, TOK, TOPK, TOPP)
from agentrl_jax.rollout.engine.prefill_plan import (build_rows, copy_blocks, plan_chunked,
                                                     plan_packed, positions_upto)
from agentrl_jax.rollout.engine.requests import DECODE, DONE, FORK_WAIT, PREFILL, Request, Seq
from agentrl_jax.rollout.engine.sampling import sampling_mode, seed_to_key
from agentrl_jax.rollout.engine.stop_strings import find_stop, may_complete_mask, slots_to_check

log = logging.getLogger(__name__)


class Scheduler:
    """The engine thread's loop; ``self`` is an ``Engine``."""

    def _idle(self) -> bool:
        """Nothing for the engine thread to do (call with ``self._cv`` held)."""
        return not self._closed and not self._commands and (
            self._paused or not (self._incoming or self._waiting or self._slot_seq
                                 or self._prefill_queue or self._fork_ready))

    def _loop(self) -> None:
        while True:
            if self._deliveries:
                with self._cv:
                    idle = self._idle()
                if idle:  # no device call will launch: hand over what finished (outside the
                    self._deliver()  # lock: a result's callbacks may submit again)
            with self._cv:
                while self._idle():
                    t0 = time.perf_counter()
                    self._cv.wait()
                    self.stats.idle_time_s += time.perf_counter() - t0
                if self._closed:
                    break
                commands, self._commands = self._commands, []
                incoming, self._incoming = self._incoming, []
            self._waiting.extend(incoming)
            for fn, future in commands:
                try:
                    future.set_result(fn())
                except BaseException as e:  # noqa: BLE001 -- reported to the caller
                    future.set_exception(e)
            if self._paused:
                continue
            t0 = time.perf_counter()
            try:
                self._step()
            except Exception as e:  # noqa: BLE001 -- never let the engine thread die
                log.exception("engine step failed")
                self._recover(e)
            self.stats.step_time_s += time.perf_counter() - t0
        self._shutdown()

    def _step(self) -> None:
        if self._cache is None:  # released (release_kv_cache) while the engine was idle
            if not self._waiting:  # woken by a command only: stay released
                return
            self._reallocate_cache()
        self._admit()
        for _ in range(self.config.prefill_calls_per_step):  # prefill first, bounded
            if not self._prefill_queue:
                break
            self._run_prefill()
        if self._fork_ready:
            self._run_forks()
        if any(s.state == DECODE for s in self._slot_seq.values()):
            self._run_decode()
        if self._deliveries and not (self._prefill_queue or self._fork_ready or any(
                s.state == DECODE for s in self._slot_seq.values())):
            self._deliver()  # the next step launches nothing that the hand-over could overlap

    # ----------------------------------------------------------------------- admission
    def _admit(self) -> None:
        while self._waiting:
            req = self._waiting[0]
            if req.aborted:
                self._waiting.popleft()
                self._dequeued()
                for seq in req.seqs:
                    self._isolated(req, self._finish, seq, "abort", None)
                continue
            n = req.sampling.n
            if self._slots.available < n:
                return
            self._waiting.popleft()
            self._dequeued()
            self._isolated(req, self._admit_one, req)

    def _admit_one(self, req: Request) -> None:
        """Give a request its slots and queue its prefill (or activate it at once)."""
        c = self.config
        n = req.sampling.n
        self.stats.requests += 1
        ids = req.ids()
        L = len(req.input_ids)
        first = req.seqs[0]
        session = req.session_id if c.session_cache else None
        slot, reuse = self._slots.acquire_for_session(session, ids, max_reuse=L - 1)
        self._bind(first, slot)
        first.cursor = first.kv_len = first.cached_tokens = reuse
        self.stats.prompt_tokens += L * n
        self.stats.cached_tokens += reuse
        for seq in req.seqs[1:]:
            self._bind(seq, self._slots.acquire())
            seq.state = FORK_WAIT
            seq.cached_tokens = L - 1
            self.stats.cached_tokens += L - 1
            first.forks.append(seq)
        key = tuple(req.input_ids) if c.share_prompts and reuse < L - 1 else None
        leader = self._prompt_leaders.get(key) if key is not None and n == 1 else None
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
            self._prefill_queue.append(first)
            if key is not None:
                first.prompt_key = key
                self._prompt_leaders[key] = first
        else:
            self._prefill_done(first)
        self.stats.prefill_tokens += n  # the last prompt token, fed by the first decode step

    def _drop_leader(self, seq: Seq) -> None:
        """``seq`` no longer prefills a prompt others may share (its prefill ended)."""
        key, seq.prompt_key = seq.prompt_key, None
        if key is not None and self._prompt_leaders.get(key) is seq:
            del self._prompt_leaders[key]

    def _orphan_followers(self, seq: Seq) -> None:
        """``seq`` ends before its prefill did: the sequences of other requests that waited to
        copy its row prefill their prompts themselves."""
        self._drop_leader(seq)
        own = []
        for f in seq.forks:
            if f.req is seq.req:
                own.append(f)
            elif f.state == FORK_WAIT and f.slot is not None:
                f.state = PREFILL
                f.cursor = f.kv_len = f.cached_tokens = 0
                self.stats.prefill_tokens += f.prompt_len - 1
                self._prefill_queue.append(f)
        seq.forks = own

    def _dequeued(self) -> None:
        with self._cv:
            self._num_waiting -= 1

    def _bind(self, seq: Seq, slot: int) -> None:
        seq.slot = slot
        self._slot_seq[slot] = seq
        self._ints[slot, ACT] = 0

    def _prefill_done(self, seq: Seq) -> None:
        self._drop_leader(seq)
        if seq.forks:
            self._fork_ready.append(seq)
            seq.state = FORK_WAIT
        else:
            self._activate(seq)

    def _activate(self, seq: Seq) -> None:
        """Make a prefilled sequence decodable: its first decode step feeds the last prompt
        token at position L-1 and samples the first new token."""
        req, s, sp = seq.req, seq.slot, seq.req.sampling
        L = seq.prompt_len
        seq.state = DECODE
        seq.kv_len = L - 1
        row = self._ints[s]
        row[TOK], row[POS], row[ACT] = req.input_ids[-1], L - 1, 1
        row[REM] = min(sp.max_new_tokens, self.config.max_length - L)
        # top-k of the vocabulary size or more keeps every token: the same as off (0)
        row[TOPK] = sp.top_k if 0 < sp.top_k < self.vocab_size else 0
        row[CNT] = 0
        row[KEY0:KEY1 + 1] = np.array(seed_to_key(req.seed), np.uint32).view(np.int32)
        row[IDX] = seq.index
        row[STOP:] = -1
        row[STOP:STOP + len(seq.stop_ids)] = seq.stop_ids
        self._floats[s] = (sp.temperature, sp.top_p, sp.min_p)
        self._out_len[s] = 0
        self._has_stop_str[s] = bool(sp.stop)
        self._stop_masks[s] = (may_complete_mask(self.tokenizer, sp.stop, sp.skip_special_tokens)
                               if sp.stop else None)

    # ------------------------------------------------------------------------- prefill
    def _run_prefill(self) -> None:
        c = self.config
        queue = self._prefill_queue
        if self.packed_prefill:  # rows of PACKED_ROW tokens, several per sequence
            chunk, rows, pieces = plan_packed(queue, c.chunk_buckets[0], c.packed_row_buckets())
        else:  # one row per sequence, the chunk bucket that prefills the most
            chunk, rows, pieces = plan_chunked(
                queue, [(ch, c.prefill_rows(ch)) for ch in c.chunk_buckets])
        slot_ids, tokens, positions, counts = build_rows(
            pieces, rows, chunk, c.max_batch, c.max_length, self._write_rows,
            lambda seq: seq.state != DONE, lambda seq: seq.slot)
        kv = c.prefill_kv(chunk, max((start + n for (_, start, _), n in zip(pieces, counts)),
                                     default=0))
        t0 = time.perf_counter()
        self._cache = self._prefill_fn(self._state, self._cache, slot_ids, tokens, positions, kv)
        self._deliver()  # (deliver_after_launch) while the device computes
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
        self._prefill_queue = [s for s in queue
                               if s.state != DONE and s.cursor < s.prompt_len - 1]
        for seq in done:
            self._isolated(seq.req, self._prefill_done, seq)
        jax.block_until_ready(self._cache.keys[0])
        self.stats.prefill_time_s += time.perf_counter() - t0

    def _write_rows(self, seq: Seq, start: int, n: int, tokens: np.ndarray,
                    positions: np.ndarray) -> bool:
        """``_prefill_row`` for ``seq`` alone (``_isolated``): whether it succeeded."""
        return self._isolated(seq.req, self._prefill_row, seq, start, n, tokens, positions)

    @staticmethod
    def _prefill_row(seq: Seq, start: int, n: int, tokens: np.ndarray, positions: np.ndarray
                     ) -> None:
        """Write a sequence's ``n`` prompt tokens from position ``start`` into a prefill row, or
        consecutive rows of one call: ``tokens`` / ``positions`` int32 ``[>= n]`` (1-D, the
        rows flattened); in blocks that keep the GIL (``prefill_plan.copy_blocks``)."""
        end = start + n
        copy_blocks(tokens, seq.req.ids()[start:end])
        copy_blocks(positions, positions_upto(end)[start:end])

    def _run_forks(self) -> None:
        """Copy the prefilled prompt row of each ``n > 1`` request to its other samples."""
        c = self.config
        pairs = []
        for seq in self._fork_ready:  # (a sequence of another request may have ended waiting)
            pairs.extend((seq.slot, f.slot) for f in seq.forks
                         if f.state == FORK_WAIT and f.slot is not None)
        for i in range(0, len(pairs), c.copy_rows):
            part = pairs[i:i + c.copy_rows]
            src = np.zeros((c.copy_rows,), np.int32)
            dst = np.full((c.copy_rows,), c.max_batch, np.int32)
            for j, (a, b) in enumerate(part):
                src[j], dst[j] = a, b
            self._cache = self._copy_fn(self._cache, src, dst)
            self.stats.copy_calls += 1
        for seq in list(self._fork_ready):
            if seq.state == DONE:
                continue
            self._isolated(seq.req, self._activate, seq)
            for f in seq.forks:
                if f.state == FORK_WAIT:
                    self._isolated(f.req, self._activate, f)
        self._fork_ready = []

    # -------------------------------------------------------------------------- decode
    def _run_decode(self) -> None:
        c = self.config
        waiting_for_slot = bool(self._waiting) and self._slots.available < \
            self._waiting[0].sampling.n
        act = self._ints[:, ACT] > 0
        f = self._floats
        mode = sampling_mode(np.where(act, f[:, TEMP], 0.0), self._ints[:, TOPK], f[:, TOPP],
                             f[:, MINP])
        t0 = time.perf_counter()
        self._cache, outs, steps = self._decode_fn(
            (self._state, self._merged), self._cache, self._ints, self._floats,
            np.int32(c.decode_steps),
            np.bool_(waiting_for_slot), mode)
        self._deliver()  # (deliver_after_launch) while the device computes
        toks, lps, raws, valid, steps = jax.device_get((*outs, steps))
        self.stats.decode_time_s += time.perf_counter() - t0
        steps = int(steps)
        self.stats.decode_calls += 1
        self.stats.decode_steps += steps
        # Append the new tokens to the per-slot output buffers: one vectorised op per step.
        for j in range(steps):
            rows = np.flatnonzero(valid[j])
            if rows.size == 0:
                break
            n = self._out_len[rows]
            self._out_tok[rows, n] = toks[j, rows]
            self._out_lp[rows, n] = lps[j, rows]
            self._out_raw[rows, n] = raws[j, rows]
            self._out_len[rows] = n + 1
        counts = valid[:steps].sum(axis=0)
        active = np.flatnonzero(counts)
        if active.size == 0:
            return
        n = counts[active]
        last = toks[n - 1, active]
        ints = self._ints
        ints[active, TOK] = last
        ints[active, POS] += n
        ints[active, REM] -= n
        ints[active, CNT] += n
        total = int(n.sum())
        self.stats.decode_slot_steps += total
        self.stats.generated_tokens += total
        stop_hit = (ints[active, STOP:] == last[:, None]).any(axis=1)
        length_hit = ints[active, REM] <= 0
        check = self._has_stop_str[active]  # stop strings: only if a new token may complete one
        if check.any():
            try:
                check[check] = slots_to_check(toks[:steps], valid[:steps], active[check],
                                              self._stop_masks)
            except Exception:  # noqa: BLE001 -- check each such slot alone (_after_decode)
                log.exception("stop-string pre-check failed; checking every slot")
        attention = active[stop_hit | length_hit | check]
        for slot in attention.tolist():  # only slots that (may) finish need Python work
            seq = self._slot_seq.get(slot)
            if seq is None or seq.state != DECODE:
                continue
            self._isolated(seq.req, self._after_decode, seq)

    def _after_decode(self, seq: Seq) -> None:
        """Finish a decoding sequence if its last token is a stop id, its output contains a
        stop string, or its token budget is spent."""
        slot, ints = seq.slot, self._ints
        tok = int(ints[slot, TOK])
        if tok in seq.stop_set:
            self._finish(seq, "stop", tok)
        elif seq.req.sampling.stop and self._check_stop_strings(seq):
            pass  # finished inside
        elif ints[slot, REM] <= 0:
            self._finish(seq, "length", None)

    def _check_stop_strings(self, seq: Seq) -> bool:
        sp, slot = seq.req.sampling, seq.slot
        length = int(self._out_len[slot])
        hit = find_stop(self.tokenizer, self._out_tok[slot, :length], seq.stop_checked,
                        sp.stop or [], sp.skip_special_tokens, self._stop_masks[slot])
        if hit is None:
            seq.stop_checked = length
            return False
        j, text, index, matched = hit
        self._out_len[slot] = j + 1  # drop the tokens decoded after the match
        seq.stop_text = text if sp.no_stop_trim else text[:index]
        self._finish(seq, "stop", matched)
        return True

    # ------------------------------------------------------------------------- finishing
    def _abort_request(self, req: Request) -> None:
        if req.rid not in self._requests:
            return
        if req in self._waiting:
            self._waiting.remove(req)
            self._dequeued()
        for seq in req.seqs:
            if seq.state != DONE:
                self._isolated(req, self._finish, seq, "abort", None)

    def _finish(self, seq: Seq, reason: str, matched: int | str | None) -> None:
        if seq.state == DONE:
            return
        req = seq.req
        if seq.state == PREFILL:
            self._orphan_followers(seq)
        if seq.state == PREFILL and seq in self._prefill_queue:
            self._prefill_queue.remove(seq)
        if seq in self._fork_ready:
            self._fork_ready.remove(seq)
        was_decoding = seq.state == DECODE
        seq.state = DONE
        if seq.slot is not None:
            slot = seq.slot
            if was_decoding:  # collect the output from the slot buffers
                length = int(self._out_len[slot])
                seq.out_ids = self._out_tok[slot, :length].tolist()
                seq.logprobs = self._out_lp[slot, :length].tolist()
                seq.logprobs_raw = self._out_raw[slot, :length].tolist()
                seq.kv_len = min(int(self._ints[slot, POS]), seq.prompt_len + length)
            self._ints[slot, ACT] = 0
            self._has_stop_str[slot] = False
            self._slot_seq.pop(slot, None)
            session = req.session_id if (self.config.session_cache and seq.index == 0) else None
            tokens = None
            if session is not None and seq.kv_len > 0:
                tokens = self._cached_tokens(seq)
            self._slots.release(slot, session, tokens)
            seq.slot = None
        if reason == "abort":
            self.stats.aborted += 1
        req.results[seq.index] = self._result(seq, reason, matched)
        if all(r is not None for r in req.results):
            with self._cv:
                self._requests.pop(req.rid, None)
            self._deliveries.append(req)
            if not self.config.deliver_after_launch:
                self._deliver()

    def _deliver(self) -> None:
        """Set the futures of the finished requests ``_finish`` queued. With
        ``deliver_after_launch`` this runs right after a device call is launched, or when the
        engine is about to go idle (``_loop``, ``_step``, ``_recover``, ``_shutdown``); else at
        once from ``_finish``. Each result wakes the event loop (a thread that wants the GIL)."""
        pending, self._deliveries = self._deliveries, []
        for req in pending:
            if not req.future.done():
                try:
                    req.future.set_result(list(req.results))
                except concurrent.futures.InvalidStateError:
                    pass

    @staticmethod
    def _cached_tokens(seq: Seq) -> np.ndarray:
        """The ids whose KV ``seq``'s slot row holds, int32 ``[min(kv_len, L + len(out))]``: the
        prompt then the output, cut at ``kv_len`` (from the prompt's ids array, not a list of
        thousands of ints converted again; copies in blocks that keep the GIL)."""
        ids = seq.req.ids()
        if seq.kv_len <= len(ids):
            return ids[:seq.kv_len]
        out = seq.out_ids[:seq.kv_len - len(ids)]
        tokens = np.empty((len(ids) + len(out),), np.int32)
        copy_blocks(tokens, ids)
        tokens[len(ids):] = out
        return tokens

    def _result(self, seq: Seq, reason: str, matched: int | str | None) -> GenerateResult:
        req, sp = seq.req, seq.req.sampling
        text = None
        if self.tokenizer is not None:
            if seq.stop_text is not None:
                text = seq.stop_text
            else:
                ids = seq.out_ids
                if reason == "stop" and isinstance(matched, int) and not sp.no_stop_trim:
                    ids = ids[:-1]
                text = self.tokenizer.decode(ids, skip_special_tokens=sp.skip_special_tokens)
        return GenerateResult(
            output_ids=list(seq.out_ids), output_logprobs=list(seq.logprobs),
            finish_reason=reason, matched_stop=matched, prompt_tokens=seq.prompt_len,
            cached_tokens=seq.cached_tokens, output_logprobs_raw=list(seq.logprobs_raw),
            text=text, rid=req.rid, weight_version=self.weight_version,
            latency_s=time.perf_counter() - req.created)

    # ------------------------------------------------------------------- fault isolation


__all__ = ["Scheduler"]
