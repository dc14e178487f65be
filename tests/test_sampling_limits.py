"""Sampling-parameter ranges (sampling_limits.py) and per-request fault isolation in the engine.

* Every out-of-range sampling parameter is a 400 naming the field and its allowed range, through
  ``/generate`` and the OpenAI routes; the same ranges hold for ``SamplingParams.validate`` (a
  request refused by the engine never enters its batch) and for the run config.
* An error in one request's own processing (admission, its prefill row, activation, stop
  detection, detokenisation, or a parameter that slipped past validation) fails that request
  alone: four innocent requests decoding in the same batch finish with the tokens they get when
  run alone. A failed device call still fails every request in flight ("engine step failed").

One tiny random engine (rollout_helpers) serves the whole module.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import aiohttp
import pytest

from agentrl_jax.rollout import sampling_limits as limits
from agentrl_jax.rollout.contract import (InvalidRequestError, RequestFailedError, RolloutError,
                                      SamplingParams)
from agentrl_jax.rollout.engine.prompt_ids import check_input_ids
from rollout_helpers import (ENGINE_KW, TINY, byte_tokenizer, make_engine, random_prompt,
                             start_server, tiny_model)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_LENGTH, MAX_BATCH = ENGINE_KW["max_length"], ENGINE_KW["max_batch"]  # 128, 8
VOCAB = TINY.vocab_size  # 512
BIG = 2**64 - 1
TOP_K = "must be -1 (off) or an integer in [1, 2147483647]"
MAX_NEW = f"must be an integer in [0, {MAX_LENGTH}]"
TEMPERATURE = "must be 0 (greedy) or a number in [1e-06, 1000]"
N = f"must be an integer in [1, {MAX_BATCH}]"
SEED = "must be an integer in [0, 9223372036854775807]"
STOP_IDS = f"must be integers in [0, {VOCAB - 1}]"

# (body's sampling fields, field path in the message, range text in the message)
SAMPLING = [
    ({"top_k": 2**31}, "top_k", f"{TOP_K} (got 2147483648)"),
    ({"top_k": 0}, "top_k", f"{TOP_K} (got 0)"),
    ({"top_k": -2}, "top_k", TOP_K),
    ({"max_new_tokens": BIG}, "max_new_tokens", f"{MAX_NEW} (got {BIG})"),
    ({"max_new_tokens": MAX_LENGTH + 1}, "max_new_tokens", MAX_NEW),
    ({"max_new_tokens": -1}, "max_new_tokens", MAX_NEW),
    ({"temperature": 1e-9}, "temperature", TEMPERATURE),
    ({"temperature": 1e6}, "temperature", TEMPERATURE),
    ({"temperature": -1}, "temperature", TEMPERATURE),
    ({"top_p": 0}, "top_p", "must be a number in (0, 1]"),
    ({"top_p": 1.5}, "top_p", "must be a number in (0, 1]"),
    ({"min_p": -0.5}, "min_p", "must be a number in [0, 1]"),
    ({"n": MAX_BATCH + 1}, "n", N),
    ({"n": BIG}, "n", N),
    ({"seed": 2**63}, "seed", SEED),
    ({"sampling_seed": -1}, "sampling_seed", SEED),
    ({"stop_token_ids": [1, VOCAB]}, "stop_token_ids", f"{STOP_IDS} (got {VOCAB})"),
    ({"stop_token_ids": [2**40]}, "stop_token_ids", STOP_IDS),
    ({"stop_token_ids": list(range(3, 12))}, "stop_token_ids", "at most 8 distinct ids (got 9)"),
    ({"stop": ["a"] * 33}, "stop", "must hold at most 32 strings"),
    ({"stop": "x" * 1025}, "stop", "1 to 1024 characters"),
]
GENERATE = [("/generate", {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 1, **b}},
             f"sampling_params.{f}", r) for b, f, r in SAMPLING]
GENERATE += [("/generate", {"input_ids": [1, 2, 3], "logprob_start_len": -2},
              "logprob_start_len", "must be an integer in [-1, 2147483647]")]
COMPLETIONS = [
    ({"max_tokens": BIG}, "max_tokens", MAX_NEW), ({"top_k": 2**31}, "top_k", TOP_K),
    ({"n": MAX_BATCH + 1}, "n", N), ({"temperature": 1e6}, "temperature", TEMPERATURE),
    ({"seed": 2**63}, "seed", SEED), ({"stop_token_ids": [VOCAB]}, "stop_token_ids", STOP_IDS),
    ({"top_p": 2}, "top_p", "(0, 1]"), ({"min_p": 2}, "min_p", "[0, 1]"),
]
CHAT = COMPLETIONS + [({"max_completion_tokens": MAX_LENGTH + 1}, "max_completion_tokens",
                       MAX_NEW)]
CASES = (GENERATE
         + [("/v1/completions", {"prompt": [5, 6], "max_tokens": 1, **b}, f, r)
            for b, f, r in COMPLETIONS]
         + [("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                      "max_tokens": 1, **b}, f, r) for b, f, r in CHAT])


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=0)


@pytest.fixture(scope="module")
def served(model):
    engine = make_engine(model, byte_tokenizer(VOCAB), warmup=False)
    thread = start_server(engine, model_path="tiny-random")
    yield thread.url, engine
    thread.stop()
    engine.close()


async def _post(url: str, body: dict) -> tuple[int, dict]:
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        async with http.post(url, json=body) as response:
            return response.status, await response.json()


# ----------------------------------------------------------------------------- the API
@pytest.mark.parametrize("route,body,field,expected", CASES,
                         ids=[f"{r}:{f}:{str(b)[-40:]}" for r, b, f, _ in CASES])
async def test_out_of_range_is_a_400_naming_field_and_range(served, route, body, field,
                                                           expected):
    url, engine = served
    requests = engine.stats.requests
    status, out = await _post(url + route, body)
    assert status == 400, out
    message = out["error"]["message"]
    assert message.startswith(f"{route}: {field}: ") and expected in message, message
    assert engine.stats.requests == requests  # refused before the engine


async def test_the_issue_body_is_refused_and_concurrent_requests_finish(served):
    """The reported request (top_k 2^31 on /generate, /v1/completions and chat) among four
    ordinary ones: it gets a 400, the others 200."""
    url, _ = served
    bad = [("/generate", {"input_ids": [1, 2, 3],
                          "sampling_params": {"max_new_tokens": 1, "top_k": 2**31}}),
           ("/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 1, "top_k": 2**31}),
           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                     "max_tokens": 1, "top_k": 2**31})]
    good = [("/generate", {"input_ids": [5 + i, 6, 7], "sampling_params": {
        "max_new_tokens": 6, "temperature": 0, "ignore_eos": True}}) for i in range(4)]
    answers = await asyncio.gather(*(_post(url + r, b) for r, b in bad + good))
    assert [s for s, _ in answers] == [400] * 3 + [200] * 4, answers
    assert all(len(out["output_ids"]) == 6 for _, out in answers[3:])


async def test_top_k_of_the_vocabulary_or_more_is_off(served):
    """Clamp semantics: top_k >= vocab size (up to int32 max) keeps every token, so a seeded
    sample equals the one with top_k -1; a real top_k (1: greedy) changes it."""
    url, _ = served
    outs = {}
    for top_k in (-1, VOCAB, 2**31 - 1, 1):
        status, out = await _post(url + "/generate", {"input_ids": [9, 8, 7], "sampling_params": {
            "max_new_tokens": 12, "temperature": 1.0, "seed": 3, "top_k": top_k,
            "ignore_eos": True}})
        assert status == 200, out
        outs[top_k] = out["output_ids"]
    assert outs[VOCAB] == outs[-1] and outs[2**31 - 1] == outs[-1]
    status, greedy = await _post(url + "/generate", {"input_ids": [9, 8, 7], "sampling_params": {
        "max_new_tokens": 12, "temperature": 0, "ignore_eos": True}})
    assert outs[1] == greedy["output_ids"] and outs[1] != outs[-1]


@pytest.mark.parametrize("kwargs,fragment", [
    (dict(top_k=2**31), f"top_k {TOP_K}"), (dict(max_new_tokens=BIG), f"max_new_tokens {MAX_NEW}"),
    (dict(n=MAX_BATCH + 1), f"n {N}"), (dict(stop_token_ids=[2**40]), "stop_token_ids"),
    (dict(temperature=float("inf")), f"temperature {TEMPERATURE}")])
def test_the_engine_refuses_out_of_range_before_its_batch(served, kwargs, fragment):
    """Direct engine callers (the trainer) get the same ranges, at submit time."""
    _, engine = served
    with pytest.raises(InvalidRequestError, match="sampling_params: ") as e:
        engine.submit([1, 2, 3], SamplingParams(**kwargs))
    assert fragment in str(e.value)


def test_limits_describe_their_ranges():
    assert limits.TOP_K.problem(2**31 - 1) is None and limits.TOP_K.problem(-1) is None
    assert limits.TOP_K.problem(True) is not None  # booleans are not integers
    assert limits.TEMPERATURE.problem(0) is None and limits.TEMPERATURE.problem(1e-6) is None
    assert limits.TOP_P.problem(1) is None and limits.TOP_P.problem(0.0) is not None
    assert limits.MAX_NEW_TOKENS.problem(128, {"max_length": 128}) is None
    assert limits.MAX_NEW_TOKENS.problem(129, {"max_length": 128}) == (
        "must be an integer in [0, 128] (got 129)")
    assert limits.MAX_NEW_TOKENS.describe() == "an integer in [0, 2147483647]"
    assert limits.stop_token_ids_problem([5, 5, 5], {"max_stop_ids": 1}) is None  # distinct


def test_run_config_top_k_is_refused_in_one_line(tmp_path):
    workdir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run(
        [sys.executable, "launch/run.py", "--config", "experiments/smoke.py", "--workdir",
         str(workdir), "--config.rollout.top_k=2147483648"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "invalid config (1 problem):",
        f"  rollout.top_k: {TOP_K} (got 2147483648)"]
    assert not workdir.exists()


# ------------------------------------------------------------------------- isolation
def _innocents() -> list[dict]:
    """Four requests: two greedy, two seeded samples (batch-independent by construction)."""
    import numpy as np

    rng = np.random.default_rng(7)
    out = []
    for i in range(4):
        sp = {"max_new_tokens": 16 + i, "ignore_eos": True}
        sp.update({"temperature": 0} if i % 2 == 0 else {"temperature": 1.0, "seed": 11 + i,
                                                         "top_k": 40})
        out.append({"input_ids": random_prompt(rng, 6 + 5 * i), "sampling_params": sp,
                    "rid": f"innocent-{i}"})
    return out


@pytest.fixture(scope="module")
def alone(served) -> list[list[int]]:
    """Each innocent request's tokens when it runs alone."""
    url, _ = served

    async def run():
        return [await _post(url + "/generate", body) for body in _innocents()]

    answers = asyncio.run(run())
    assert all(status == 200 for status, _ in answers), answers
    return [out["output_ids"] for _, out in answers]


