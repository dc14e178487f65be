"""``EngineConfig.decode_loop``: the decode call's fixed-trip loop (``"fixed"``: every call runs
``decode_steps`` iterations, those after the while loop's exit idle) gives what the
``lax.while_loop`` (``"while"``) gives: the same tokens, log-probs, finish reasons, decode
steps and calls and KV cache, and the same greedy tokens as a plain argmax loop over the model."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from agentrl_jax.rollout.contract import SamplingParams
from agentrl_jax.rollout.engine.compiled import compiled_functions
from tests.rollout_helpers import make_engine, random_prompt, reference_greedy, tiny_model


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=0)


def _workload(model, rng: np.random.Generator) -> list[tuple[list[int], SamplingParams]]:
    """Twelve requests for eight slots (so some wait for a slot and the decode call exits when
    a slot finishes), lengths that end inside a call of 4 steps, greedy ones, and sampled ones
    (temperature 0.5) whose stop ids are tokens of the prompt's greedy continuation, so that
    some stop inside a call."""
    work = []
    for i in range(12):
        prompt = random_prompt(rng, int(rng.integers(3, 20)))
        n = int(rng.integers(1, 14))
        if i % 3 == 0:
            params = SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True)
        else:
            likely = reference_greedy(model, prompt, 8)[2:8]
            params = SamplingParams(max_new_tokens=n, temperature=0.5, seed=100 + i,
                                    stop_token_ids=[int(t) for t in likely])
        work.append((prompt, params))
    return work


def _run(model, decode_loop: str, work):
    eng = make_engine(model, decode_loop=decode_loop, warmup=False)
    try:
        eng.pause("in_place")
        try:
            futures = [eng.submit(p, s, session_id=f"s{i}") for i, (p, s) in enumerate(work)]
        finally:
            eng.resume()
        results = [f.result(timeout=120)[0] for f in futures]
        cache = [np.asarray(x) for x in (*eng.kv.cache.keys, *eng.kv.cache.values)]
        return results, (eng.stats.decode_calls, eng.stats.decode_steps), cache
    finally:
        eng.close()


def test_fixed_loop_gives_what_the_while_loop_gives(model):
    work = _workload(model, np.random.default_rng(7))
    (loose, loose_counts, loose_cache), (fixed, fixed_counts, fixed_cache) = (
        _run(model, "while", work), _run(model, "fixed", work))
    assert fixed_counts == loose_counts
    # the idle steps after the loop's exit write nothing: every slot's KV row is the same
    # (sessions are kept, so the rows of finished requests are compared too)
    for a, b in zip(loose_cache, fixed_cache):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-6)
    reasons = set()
    for (prompt, params), a, b in zip(work, loose, fixed):
        assert b.output_ids == a.output_ids
        np.testing.assert_allclose(b.output_logprobs, a.output_logprobs, rtol=0, atol=1e-5)
        assert b.finish_reason == a.finish_reason
        reasons.add(a.finish_reason)
        if params.temperature == 0.0:
            assert b.output_ids == reference_greedy(model, prompt, params.max_new_tokens)
    assert reasons == {"stop", "length"}  # both ways of finishing inside a call were exercised


def test_an_unknown_decode_loop_is_refused():
    with pytest.raises(ValueError, match="decode_loop"):
        compiled_functions(None, None, 8, 64, 4, 2, "bksd", decode_loop="until")


@pytest.mark.parametrize("decode_loop", ["while", "fixed"])
def test_only_the_fixed_loop_has_a_trip_count_xla_knows(model, decode_loop):
    """What ``fixed`` is for: XLA annotates its decode loop with the known trip count
    ``decode_steps`` (so XLA:GPU need not read the loop's condition on the host each step);
    the ``while`` loop's count depends on the data."""
    eng = make_engine(model, decode_loop=decode_loop, warmup=False)
    try:
        c = eng.config
        decode = compiled_functions(eng.graphdef, jax.tree.structure(eng.weights.state),
                                    c.max_batch, c.max_length, c.decode_steps,
                                    c.max_stop_ids, c.kv_layout, eng.decode_attention,
                                    eng.decode_gemm, prefill_attention=eng.prefill_attention,
                                    decode_loop=decode_loop)[0]
        buffers = eng.scheduler.buffers
        hlo = decode.lower((eng.weights.leaves, eng.weights.merged), eng.kv.cache, buffers.ints,
                           buffers.floats, np.int32(c.decode_steps), np.bool_(False), 1
                           ).compile().as_text()
    finally:
        eng.close()
    counts = [line.split('"known_trip_count":{"n":"')[1].split('"')[0]
              for line in hlo.splitlines() if "known_trip_count" in line]
    if decode_loop == "fixed":
        assert str(c.decode_steps) in counts, counts
    else:
        assert str(c.decode_steps) not in counts, counts
