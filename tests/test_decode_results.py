"""The engine thread's decode-result path (``Scheduler.run_decode`` after the device call:
``SlotBuffers.record`` / ``stop_candidates``, stop ids, token budgets, stop strings,
``finish``) against a plain Python reference loop, on randomised decode calls.

Host only: a real ``Scheduler`` whose decode function is a stub with the jitted decode's
semantics (``compiled.py``: each active slot emits the next token of its planned stream until a
stop id or its budget ends it). The reference runs each request alone, one token at a time,
whatever the engine's ``decode_steps``: the first token that is a stop id (``"stop"``, the id;
text without it), completes a stop string in the text of the output so far
(``tokenizer.decode`` of every prefix, no masks; ``"stop"``, the string; tokens after it
dropped, text cut before it) or spends the budget (``"length"``) ends it; at one token, in
that order. Byte-level tokens make stop strings span decode calls; the streams mix
text, partial UTF-8 bytes, special and filler tokens. Also: the pieces on their own (the slot
table's split prefix, the block's completer hits, Rust detokenising).
"""

from __future__ import annotations

import concurrent.futures
import functools
import types
from typing import Any

import numpy as np
import pytest

from agentrl_jax.rollout.contract import SamplingParams
from agentrl_jax.rollout.engine.compiled import ACT, CNT, REM, STOP, EngineFunctions
from agentrl_jax.rollout.engine.engine_config import EngineConfig
from agentrl_jax.rollout.engine.inbox import EngineInbox
from agentrl_jax.rollout.engine.requests import EngineStats, Request, Seq
from agentrl_jax.rollout.engine.scheduler import Scheduler
from agentrl_jax.rollout.engine.slots import CachedPrefix, SlotTable, common_prefix_length
from agentrl_jax.rollout.engine.stop_strings import completer_hits, detokenize, may_complete_mask
from rollout_helpers import TINY, byte_tokenizer

EOS = 1  # <|im_end|>
STOPS = (["\n"], ["ab"], ["xyz", "b\n"], ["é"], ["go to"], ["<|im_end|>x"], [" "])


@functools.lru_cache(maxsize=None)
def tokenizer():
    return byte_tokenizer(TINY.vocab_size)


def logprob(token: int, position: int) -> tuple[float, float]:
    """The stub device's log-probabilities of ``token`` sampled at output ``position``."""
    return -((token * 7 + position * 3) % 101) / 10.0, -((token + position) % 13) / 4.0


def random_stream(rng: np.random.Generator, length: int) -> list[int]:
    """Token ids: pieces of text (with the stop strings' characters), single bytes (partial
    UTF-8 among them), specials and filler tokens."""
    tok = tokenizer()
    words = ["go to", " the", "\n", "ab", "a", "b", "xy", "z", "é", "ü", " ", "door", "x"]
    out: list[int] = []
    while len(out) < length:
        u = rng.random()
        if u < 0.7:
            out += tok.encode(words[int(rng.integers(len(words)))], add_special_tokens=False)
        elif u < 0.85:
            out.append(int(rng.integers(3, 259)))  # one byte
        elif u < 0.92:
            out.append(int(rng.integers(0, 3)))  # a special token (EOS among them)
        else:
            out.append(int(rng.integers(259, TINY.vocab_size)))  # a filler token
    return out[:length]


class Harness:
    """A real ``Scheduler`` with a stub device; requests are placed straight into slots."""

    def __init__(self, decode_steps: int, max_batch: int = 16, max_length: int = 96):
        self.config = EngineConfig(max_batch=max_batch, max_length=max_length,
                                   decode_steps=decode_steps, max_stop_ids=2,
                                   prefill_chunks=(16,), prefill_tokens=64)
        self.inbox = EngineInbox(max_queue=1 << 20)
        functions = EngineFunctions(decode=self._decode, prefill=None, copy_rows=None,
                                    merge=None)
        weights = types.SimpleNamespace(state=None, leaves=None, merged=None, version="v0")
        kv = types.SimpleNamespace(cache=None, released=False)
        self.scheduler = Scheduler(self.config, functions, weights, kv, self.inbox,
                                   EngineStats(), tokenizer(), TINY.vocab_size, False)
        self.streams: dict[int, list[int]] = {}

    def _decode(self, weights: Any, cache: Any, ints: np.ndarray, floats: np.ndarray,
                num_steps: Any, exit_on_finish: Any, mode: Any):
        K, B = int(num_steps), ints.shape[0]
        toks, valid = np.zeros((K, B), np.int32), np.zeros((K, B), np.bool_)
        lps, raws = np.zeros((K, B), np.float32), np.zeros((K, B), np.float32)
        active = ints[:, ACT] > 0
        remaining, counter = ints[:, REM].copy(), ints[:, CNT].copy()
        steps = 0
        for i in range(K):
            if not active.any():
                break
            for b in np.flatnonzero(active).tolist():
                t = self.streams[b][counter[b]]
                toks[i, b], valid[i, b] = t, True
                lps[i, b], raws[i, b] = logprob(t, int(counter[b]))
                remaining[b] -= 1
                counter[b] += 1
                if t in ints[b, STOP:] or remaining[b] <= 0:
                    active[b] = False
            steps = i + 1
        return cache, (toks, lps, raws, valid), np.int32(steps)

    def start(self, rid: str, prompt: list[int], sampling: SamplingParams, stop_ids: list[int],
              stream: list[int]) -> Request:
        """A request decoding in a free slot (its prompt prefilled, its session cached)."""
        s = self.scheduler
        req = Request(rid, prompt, sampling, f"session-{rid}", concurrent.futures.Future(),
                      seed=0)
        req.seqs = [Seq(req, 0, stop_ids)]
        self.inbox.submit(req)
        self.inbox.dequeued()
        seq = req.seqs[0]
        slot = s.slots.acquire()
        s.bind(seq, slot)
        seq.cursor = seq.kv_len = len(prompt) - 1
        self.streams[slot] = stream
        s.prefill_done(seq)
        return req