def _poison_when(engine, monkeypatch, name: str, rid_of) -> None:
    """Make the scheduler method ``name`` raise for the request whose rid is "poison"."""
    original = getattr(engine.scheduler, name)

    def poisoned(*args, **kwargs):
        if rid_of(*args) == "poison":
            raise RuntimeError(f"injected failure in {name}")
        return original(*args, **kwargs)

    monkeypatch.setattr(engine.scheduler, name, poisoned)


STAGES = {  # the per-request host step -> how to find the request's rid from its arguments
    "admit_one": lambda req: req.rid,
    "prefill_row": lambda seq, *_: seq.req.rid,
    "activate": lambda seq: seq.req.rid,
    "after_decode": lambda seq, *_: seq.req.rid,  # (seq, the stop-string candidates)
    "result": lambda seq, *_: seq.req.rid,  # detokenisation of the finished output
}


async def _together(url: str, engine, bodies: list[dict]) -> list[tuple[int, dict]]:
    """Send ``bodies`` to /generate while the engine is paused, then resume it: every request
    is admitted in the same step and decodes in the same batch."""
    engine.pause("in_place")
    try:
        tasks = [asyncio.ensure_future(_post(url + "/generate", b)) for b in bodies]
        deadline = time.monotonic() + 30
        while engine.load()["waiting"] < len(bodies) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert engine.load()["waiting"] == len(bodies)
    finally:
        engine.resume()
    return await asyncio.gather(*tasks)


