"""Stop strings (``rollout/engine/stop_strings.py`` + the engine hook) against a plain reference that
decodes every output prefix and takes the first one containing a stop string.

Tokenizers: the real SmolLM2 one (byte-level BPE, 49k tokens) and the byte-level test tokenizer
(one token per byte, so multi-byte characters span tokens; half of its ids are added tokens).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from agentrl_jax.rollout.contract import SamplingParams
from agentrl_jax.rollout.engine.stop_strings import (candidates, find_stop, may_complete_mask,
                                              slots_to_check)
from rollout_helpers import TINY, byte_tokenizer, make_engine, random_prompt, tiny_model

TEXTS = [
    "Thought: the red ball is ahead.\nAction: go forward\n\nObservation: you see a wall",
    "café, déjà vu; 日本語のテキスト\nprix: 5€uro — naïve façade 🙂🙂 ok\n",
    "def f(x):\n    return x  # ünïcödé\r\n\tend",
]


def reference(tok, ids, stops, skip=True):
    """The first prefix ``ids[:j + 1]`` whose text holds a stop string ->
    ``(j, text, index, matched)`` (matched: the stop found earliest, ties: the smallest), or
    ``None``."""
    for j in range(len(ids)):
        text = tok.decode(list(ids[:j + 1]), skip_special_tokens=skip)
        found = sorted((text.find(s), s) for s in stops if s in text)
        if found:
            return (j, text) + found[0]
    return None


def incremental(tok, ids, stops, skip, chunk):
    """The engine's way: new tokens arrive ``chunk`` at a time; a chunk is checked only if
    ``slots_to_check`` flags it, from the last checked position (``Seq.stop_checked``)."""
    mask = may_complete_mask(tok, stops, skip)
    ids = np.asarray(ids, np.int64)
    checked = 0
    for end in range(chunk, len(ids) + chunk, chunk):
        block = ids[end - chunk:end, None]  # [steps, 1 slot]
        if slots_to_check(block, np.ones(block.shape, bool), np.array([0]), [mask])[0]:
            hit = find_stop(tok, ids[:end], checked, stops, skip, mask)
            if hit is not None:
                return hit
            checked = min(end, len(ids))
    return None


def check_all_paths(tok, ids, stops, skip=True):
    expected = reference(tok, ids, stops, skip)
    mask = may_complete_mask(tok, stops, skip)
    arr = np.asarray(ids, np.int64)
    assert find_stop(tok, arr, 0, stops, skip, mask) == expected
    assert find_stop(tok, arr, 0, stops, skip, None) == expected
    for chunk in (1, 3, 8):
        assert incremental(tok, ids, stops, skip, chunk) == expected, (chunk, stops)
    return expected


@functools.lru_cache(maxsize=None)
def smollm2_tokenizer():
    from agentrl_jax.models.pretrained import resolve_model_path
    from agentrl_jax.models.tokenizer import load_tokenizer

    try:
        return load_tokenizer(resolve_model_path("smollm2"))
    except FileNotFoundError as e:
        pytest.skip(f"SmolLM2 not available: {e}")


@pytest.fixture(scope="module")
def smol():
    return smollm2_tokenizer()


@pytest.fixture(scope="module")
def btok():
    return byte_tokenizer(TINY.vocab_size)


# ---------------------------------------------------------------------------------- the mask
def test_mask_smollm2(smol):
    vocab = len(smol)
    mask = may_complete_mask(smol, ["\n"], True)
    assert mask.shape == (vocab + 1,) and mask[vocab]  # ids >= V: may complete
    assert may_complete_mask(smol, ("\n",), True) is mask  # cached
    tokens = smol.convert_ids_to_tokens(list(range(vocab)))
    newline = [i for i, t in enumerate(tokens) if "Ċ" in t]  # byte-level spelling of "\n"
    assert len(newline) > 50 and mask[newline].all()
    ids = smol.convert_tokens_to_ids
    for word in ("hello", "Ġthe", "Action", ":", "Ġforward"):
        assert not mask[ids(word)], word
    assert mask[smol.all_special_ids].all()
    assert mask[:vocab].mean() < 0.02  # the point: few tokens need a decode
    hello, newline_id = ids("hello"), ids("Ċ")
    assert candidates(mask, np.array([hello, newline_id, vocab + 5, hello])).tolist() == [1, 2]
    # the last character decides: "Action:" may be completed by tokens holding ":"
    colon = may_complete_mask(smol, ["Action:"], True)
    assert colon[ids(":")] and not colon[ids("Action")]
    # a stop ending in a space (which an isolated decode may drop) checks every token
    assert may_complete_mask(smol, ["go "], True).all()


def test_mask_byte_tokenizer(btok):
    mask = may_complete_mask(btok, ["\n"], True)
    ids = btok.convert_tokens_to_ids
    assert mask[btok.encode("\n")[0]] and not mask[btok.encode("a")[0]]
    high = btok.encode("é")  # two byte tokens, each decodes to U+FFFD alone
    assert len(high) == 2 and mask[high].all()
    assert mask[ids("<extra_3>")] and mask[ids("<|im_end|>")]  # added / special tokens


def test_slots_to_check_matches_brute_force(btok):
    rng = np.random.default_rng(0)
    masks = {"a": may_complete_mask(btok, ["a"], True), "nl": may_complete_mask(btok, ["\n"], True)}
    for _ in range(20):
        steps, batch = 4, 8
        toks = rng.integers(0, 600, size=(steps, batch))  # some ids past the vocabulary
        valid = rng.random((steps, batch)) < 0.7
        slots = np.flatnonzero(rng.random(batch) < 0.6)
        per_slot = [masks[rng.choice(["a", "nl"])] for _ in range(batch)]
        got = slots_to_check(toks, valid, slots, per_slot)
        want = [any(valid[t, s] and per_slot[s][min(toks[t, s], len(per_slot[s]) - 1)]
                    for t in range(steps)) for s in slots]
        assert got.tolist() == want


# ------------------------------------------------------------------ find_stop vs reference
SMOL_STOPS = [["\n"], ["Action:"], ["\n", "ball"], ["é"], ["日本"], ["🙂"], ["€uro"],
              [" wall"], ["forward "], ["façade 🙂"], ["x  #"], ["zzz"]]


def test_find_stop_smollm2(smol):
    rng = np.random.default_rng(1)
    seqs = [smol.encode(t) for t in TEXTS]
    seqs.append(smol.encode(TEXTS[0]) + [2] + smol.encode(TEXTS[1]))  # a special in between
    seqs += [rng.integers(0, len(smol), size=40).tolist() for _ in range(4)]
    hits = 0
    for ids in seqs:
        for stops in SMOL_STOPS:
            for skip in (True, False):
                hits += check_all_paths(smol, ids, stops, skip) is not None
    assert check_all_paths(smol, seqs[3], [">"], False)[0] == len(smol.encode(TEXTS[0]))
    assert hits >= 40


BYTE_STOPS = [["\n"], ["é"], ["日本"], ["x€y"], ["€"], ["çade 🙂"], ["_1"], [">"], ["\t"],
              ["ok\n", "d"], ["\r\n"], ["qqq"]]


def test_find_stop_byte_tokenizer(btok):
    rng = np.random.default_rng(2)
    seqs = [btok.encode(t) for t in TEXTS + ["ax€y", "prix 5€ x€y"]]
    seqs.append(btok.encode("日") + btok.convert_tokens_to_ids(["<extra_1>", "<|im_end|>"])
                + btok.encode("本 日本"))  # added tokens inside a split character
    seqs += [rng.integers(0, 520, size=40).tolist() for _ in range(6)]  # bytes, specials, fillers
    hits = 0
    for ids in seqs:
        for stops in BYTE_STOPS:
            for skip in (True, False):
                hits += check_all_paths(btok, ids, stops, skip) is not None
    j, text, index, matched = check_all_paths(btok, btok.encode("prix 5€ x€y"), ["x€y"])
    assert j == len("prix 5€ x€y".encode()) - 1  # the last byte of "y"
    assert (text[:index], matched) == ("prix 5€ ", "x€y")
    assert hits >= 60


# ------------------------------------------------------------------------------ the engine
@pytest.fixture(scope="module")
def engine(btok):
    eng = make_engine(tiny_model(seed=0), btok, warmup=False)
    yield eng
    eng.close()


def test_engine_stop_strings_match_reference(engine, btok):
    """Many concurrent requests with different stop strings (so one decode call holds slots with
    different masks) == the reference on each prompt's unstopped greedy output."""
    rng = np.random.default_rng(11)
    prompts = [random_prompt(rng, 6) for _ in range(12)]
    base = dict(max_new_tokens=40, ignore_eos=True, temperature=0.0)
    fulls = [f.result()[0] for f in [engine.submit(p, SamplingParams(**base)) for p in prompts]]
    cases = []
    for prompt, full in zip(prompts, fulls):
        ids = full.output_ids
        text = btok.decode(ids, skip_special_tokens=True)
        clean = [c for c in text[3:] if c != "\ufffd"]
        wide = [c for c in clean if ord(c) > 127]
        subs = [text[i:i + 3] for i in range(5, len(text) - 3) if "\ufffd" not in text[i:i + 3]]
        choices = [[c] for c in wide[:1]] + [[clean[len(clean) // 2]], [subs[len(subs) // 2]],
                                              [subs[-1], clean[-1]], ["no such text"]]
        for k, stops in enumerate(choices):
            sp = dict(base, stop=stops, no_stop_trim=k == 1,
                      skip_special_tokens=k != 2)
            cases.append((prompt, ids, sp))
    assert sum(any(ord(c) > 127 for c in sp["stop"][0]) for _, _, sp in cases) >= 2
    futures = [engine.submit(p, SamplingParams(**sp)) for p, _, sp in cases]
    stopped = 0
    for (prompt, ids, sp), future in zip(cases, futures):
        (res,) = future.result()
        expected = reference(btok, ids, sp["stop"], sp["skip_special_tokens"])
        if expected is None:
            assert res.finish_reason == "length" and res.output_ids == ids
            continue
        j, text, index, matched = expected
        stopped += 1
        assert res.finish_reason == "stop" and res.matched_stop == matched, sp
        assert res.output_ids == ids[:j + 1]
        assert res.text == (text if sp["no_stop_trim"] else text[:index])
    assert stopped >= 30


def test_engine_smollm2_newline(smol):
    """The real model with the BabyAI stop ``["\\n"]``: the output ends at the first line."""
    from agentrl_jax.models.tokenizer import encode_chat
    from rollout_helpers import smollm2_engine

    engine = smollm2_engine()
    ids = encode_chat(engine.tokenizer, [{"role": "user", "content":
                                          "Name three colours, one per line."}])
    base = dict(max_new_tokens=24, temperature=0.0)
    (full,) = engine.generate_sync(ids, SamplingParams(**base))
    expected = reference(engine.tokenizer, full.output_ids, ["\n"])
    assert expected is not None, full.text
    (res,) = engine.generate_sync(ids, SamplingParams(**base, stop=["\n"]))
    j, text, index, _ = expected
    assert res.finish_reason == "stop" and res.matched_stop == "\n"
    assert res.output_ids == full.output_ids[:j + 1] and res.text == text[:index]


def test_engine_results_do_not_depend_on_decode_steps(btok):
    """The same request stream on engines with ``decode_steps`` 1 and 8 (the tiny model,
    greedy): identical results. Each prompt's stop string is the piece of an early greedy
    token and its stop id a later token of the same 8-step call, so the string ends the
    request first; other cases put the stop id first, on the same token, or alone."""
    model = tiny_model(seed=0)
    rng = np.random.default_rng(5)
    prompts = [random_prompt(rng, int(rng.integers(3, 12))) for _ in range(10)]
    base = dict(max_new_tokens=16, ignore_eos=True, temperature=0.0)
    engines = {k: make_engine(model, btok, warmup=False, decode_steps=k) for k in (1, 8)}
    try:
        fulls = [f.result()[0].output_ids
                 for f in [engines[1].submit(p, SamplingParams(**base)) for p in prompts]]
        cases, string_first = [], []
        for prompt, ids in zip(prompts, fulls):
            for i in range(1, 6):  # a token whose piece first appears at output position i
                piece = btok.decode([ids[i]], skip_special_tokens=True)
                if not piece.strip() or "\ufffd" in piece or \
                        (reference(btok, ids, [piece]) or (None,))[0] != i:
                    continue
                later = [k for k in range(i + 1, 8) if ids[k] not in ids[:k]]
                earlier = [k for k in range(i) if ids[k] not in ids[:k]]
                if later:
                    string_first.append(len(cases))
                    cases.append((prompt, dict(base, stop=[piece], stop_token_ids=[ids[later[-1]]]),
                                  ids[:i + 1], piece))
                    cases.append((prompt, dict(base, stop=[piece], no_stop_trim=True,
                                               stop_token_ids=[ids[later[0]]]), ids[:i + 1], piece))
                if earlier:
                    first = earlier[0]
                    cases.append((prompt, dict(base, stop=[piece], stop_token_ids=[ids[first]]),
                                  ids[:first + 1], ids[first]))
                if ids[i] not in ids[:i]:  # the same token: the stop id comes first
                    cases.append((prompt, dict(base, stop=[piece], stop_token_ids=[ids[i]]),
                                  ids[:i + 1], ids[i]))
                break
        assert len(string_first) >= 5 and len(cases) >= 15
        results = {k: [f.result()[0] for f in [eng.submit(p, SamplingParams(**sp))
                                               for p, sp, _, _ in cases]]
                   for k, eng in engines.items()}
    finally:
        for eng in engines.values():
            eng.close()
    fields = ("output_ids", "output_logprobs", "output_logprobs_raw", "text", "finish_reason",
              "matched_stop")
    for (prompt, sp, want_ids, want_match), one, eight in zip(cases, results[1], results[8]):
        assert [getattr(eight, f) for f in fields] == [getattr(one, f) for f in fields], sp
        assert (one.output_ids, one.finish_reason, one.matched_stop) == (want_ids, "stop",
                                                                         want_match), sp