def reference(prompt: list[int], stream: list[int], sampling: SamplingParams,
              stop_ids: list[int], max_length: int) -> dict[str, Any]:
    """One request alone, one token at a time, as the module docstring says: the earliest stop
    event in token order wins, whatever the decode calls' sizes."""
    tok = tokenizer()
    budget = min(sampling.max_new_tokens, max_length - len(prompt))
    out: list[int] = []
    for token in stream:
        out.append(token)
        if token in stop_ids:
            ids = out if sampling.no_stop_trim else out[:-1]
            return dict(ids=out, reason="stop", matched=token,
                        text=tok.decode(ids, skip_special_tokens=sampling.skip_special_tokens))
        text = tok.decode(out, skip_special_tokens=sampling.skip_special_tokens)
        hits = sorted((text.find(s), s) for s in sampling.stop or [] if s in text)
        if hits:
            index, matched = hits[0]
            return dict(ids=list(out), reason="stop", matched=matched,
                        text=text if sampling.no_stop_trim else text[:index])
        if len(out) >= budget:
            return dict(ids=out, reason="length", matched=None, text=text)
    raise AssertionError("the stream ended before the request")


@pytest.mark.parametrize("decode_steps", [1, 3, 8])
@pytest.mark.parametrize("seed", range(4))
def test_run_decode_matches_a_reference_loop(seed: int, decode_steps: int) -> None:
    rng = np.random.default_rng(seed * 10 + decode_steps)
    h = Harness(decode_steps)
    s = h.scheduler
    expected: dict[str, dict[str, Any]] = {}
    requests: dict[str, Request] = {}
    count = 0
    for _ in range(2000):
        while s.slots.available and count < 80:  # new requests join between calls
            rid = f"r{count}"
            count += 1
            prompt = rng.integers(3, TINY.vocab_size, int(rng.integers(2, 40))).tolist()
            stop = STOPS[int(rng.integers(len(STOPS)))] if rng.random() < 0.8 else None
            sampling = SamplingParams(max_new_tokens=int(rng.integers(1, 30)), stop=stop,
                                      skip_special_tokens=bool(rng.random() < 0.8),
                                      no_stop_trim=bool(rng.random() < 0.2))
            stop_ids = [EOS] if rng.random() < 0.7 else []
            stream = random_stream(rng, 40)
            requests[rid] = h.start(rid, prompt, sampling, stop_ids, stream)
            expected[rid] = reference(prompt, stream, sampling, stop_ids, h.config.max_length)
        if not s.slot_seq:
            break
        s.run_decode()
    assert count == 80 and not s.slot_seq
    finishes = {r: 0 for r in ("stop", "length")}
    for rid, req in requests.items():
        (got,) = req.future.result(timeout=0)
        want = expected[rid]
        assert (got.output_ids, got.finish_reason, got.matched_stop, got.text) == (
            want["ids"], want["reason"], want["matched"], want["text"]), rid
        lp = [logprob(t, j) for j, t in enumerate(want["ids"])]
        np.testing.assert_array_equal(got.output_logprobs, np.float32([a for a, _ in lp]))
        np.testing.assert_array_equal(got.output_logprobs_raw, np.float32([b for _, b in lp]))
        finishes[got.finish_reason] += 1
    assert min(finishes.values()) > 5  # both kinds of finish happened
    assert sum(isinstance(requests[r].future.result()[0].matched_stop, str)
               for r in requests) > 5  # and stop strings matched