@pytest.mark.parametrize("stage", sorted(STAGES))
async def test_a_failing_request_fails_alone(served, alone, monkeypatch, stage):
    url, engine = served
    _poison_when(engine, monkeypatch, stage, STAGES[stage])
    poison = {"input_ids": [20, 21, 22, 23, 24], "rid": "poison",
              "sampling_params": {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True}}
    bodies = _innocents()
    answers = await _together(url, engine, bodies[:2] + [poison] + bodies[2:])
    status, out = answers.pop(2)
    assert status == 500, out
    message = out["error"]["message"]
    assert "request 'poison' failed in the engine" in message, message
    assert f"injected failure in {stage}" in message and "engine step failed" not in message
    assert out["error"]["type"] == "request_failed"  # answered as such, not as an unhandled error
    assert [s for s, _ in answers] == [200] * 4, answers
    assert [o["output_ids"] for _, o in answers] == alone
    load = engine.load()
    assert load["running"] == 0 and load["waiting"] == 0
    assert load["free_slots"] + load["cached_slots"] == MAX_BATCH  # the poisoned slot is back
    assert await engine.health()


def test_a_parameter_that_slipped_past_validation_fails_alone(served, alone, monkeypatch):
    """A stop id beyond int32 (the int32 per-slot array cannot hold it) reaches the engine
    because validation is bypassed: only that request fails (with the OverflowError), the
    four others finish as alone."""
    _, engine = served
    monkeypatch.setattr(engine, "validate", lambda ids, sp: check_input_ids(
        ids, engine.vocab_size, engine.config.max_length))
    engine.pause("in_place")
    try:
        futures = [engine.submit(b["input_ids"], SamplingParams(**b["sampling_params"]))
                   for b in _innocents()[:2]]
        bad = engine.submit([20, 21, 22], SamplingParams(max_new_tokens=3,
                                                         stop_token_ids=[2**40]))
        futures += [engine.submit(b["input_ids"], SamplingParams(**b["sampling_params"]))
                    for b in _innocents()[2:]]
    finally:
        engine.resume()
    with pytest.raises(RequestFailedError, match="OverflowError"):
        bad.result(timeout=60)
    assert [f.result(timeout=60)[0].output_ids for f in futures] == alone


def test_a_failed_device_call_still_fails_every_request(served, alone, monkeypatch):
    """Not a request's fault: a decode call that raises fails the whole batch, named as an
    engine step failure (not as one request's); the engine serves again afterwards."""
    _, engine = served

    def broken(*args, **kwargs):
        raise RuntimeError("injected device failure")

    monkeypatch.setattr(engine.functions, "decode", broken)
    engine.pause("in_place")
    try:
        futures = [engine.submit(b["input_ids"], SamplingParams(**b["sampling_params"]))
                   for b in _innocents()]
    finally:
        engine.resume()
    for future in futures:
        with pytest.raises(RolloutError, match="engine step failed: RuntimeError: injected "
                                               "device failure") as e:
            future.result(timeout=60)
        assert not isinstance(e.value, RequestFailedError)
    monkeypatch.undo()
    body = _innocents()[0]
    (result,) = engine.generate_sync(body["input_ids"], SamplingParams(**body["sampling_params"]),
                                     timeout=60)
    assert result.output_ids == alone[0]
