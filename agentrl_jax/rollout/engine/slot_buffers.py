"""Host-side per-slot state of the decode call: the packed arrays each call sends to the device
and the output buffers its tokens accumulate in.

:class:`SlotBuffers` owns, for ``max_batch`` slots:

* ``ints [B, STOP + max_stop_ids]`` int32 and ``floats [B, 3]`` float32: the packed decode state
  (columns in ``compiled.py``: last token, position, active flag, tokens left, top-k, sampled
  counter, PRNG key, sample index, option limit, stop ids; temperature, top-p, min-p), sent
  as they are to every decode call (one host-to-device copy each);
* ``out_tok`` / ``out_lp`` / ``out_raw`` ``[B, max_length]`` and ``out_len [B]``: each decoding
  slot's sampled tokens, log-probabilities (processed and raw) so far;
* ``has_stop_str [B]``, ``stop_masks`` (per slot: which tokens may complete a stop string,
  ``stop_strings.py``) and ``stop_checked [B]`` (output tokens already known not to complete
  one: checked, or no possible completer among them); ``cut_at_stop_string`` ends an output
  at the token that completes a stop string.

Only the engine thread uses it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from agentrl_jax.rollout.contract import SamplingParams
from agentrl_jax.rollout.engine.compiled import (ACT, CNT, IDX, KEY0, KEY1, OPT, POS, REM, STOP,
                                                 TOK, TOPK)
from agentrl_jax.rollout.engine.requests import Seq
from agentrl_jax.rollout.engine.sampling import seed_to_key
from agentrl_jax.rollout.engine.stop_strings import (completer_hits, find_stop,
                                                     may_complete_mask)


class SlotBuffers:
    """The per-slot decode state and output buffers of ``max_batch`` slots."""

    def __init__(self, max_batch: int, max_length: int, max_stop_ids: int):
        self.max_length = max_length
        self.ints = np.zeros((max_batch, STOP + max_stop_ids), np.int32)
        self.ints[:, STOP:] = -1
        self.floats = np.zeros((max_batch, 3), np.float32)
        self.out_tok = np.zeros((max_batch, max_length), np.int32)
        self.out_lp = np.zeros((max_batch, max_length), np.float32)
        self.out_raw = np.zeros((max_batch, max_length), np.float32)
        self.out_len = np.zeros((max_batch,), np.int64)
        self.has_stop_str = np.zeros((max_batch,), np.bool_)
        self.stop_masks: list[np.ndarray | None] = [None] * max_batch
        self.stop_checked = np.zeros((max_batch,), np.int64)

    def activate(self, seq: Seq, vocab_size: int, tokenizer: Any) -> None:
        """Make prefilled ``seq`` decodable in its slot: the first decode step feeds the last
        prompt token at position ``L - 1`` and samples the first new token; at most
        ``min(max_new_tokens, max_length - L)`` tokens."""
        req, s, sp = seq.req, seq.slot, seq.req.sampling
        L = seq.prompt_len
        row = self.ints[s]
        row[TOK], row[POS], row[ACT] = req.input_ids[-1], L - 1, 1
        row[REM] = min(sp.max_new_tokens, self.max_length - L)
        # top-k of the vocabulary size or more keeps every token: the same as off (0)
        row[TOPK] = sp.top_k if 0 < sp.top_k < vocab_size else 0
        row[CNT] = 0
        row[KEY0:KEY1 + 1] = np.array(seed_to_key(req.seed), np.uint32).view(np.int32)
        row[IDX] = seq.index
        row[OPT] = sp.option_count or 0  # 0: no per-turn option limit
        row[STOP:] = -1
        row[STOP:STOP + len(seq.stop_ids)] = seq.stop_ids
        self.floats[s] = (sp.temperature, sp.top_p, sp.min_p)
        self.out_len[s] = 0
        self.has_stop_str[s] = bool(sp.stop)
        self.stop_checked[s] = 0
        self.stop_masks[s] = (may_complete_mask(tokenizer, sp.stop, sp.skip_special_tokens)
                              if sp.stop else None)

    def deactivate(self, slot: int, forget_stop_mask: bool = False) -> None:
        """The decode call skips ``slot`` (its sequence left or has not started)."""
        self.ints[slot, ACT] = 0
        self.has_stop_str[slot] = False
        if forget_stop_mask:
            self.stop_masks[slot] = None

    def record(self, toks: np.ndarray, lps: np.ndarray, raws: np.ndarray, valid: np.ndarray,
               steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Append a decode call's outputs (``toks`` / ``lps`` / ``raws`` / ``valid`` ``[K, B]``,
        the first ``steps`` rows filled) to the slots' output buffers, one vectorised op per
        step, and advance the packed state of each slot that decoded: ``TOK`` its last token,
        ``POS`` / ``CNT`` += its new tokens, ``REM`` -= them. Returns ``(active slots [A], new
        tokens per active slot [A], last token per active slot [A])`` or ``None`` when no slot
        decoded."""
        before = self.out_len.copy()
        for j in range(steps):  # (NumPy ops on [B]: no [steps, B] one, which would let a busy
            rows = np.flatnonzero(valid[j])  # thread take the GIL, prefill_plan.GIL_SAFE)
            if rows.size == 0:
                break
            n = self.out_len[rows]
            self.out_tok[rows, n] = toks[j, rows]
            self.out_lp[rows, n] = lps[j, rows]
            self.out_raw[rows, n] = raws[j, rows]
            self.out_len[rows] = n + 1
        counts = self.out_len - before
        active = np.flatnonzero(counts)
        if active.size == 0:
            return None
        n = counts[active]
        last = toks[n - 1, active]
        ints = self.ints
        ints[active, TOK] = last
        ints[active, POS] += n
        ints[active, REM] -= n
        ints[active, CNT] += n
        return active, n, last

    def stop_candidates(self, toks: np.ndarray, valid: np.ndarray, slots: np.ndarray,
                        new: np.ndarray) -> dict[int, np.ndarray | None]:
        """The possible stop-string completers of one decode call (``toks`` / ``valid``
        ``[steps, B]``, already ``record`` ed) for ``slots [S]`` (with stop strings; ``new [S]``
        tokens each this call) -> ``{slot: output positions [k] ascending}`` for the slots
        that have one (``None``: tokens before this call are not checked yet; the slot's mask
        finds them all). A slot with none has every output token checked now
        (``stop_checked``; exact: a match appears only at a completer, ``stop_strings.py``)
        if all before this call were."""
        hits = completer_hits(toks, valid, slots, self.stop_masks)  # [steps, S]
        base = self.out_len[slots] - new  # [S] output length before this call
        flagged = hits.any(axis=0)
        ready = self.stop_checked[slots] == base
        quiet = slots[~flagged & ready]
        self.stop_checked[quiet] = self.out_len[quiet]
        return {slot: start + np.flatnonzero(hits[:, i]) if ok else None
                for i, slot, start, ok in zip(np.flatnonzero(flagged).tolist(),
                                              slots[flagged].tolist(), base[flagged].tolist(),
                                              ready[flagged].tolist())}

    def cut_at_stop_string(self, slot: int, tokenizer: Any, sampling: SamplingParams,
                           candidates: np.ndarray | None = None, before_last: bool = False
                           ) -> tuple[str, int, str] | None:
        """Find the first stop string of ``sampling.stop`` in ``slot``'s output past
        ``stop_checked`` (``stop_strings.find_stop``) and cut the output after the token that
        completes it. ``candidates``: the output positions that may complete one, ascending
        (``stop_candidates``; ``None``: the slot's mask finds them). ``before_last``: search
        only before the last output token (a stop id there, which comes first in token
        order). Returns ``(text, index, matched)`` -- the text up to that token, the stop
        string's index in it and the string -- or ``None`` (the positions searched are marked
        checked)."""
        end = int(self.out_len[slot]) - int(before_last)  # search positions [0, end)
        if candidates is not None:
            candidates = candidates[candidates < end]
        hit = find_stop(tokenizer, self.out_tok[slot, :end], int(self.stop_checked[slot]),
                        sampling.stop or [], sampling.skip_special_tokens,
                        self.stop_masks[slot], candidates)
        if hit is None:
            self.stop_checked[slot] = max(end, int(self.stop_checked[slot]))
            return None
        j, text, index, matched = hit
        self.out_len[slot] = j + 1  # drop the tokens decoded after the match
        return text, index, matched

    def output(self, slot: int) -> tuple[list[int], list[float], list[float]]:
        """``slot``'s sampled tokens, log-probabilities and raw log-probabilities so far."""
        length = int(self.out_len[slot])
        return (self.out_tok[slot, :length].tolist(), self.out_lp[slot, :length].tolist(),
                self.out_raw[slot, :length].tolist())

    def reset(self) -> None:
        """Every slot inactive (after a failed device call)."""
        self.ints[:, :STOP] = 0
        self.has_stop_str[:] = False


__all__ = ["SlotBuffers"]
