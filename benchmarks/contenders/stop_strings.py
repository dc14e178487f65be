"""Host cost of the engine's stop-string check per generated token: old path vs new path.

Engine-like state on the host, no model: ``--slots`` slots each generate ``--tokens`` token ids
drawn uniformly from the real SmolLM2 tokenizer's non-special vocabulary, delivered in decode
calls of ``--decode-steps`` tokens (the ``[steps, slots]`` block ``Scheduler.run_decode`` gets), with
stop strings ``--stop`` (default ``["\\n"]``, as in the BabyAI configs). A slot finishes (and is
trimmed) at its first match, as in the engine.

* old: every slot with stop strings decodes its whole output prefix once per new token (the
  ``Scheduler.check_stop_strings`` loop before ``stop_strings.py``, copied here verbatim);
* new: ``slots_to_check`` over the block, then ``find_stop`` with the may-complete mask for the
  flagged slots only (what the engine does now).

Both run in this process on the same tokens, in alternating rounds; their results (match
position, text, stop) are asserted equal. Also timed: building the mask (``_build_mask``,
uncached).

    python benchmarks/contenders/stop_strings.py [--slots 256] [--tokens 64] [--decode-steps 8] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from agentrl_jax.models.pretrained import resolve_model_path  # noqa: E402
from agentrl_jax.models.tokenizer import load_tokenizer  # noqa: E402
from agentrl_jax.rollout.engine.stop_strings import (  # noqa: E402
    _build_mask, find_stop, may_complete_mask, slots_to_check)


def old_check(tokenizer, ids: list[int], start: int, stops, skip: bool):
    """The pre-``stop_strings.py`` loop of ``Scheduler.check_stop_strings``."""
    for j in range(start, len(ids)):
        text = tokenizer.decode(ids[:j + 1], skip_special_tokens=skip)
        hits = [(text.find(s), s) for s in stops if s in text]
        if hits:
            index, matched = min(hits)
            return j, text, index, matched
    return None


def run(tokenizer, toks: np.ndarray, stops: list[str], decode_steps: int, new: bool):
    """Feed ``toks`` ``[tokens, slots]`` in decode calls -> (seconds of stop checking,
    generated tokens, {slot: match})."""
    n_tok, n_slots = toks.shape
    out_tok = np.zeros((n_slots, n_tok), np.int32)
    out_len = np.zeros((n_slots,), np.int64)
    checked = np.zeros((n_slots,), np.int64)  # SlotBuffers.stop_checked
    live = np.ones((n_slots,), np.bool_)
    mask = may_complete_mask(tokenizer, stops, True)
    masks = [mask] * n_slots
    found, spent, generated = {}, 0.0, 0
    for t0 in range(0, n_tok, decode_steps):
        block = toks[t0:t0 + decode_steps]
        steps = block.shape[0]
        valid = np.broadcast_to(live, block.shape)
        active = np.flatnonzero(live)
        out_tok[active, t0:t0 + steps] = block[:, active].T  # as the engine's append
        out_len[active] += steps
        generated += steps * active.size
        start = time.perf_counter()
        if new:
            attention = active[slots_to_check(block, valid, active, masks)]
        else:
            attention = active
        for slot in attention.tolist():
            length = int(out_len[slot])
            if new:
                hit = find_stop(tokenizer, out_tok[slot, :length], int(checked[slot]), stops,
                                True, masks[slot])
            else:
                hit = old_check(tokenizer, out_tok[slot, :length].tolist(), int(checked[slot]),
                                stops, True)
            if hit is None:
                checked[slot] = length
            else:
                found[slot] = hit
                out_len[slot] = hit[0] + 1
                live[slot] = False
        spent += time.perf_counter() - start
    return spent, generated, found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--slots", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--decode-steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--stop", action="append", default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    stops = args.stop or ["\n"]
    tokenizer = load_tokenizer(resolve_model_path("smollm2"))
    vocab = len(tokenizer)
    specials = set(tokenizer.all_special_ids) | set(tokenizer.get_added_vocab().values())
    plain = np.array([i for i in range(vocab) if i not in specials])

    builds = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        mask = _build_mask(tokenizer, tuple(stops), True)
        builds.append(time.perf_counter() - t0)
    print(f"vocab {vocab}, stops {stops!r}: {int(mask[:-1].sum())} tokens may complete a match "
          f"({mask[:-1].mean():.2%}); mask build {statistics.median(builds) * 1e3:.0f} ms median, "
          f"{max(builds) * 1e3:.0f} ms max of {args.rounds}")

    rng = np.random.default_rng(args.seed)
    per_tok = {"old": [], "new": []}
    for r in range(args.rounds):
        toks = rng.choice(plain, size=(args.tokens, args.slots)).astype(np.int32)
        results = {}
        for name in (("old", "new") if r % 2 == 0 else ("new", "old")):
            spent, generated, found = run(tokenizer, toks, stops, args.decode_steps, name == "new")
            per_tok[name].append(spent / generated * 1e6)
            results[name] = (generated, found)
        assert results["old"] == results["new"], "old and new paths disagree"
    old, new = statistics.median(per_tok["old"]), statistics.median(per_tok["new"])
    generated, found = results["new"]
    print(f"{args.slots} slots x {args.tokens} tokens, decode calls of {args.decode_steps} steps, "
          f"{args.rounds} rounds (last: {generated} generated tokens, {len(found)} slots stopped)")
    print(f"old: {old:.3f} us/token   new: {new:.3f} us/token   old/new: {old / new:.1f}x "
          f"(medians; old rounds {[round(x, 2) for x in per_tok['old']]}, "
          f"new {[round(x, 3) for x in per_tok['new']]})")


if __name__ == "__main__":
    main()
