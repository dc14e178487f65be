"""``EngineConfig.deliver_after_launch``: a finished request's result is handed over only once
the next device call is launched (or the engine goes idle), and is the same result."""

from __future__ import annotations

import numpy as np
import pytest

from agentrl_jax.rollout.contract import SamplingParams
from tests.rollout_helpers import make_engine, random_prompt, reference_greedy, tiny_model

GREEDY = dict(temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=0)


def _run(model, deliver_after_launch: bool, prompts, lengths):
    """Submit every prompt (greedy, ``lengths`` new tokens each) in one admission pass; return
    the results and, per request, how many decode launches began before its future was done."""
    eng = make_engine(model, deliver_after_launch=deliver_after_launch)
    futures: list = []
    launches_before_done = [0] * len(prompts)
    decode = eng.functions.decode

    def counting_decode(*args, **kwargs):
        for i, f in enumerate(futures):
            launches_before_done[i] += not f.done()
        return decode(*args, **kwargs)

    eng.functions.decode = counting_decode
    try:
        eng.pause("in_place")
        try:
            futures.extend(eng.submit(p, SamplingParams(max_new_tokens=n, **GREEDY),
                                      session_id=f"s{i}")
                           for i, (p, n) in enumerate(zip(prompts, lengths)))
        finally:
            eng.resume()
        results = [f.result(timeout=120)[0] for f in futures]
    finally:
        eng.close()
    return results, launches_before_done


def test_results_unchanged_and_handed_over_after_the_next_launch(model):
    rng = np.random.default_rng(3)
    prompts = [random_prompt(rng, n) for n in (5, 9, 14)]
    lengths = [2, 9, 17]  # decode_steps=4: they finish in calls 1, 3 and 5
    now, later = _run(model, False, prompts, lengths), _run(model, True, prompts, lengths)
    for (res_now, res_later), prompt, n in zip(zip(now[0], later[0]), prompts, lengths):
        assert res_later.output_ids == res_now.output_ids == reference_greedy(model, prompt, n)
        np.testing.assert_allclose(res_later.output_logprobs, res_now.output_logprobs,
                                   rtol=0, atol=1e-6)
        assert res_later.finish_reason == res_now.finish_reason == "length"
    # the two shorter requests finish while the longest still decodes: handed over at once,
    # their futures are done before the next launch; deferred, one launch later. The longest
    # finishes last and is handed over when the engine goes idle (no launch left to wait for).
    assert later[1][:2] == [k + 1 for k in now[1][:2]]
    assert later[1][2] == now[1][2]


def test_an_abort_reaches_its_future_while_the_engine_is_paused(model):
    import time

    eng = make_engine(model, deliver_after_launch=True)
    decode = eng.functions.decode

    def slow_decode(*args, **kwargs):
        # each decode call of the tiny model takes ~1 ms: the long request's ~29 remaining calls
        # would race the pause below; 20 ms a call leaves it >0.5 s of work to be paused in
        time.sleep(0.02)
        return decode(*args, **kwargs)

    eng.functions.decode = slow_decode
    try:
        rng = np.random.default_rng(4)
        prompt = random_prompt(rng, 6)
        long = eng.submit(prompt, SamplingParams(max_new_tokens=120, **GREEDY), rid="long")
        short = eng.submit(prompt, SamplingParams(max_new_tokens=3, **GREEDY), rid="short")
        assert short.result(timeout=120)[0].output_ids == reference_greedy(model, prompt, 3)
        eng.pause("in_place")  # (the long request has ~29 decode calls to go)
        assert eng.abort("long")
        (res,) = long.result(timeout=120)  # handed over while paused: the engine is idle
        assert res.finish_reason == "abort" and len(res.output_ids) < 120
        eng.resume()
        # the engine then goes idle with nothing left queued for hand-over
        assert eng.scheduler.deliveries == []
    finally:
        eng.close()