@pytest.mark.parametrize("decode_steps", [1, 8])
def test_stop_string_before_a_later_stop_id_in_one_call_wins(decode_steps: int) -> None:
    """Hand-computed: "go\n" then " to" then EOS, all inside one 8-step call. The stop string
    "\n" completes at output position 2, before the stop id: the request ends there."""
    h = Harness(decode_steps)
    stream = tokenizer().encode("go\n to", add_special_tokens=False) + [EOS] + [7] * 8
    sampling = SamplingParams(max_new_tokens=20, stop=["\n"])
    req = h.start("a", [5, 6, 7], sampling, [EOS], stream)
    while h.scheduler.slot_seq:
        h.scheduler.run_decode()
    (got,) = req.future.result(timeout=0)
    assert (got.output_ids, got.finish_reason, got.matched_stop, got.text) == (
        stream[:3], "stop", "\n", "go")
    np.testing.assert_array_equal(got.output_logprobs,
                                  np.float32([logprob(t, j)[0] for j, t in enumerate(stream[:3])]))


def test_finished_session_keeps_prompt_and_output_ids() -> None:
    """The slot of a finished session keeps the prompt then the output fed back (the last
    sampled token has no KV yet): the next turn's prompt reuses all of it."""
    h = Harness(decode_steps=4)
    prompt = list(range(10, 30))
    stream = tokenizer().encode("go to the door", add_special_tokens=False)
    req = h.start("a", prompt, SamplingParams(max_new_tokens=6), [EOS], stream)
    while h.scheduler.slot_seq:
        h.scheduler.run_decode()
    (result,) = req.future.result(timeout=0)
    assert result.output_ids == stream[:6] and result.finish_reason == "length"
    slot, reuse = h.scheduler.slots.acquire_for_session(
        "session-a", np.asarray(prompt + stream[:6] + [7, 8], np.int32), max_reuse=100)
    assert reuse == len(prompt) + 5


def test_split_prefix_matches_the_joined_one() -> None:
    rng = np.random.default_rng(0)
    for _ in range(300):
        head = rng.integers(0, 4, int(rng.integers(0, 12))).astype(np.int32)
        tail = rng.integers(0, 4, int(rng.integers(0, 5))).astype(np.int32)
        ids = rng.integers(0, 4, int(rng.integers(0, 20))).astype(np.int32)
        if rng.random() < 0.5:  # often a true extension
            ids = np.concatenate([head, tail, ids])[:int(rng.integers(0, 30))]
        prefix = CachedPrefix("s", head, tail)
        joined = np.concatenate([head, tail])
        np.testing.assert_array_equal(prefix.tokens, joined)
        assert len(prefix) == len(joined)
        assert prefix.shared_length(ids) == common_prefix_length(joined, ids)
    table = SlotTable(2)
    table.release(table.acquire(), "s", np.arange(5, dtype=np.int32), np.int32([9, 9]))
    assert table.acquire_for_session("s", np.int32([0, 1, 2, 3, 4, 9, 1]), 10)[1] == 6


def test_completer_hits_against_a_loop() -> None:
    tok = tokenizer()
    rng = np.random.default_rng(1)
    masks = [may_complete_mask(tok, stop, True) for stop in (["\n"], ["ab"], ["xyz"])]
    B = 300
    slot_masks: list[np.ndarray | None] = [masks[int(rng.integers(3))] for _ in range(B)]
    for steps in (1, 3, 8):
        toks = rng.integers(0, TINY.vocab_size + 40, (steps, B)).astype(np.int32)
        valid = rng.random((steps, B)) < 0.8
        slots = np.sort(rng.choice(B, 200, replace=False))
        hits = completer_hits(toks, valid, slots, slot_masks)
        for i, slot in enumerate(slots.tolist()):
            mask = slot_masks[slot]
            for j in range(steps):
                want = bool(valid[j, slot]) and bool(mask[min(toks[j, slot], len(mask) - 1)])
                assert hits[j, i] == want


def test_detokenize_is_the_tokenizers_decode() -> None:
    from agentrl_jax.models.pretrained import resolve_model_path
    from agentrl_jax.models.tokenizer import load_tokenizer

    toks = [tokenizer()]
    try:
        toks.append(load_tokenizer(resolve_model_path("smollm2")))
    except FileNotFoundError:
        pass
    rng = np.random.default_rng(2)
    for tok in toks:
        for _ in range(300):
            ids = rng.integers(0, len(tok) + 3, int(rng.integers(0, 12))).tolist()
            for skip in (True, False):
                assert detokenize(tok, ids, skip) == tok.decode(ids, skip_special_tokens=skip)
