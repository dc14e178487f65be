"""Host-side per-slot state of the decode call: the packed arrays each call sends to the device
and the output buffers its tokens accumulate in.

:class:`SlotBuffers` owns, for ``max_batch`` slots:

* ``ints [B, STOP + max_stop_ids]`` int32 and ``floats [B, 3]`` float32: the packed decode state
  (columns in ``compiled.py``: last token, position, active flag, tokens left, top-k, sampled
  counter, PRNG key, sample index, stop ids; temperature, top-p, min-p), sent as they are to
  every decode call (one host-to-device copy each);
* ``out_tok`` / ``out_lp`` / ``out_raw`` ``[B, max_length]`` and ``out_len [B]``: each decoding
  slot's sampled tokens, log-probabilities (processed and raw) so far;
* ``has_stop_str [B]`` and ``stop_masks`` (per slot: which tokens may complete a stop string,
  ``stop_strings.py``).

Only the engine thread uses it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from agentrl_jax.rollout.engine.compiled import (ACT, CNT, IDX, KEY0, KEY1, POS, REM, STOP, TOK,
                                                 TOPK)
from agentrl_jax.rollout.engine.requests import Seq
from agentrl_jax.rollout.engine.sampling import seed_to_key
from agentrl_jax.rollout.engine.stop_strings import may_complete_mask


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
        row[STOP:] = -1
        row[STOP:STOP + len(seq.stop_ids)] = seq.stop_ids
        self.floats[s] = (sp.temperature, sp.top_p, sp.min_p)
        self.out_len[s] = 0
        self.has_stop_str[s] = bool(sp.stop)
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
        for j in range(steps):
            rows = np.flatnonzero(valid[j])
            if rows.size == 0:
                break
            n = self.out_len[rows]
            self.out_tok[rows, n] = toks[j, rows]
            self.out_lp[rows, n] = lps[j, rows]
            self.out_raw[rows, n] = raws[j, rows]
            self.out_len[rows] = n + 1
        counts = valid[:steps].sum(axis=0)
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
