"""The embedded continuous-batching engine against a plain no-cache reference.

Tiny random models (2 layers, d=64) with peaked output distributions; one engine per module
(compiled once). Logprob tolerance: 1e-4 absolute in float32 (cached decode vs full forward).
"""

from __future__ import annotations

import asyncio
import functools
import time

import numpy as np
import pytest
from flax import nnx

from agentrl_jax.rollout.contract import (GenerateResult, InvalidRequestError, OverloadedError,
                                      SamplingParams, create_backend)
from rollout_helpers import (REF_LEN, TINY, byte_tokenizer, full_logprobs, make_engine,
                             random_prompt, reference_greedy, tiny_model)

ATOL = 1e-4
GREEDY = dict(temperature=0.0)


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=0)


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer(TINY.vocab_size)


@pytest.fixture(scope="module")
def engine(model, tokenizer):
    eng = make_engine(model, tokenizer)
    yield eng
    eng.close()


def check_logprobs(model, prompt: list[int], result: GenerateResult, temperature: float = 0.0):
    """Returned logprobs == log_softmax of a teacher-forced full forward over the output."""
    seq = prompt + result.output_ids
    ref = full_logprobs(model, seq[:REF_LEN])
    rows = ref[len(prompt) - 1:len(seq) - 1]
    tokens = np.asarray(result.output_ids)
    raw = rows[np.arange(len(tokens)), tokens]
    np.testing.assert_allclose(result.output_logprobs_raw, raw, atol=ATOL)
    if temperature > 0:
        # log_softmax(logits / T): logits = ref + const per row, so rescale the log-probs.
        scaled = rows / temperature
        scaled = scaled - np.logaddexp.reduce(scaled, axis=-1, keepdims=True)
        np.testing.assert_allclose(result.output_logprobs, scaled[np.arange(len(tokens)), tokens],
                                   atol=ATOL)
    else:
        np.testing.assert_allclose(result.output_logprobs, raw, atol=ATOL)


def check_greedy(eng, model, seed: int, prompt_len: int, new_tokens: int) -> None:
    """One greedy request on ``eng``: its tokens == the no-cache reference's, its logprobs ==
    the teacher-forced full forward's (:func:`check_logprobs`)."""
    prompt = random_prompt(np.random.default_rng(seed), prompt_len)
    (res,) = eng.generate_sync(prompt, SamplingParams(max_new_tokens=new_tokens,
                                                      ignore_eos=True, **GREEDY))
    assert res.output_ids == reference_greedy(model, prompt, new_tokens)
    check_logprobs(model, prompt, res)


def test_greedy_matches_reference_alone(engine, model):
    rng = np.random.default_rng(1)
    for length, max_new in [(1, 12), (7, 20), (40, 30), (70, 16)]:  # chunk buckets 16 / 64
        prompt = random_prompt(rng, length)
        (res,) = engine.generate_sync(prompt, SamplingParams(max_new_tokens=max_new, **GREEDY))
        assert res.output_ids == reference_greedy(model, prompt, max_new, (TINY.eos_token_id,))
        assert res.finish_reason in ("length", "stop")
        assert res.prompt_tokens == length and res.cached_tokens == 0
        check_logprobs(model, prompt, res)


def test_stops_at_eos_and_stop_token_ids(engine, model):
    prompt = random_prompt(np.random.default_rng(2), 9)
    ref = reference_greedy(model, prompt, 20)
    stop = ref[5]
    first = ref.index(stop)
    (res,) = engine.generate_sync(prompt, SamplingParams(max_new_tokens=20, stop_token_ids=[stop],
                                                         **GREEDY))
    assert res.output_ids == ref[:first + 1]  # the stop token is kept in output_ids
    assert res.finish_reason == "stop" and res.matched_stop == stop
    # max_length bounds the generation: prompt + output never exceeds the context.
    long_prompt = random_prompt(np.random.default_rng(3), REF_LEN - 4)
    (res,) = engine.generate_sync(long_prompt, SamplingParams(max_new_tokens=50, ignore_eos=True,
                                                              **GREEDY))
    assert len(res.output_ids) == 4 and res.finish_reason == "length"


def test_stop_strings_trim_text(engine, model, tokenizer):
    prompt = random_prompt(np.random.default_rng(4), 6)
    (full,) = engine.generate_sync(prompt, SamplingParams(max_new_tokens=30, ignore_eos=True,
                                                          **GREEDY))
    text = tokenizer.decode(full.output_ids, skip_special_tokens=True)
    candidates = [text[i:i + 2] for i in range(4, len(text) - 2)
                  if "\ufffd" not in text[i:i + 2] and text[i:i + 2].strip()]
    if not candidates:
        pytest.skip("random output has no clean two-character substring")
    stop = candidates[0]
    (res,) = engine.generate_sync(prompt, SamplingParams(max_new_tokens=30, ignore_eos=True,
                                                         stop=[stop], **GREEDY))
    assert res.finish_reason == "stop" and res.matched_stop == stop
    assert full.output_ids[:len(res.output_ids)] == res.output_ids
    assert stop in tokenizer.decode(res.output_ids, skip_special_tokens=True)
    assert stop not in tokenizer.decode(res.output_ids[:-1], skip_special_tokens=True)
    assert res.text == text[:text.index(stop)]


def test_prefix_reuse_multiturn(engine, model):
    rng = np.random.default_rng(5)
    sampling = SamplingParams(max_new_tokens=10, ignore_eos=True, **GREEDY)
    history = random_prompt(rng, 20)
    (r1,) = engine.generate_sync(history, sampling, session_id="episode-1")
    assert r1.cached_tokens == 0
    for turn in range(3):
        # next turn = previous prompt + model output + a new observation
        history = history + r1.output_ids + random_prompt(rng, 7)
        (r2,) = engine.generate_sync(history, sampling, session_id="episode-1")
        assert r2.cached_tokens == len(history) - 7 - 1  # all but the obs and the unfed last token
        assert r2.output_ids == reference_greedy(model, history, 10)
        check_logprobs(model, history, r2)
        r1 = r2
    # An edited history reuses only the common prefix.
    edited = history[:10] + [3] + history[11:]
    (r3,) = engine.generate_sync(edited, sampling, session_id="episode-1")
    assert r3.cached_tokens == 10
    assert r3.output_ids == reference_greedy(model, edited, 10)
    # Without a session (or another session) nothing is reused.
    (r4,) = engine.generate_sync(edited, sampling, session_id="other")
    assert r4.cached_tokens == 0 and r4.output_ids == r3.output_ids
    assert engine.flush_cache_sync() >= 1
    (r5,) = engine.generate_sync(edited, sampling, session_id="episode-1")
    assert r5.cached_tokens == 0
    # An ended session's cached row is freed: nothing left to reuse.
    (r6,) = engine.generate_sync(edited, sampling, session_id="episode-1")
    assert r6.cached_tokens == len(edited) - 1
    engine.end_session("episode-1")
    (r7,) = engine.generate_sync(edited, sampling, session_id="episode-1")
    assert r7.cached_tokens == 0


def test_join_and_leave_mid_generation(engine, model):
    """Requests join while a long one decodes and leave before it finishes."""
    rng = np.random.default_rng(6)
    long_prompt = random_prompt(rng, 5)
    long = engine.submit(long_prompt, SamplingParams(max_new_tokens=100, ignore_eos=True,
                                                     **GREEDY))
    start = engine.stats.generated_tokens
    deadline = time.time() + 30
    while engine.stats.generated_tokens < start + 8 and time.time() < deadline:
        time.sleep(0.001)
    others = []
    for i in range(6):
        prompt = random_prompt(rng, int(rng.integers(2, 60)))
        max_new = int(rng.integers(1, 12))
        others.append((prompt, max_new, engine.submit(
            prompt, SamplingParams(max_new_tokens=max_new, ignore_eos=True, **GREEDY))))
        time.sleep(0.003 * i)
    for prompt, max_new, fut in others:
        (res,) = fut.result(60)
        assert res.output_ids == reference_greedy(model, prompt, max_new)
    (res,) = long.result(60)
    assert len(res.output_ids) == 100
    assert res.output_ids == reference_greedy(model, long_prompt, 100)
    check_logprobs(model, long_prompt, res)


async def test_64_concurrent_requests(engine, model):
    rng = np.random.default_rng(7)
    jobs = []
    for i in range(64):
        prompt = random_prompt(rng, int(rng.integers(1, 80)))
        max_new = int(rng.integers(1, 24))
        jobs.append((prompt, max_new))
    results = await asyncio.gather(*[
        engine.generate(p, SamplingParams(max_new_tokens=m, ignore_eos=True, **GREEDY))
        for p, m in jobs])
    for (prompt, max_new), res in zip(jobs, results):
        assert res.finish_reason == "length" and len(res.output_ids) == max_new
        assert res.output_ids == reference_greedy(model, prompt, max_new), prompt
    # Logprobs of a few of them against the teacher-forced forward.
    for (prompt, _), res in list(zip(jobs, results))[:8]:
        check_logprobs(model, prompt, res)


def test_sampling_seeded_and_batch_independent(engine, model):
    rng = np.random.default_rng(8)
    prompt = random_prompt(rng, 12)
    sp = SamplingParams(max_new_tokens=16, temperature=0.7, seed=1234, ignore_eos=True)
    (alone,) = engine.generate_sync(prompt, sp)
    # Same seed with other requests in the batch -> same tokens.
    noise = [engine.submit(random_prompt(rng, 30), SamplingParams(max_new_tokens=20,
                                                                  temperature=1.0))
             for _ in range(5)]
    (batched,) = engine.generate_sync(prompt, sp)
    for f in noise:
        f.result(60)
    assert alone.output_ids == batched.output_ids
    check_logprobs(model, prompt, alone, temperature=0.7)
    (other,) = engine.generate_sync(prompt, SamplingParams(max_new_tokens=16, temperature=0.7,
                                                           seed=99, ignore_eos=True))
    assert other.output_ids != alone.output_ids
    # top-k 1 is greedy; top_p / min_p run and return valid tokens.
    (k1,) = engine.generate_sync(prompt, SamplingParams(max_new_tokens=8, temperature=1.0,
                                                        top_k=1, ignore_eos=True))
    assert k1.output_ids == reference_greedy(model, prompt, 8)
    (tp,) = engine.generate_sync(prompt, SamplingParams(max_new_tokens=8, temperature=1.0,
                                                        top_p=0.5, min_p=0.05, seed=3))
    assert all(0 <= t < TINY.vocab_size for t in tp.output_ids)


def test_prefill_counters_say_where_a_call_s_padding_is(engine):
    """ENGINE_KW: chunks (16, 64), 128 positions a call, 8 slots -> [8, 16] or [2, 64] calls."""
    rng = np.random.default_rng(21)
    before = engine.stats.as_dict()
    # one 40-token prompt: 39 positions to prefill, the [2, 64] bucket does most work per call
    engine.generate_sync(random_prompt(rng, 40), SamplingParams(max_new_tokens=1))
    after = engine.stats.as_dict()
    delta = {k: after[k] - before[k] for k in ("prefill_calls", "prefill_positions",
                                               "prefill_rows", "prefill_rows_used",
                                               "prefill_used_positions", "prefill_row_tokens",
                                               "prefill_kv_sum")}
    assert delta == {"prefill_calls": 1, "prefill_positions": 128, "prefill_rows": 2,
                     "prefill_rows_used": 1, "prefill_used_positions": 64,
                     "prefill_row_tokens": 39, "prefill_kv_sum": engine.config.prefill_kv(64, 39)}
    # each call's window (dispatch to results) holds the time blocked on the device
    for kind in ("prefill", "decode"):
        window = after[f"{kind}_time_s"] - before[f"{kind}_time_s"]
        waited = after[f"{kind}_wait_time_s"] - before[f"{kind}_wait_time_s"]
        assert 0 < waited <= window, (kind, waited, window)
    fresh = type(engine.stats)(prefill_calls=1, prefill_positions=128, prefill_rows=2,
                               prefill_rows_used=1, prefill_used_positions=64,
                               prefill_row_tokens=39, prefill_kv_sum=64).as_dict()
    assert (fresh["prefill_fill"], fresh["prefill_row_occupancy"],
            fresh["prefill_used_row_fill"], fresh["mean_prefill_kv"]) == (39 / 128, 0.5,
                                                                          39 / 64, 64)


def test_n_samples_share_prefill(engine, model):
    prompt = random_prompt(np.random.default_rng(9), 40)
    sp = SamplingParams(max_new_tokens=12, temperature=1.0, seed=77, n=3, ignore_eos=True)
    prefill_before = engine.stats.prefill_tokens
    results = engine.generate_sync(prompt, sp)
    assert engine.stats.prefill_tokens - prefill_before == 39 + 3  # once, + each last token
    assert len(results) == 3 and len({tuple(r.output_ids) for r in results}) == 3
    assert [r.cached_tokens for r in results] == [0, 39, 39]
    (single,) = engine.generate_sync(prompt, SamplingParams(max_new_tokens=12, temperature=1.0,
                                                            seed=77, ignore_eos=True))
    assert single.output_ids == results[0].output_ids  # sample 0 == the n=1 sample
    for r in results:
        check_logprobs(model, prompt, r, temperature=1.0)


@pytest.fixture(scope="module")
def copy2_engine(model, tokenizer):
    """An engine that copies two shared rows a call, so that a pass has more to copy than one
    call holds."""
    eng = make_engine(model, tokenizer, warmup=False, copy_rows=2)
    yield eng
    eng.close()


def test_more_shared_rows_than_one_copy_call_holds(copy2_engine, model):
    """Two ``n = 3`` requests admitted together leave four rows to copy; with two rows a copy
    call, the second call must copy the rest: every greedy sample equals the no-cache
    reference (a sample whose row was not copied would decode over another row's keys)."""
    eng = copy2_engine
    prompts = [random_prompt(np.random.default_rng(s), 40) for s in (31, 32)]
    sp = SamplingParams(max_new_tokens=6, ignore_eos=True, n=3, **GREEDY)
    calls = eng.stats.copy_calls
    futures = _submit_paused(eng, [(p, sp, f"copy-{i}") for i, p in enumerate(prompts)])
    results = [f.result(120) for f in futures]
    assert eng.stats.copy_calls - calls == 2
    for prompt, samples in zip(prompts, results):
        reference = reference_greedy(model, prompt, 6)
        assert [r.cached_tokens for r in samples] == [0, 39, 39]
        for r in samples:
            assert r.output_ids == reference
            check_logprobs(model, prompt, r)


async def test_a_mixed_load_of_samples_and_shared_prompts_matches_the_reference(copy2_engine,
                                                                                 model):
    """24 requests at once on 8 slots: 1-3 samples each, a third of them repeating an earlier
    prompt (shared prefills across sessions), prompts of 1-90 tokens (chunked prefills), so
    forks, row copies of several calls, queueing and joins mid-decode all happen; every greedy
    sample equals the no-cache reference."""
    rng = np.random.default_rng(41)
    prompts: list[list[int]] = []
    jobs = []
    for i in range(24):
        if prompts and rng.random() < 1 / 3:
            prompt = prompts[int(rng.integers(len(prompts)))]
        else:
            prompt = random_prompt(rng, int(rng.integers(1, 91)))
            prompts.append(prompt)
        jobs.append((prompt, int(rng.integers(1, 16)), int(rng.integers(1, 4))))
    results = await asyncio.gather(*[
        copy2_engine.generate_n(p, SamplingParams(max_new_tokens=m, n=n, ignore_eos=True,
                                                  **GREEDY), session_id=f"mix-{i}")
        for i, (p, m, n) in enumerate(jobs)])
    for (prompt, max_new, n), samples in zip(jobs, results):
        reference = reference_greedy(model, prompt, max_new)
        assert len(samples) == n
        assert all(r.output_ids == reference for r in samples), (len(prompt), max_new, n)


def _submit_paused(eng, requests):
    """Submit ``(prompt, sampling, rid)`` requests while ``eng`` is paused, so that one
    admission pass sees them all; the futures in order."""
    eng.pause("in_place")
    try:
        return [eng.submit(p, sp, session_id=f"s-{rid}", rid=rid) for p, sp, rid in requests]
    finally:
        eng.resume()


def test_equal_prompts_share_one_prefill(engine, model):
    """Requests of other sessions with an equal prompt (a GRPO group's first turn) prefill it
    once; each still samples its own stream: the same tokens as when it runs alone."""
    prompt = random_prompt(np.random.default_rng(21), 40)
    other = random_prompt(np.random.default_rng(22), 30)
    sps = [SamplingParams(max_new_tokens=10, temperature=1.0, seed=s, ignore_eos=True)
           for s in (5, 6, 7)]
    alone = [engine.generate_sync(prompt, sp)[0] for sp in sps]
    before = engine.stats.as_dict()
    futures = _submit_paused(engine, [(prompt, sp, f"share-{i}") for i, sp in enumerate(sps)]
                             + [(other, sps[0], "share-other")])
    results = [f.result(60)[0] for f in futures]
    after = engine.stats.as_dict()
    assert after["prefill_tokens"] - before["prefill_tokens"] == 39 + 29 + 4
    assert after["shared_prompts"] - before["shared_prompts"] == 2
    assert [r.cached_tokens for r in results[:3]] == [0, 39, 39]
    for res, ref in zip(results, alone):
        assert res.output_ids == ref.output_ids
        check_logprobs(model, prompt, res, temperature=1.0)
    check_logprobs(model, other, results[3], temperature=1.0)


def test_followers_prefill_themselves_when_the_shared_prefill_fails(engine, model):
    """The request prefilling a shared prompt fails alone: the requests waiting to copy its
    row are prefilled on their own and answer as if nothing was shared."""
    from agentrl_jax.rollout.contract import RequestFailedError

    prompt = random_prompt(np.random.default_rng(23), 40)
    sp = SamplingParams(max_new_tokens=8, ignore_eos=True, **GREEDY)
    original = engine.scheduler.prefill_row

    def failing(seq, *args):
        if seq.req.rid == "lead":
            raise RuntimeError("injected prefill failure")
        return original(seq, *args)

    engine.scheduler.prefill_row = failing
    try:
        futures = _submit_paused(engine, [(prompt, sp, rid) for rid in ("lead", "f1", "f2")])
        with pytest.raises(RequestFailedError):
            futures[0].result(60)
        reference = reference_greedy(model, prompt, 8)
        for f in futures[1:]:
            (res,) = f.result(60)
            assert res.output_ids == reference and res.cached_tokens == 0
    finally:
        del engine.scheduler.prefill_row


def test_abort_pause_resume(engine):
    prompt = random_prompt(np.random.default_rng(10), 5)
    fut = engine.submit(prompt, SamplingParams(max_new_tokens=120, ignore_eos=True, **GREEDY),
                        rid="to-abort")
    deadline = time.time() + 30
    while not engine.load()["running"] and time.time() < deadline:
        time.sleep(0.001)
    engine.pause("in_place")
    assert engine.abort("to-abort")
    (res,) = fut.result(30)
    assert res.finish_reason == "abort" and len(res.output_ids) < 120
    # While paused, new requests wait; they finish after resume.
    waiting = engine.submit(prompt, SamplingParams(max_new_tokens=3, **GREEDY))
    time.sleep(0.05)
    assert not waiting.done()
    engine.resume()
    assert len(waiting.result(30)[0].output_ids) == 3
    assert not engine.abort("unknown-rid")


def test_overload_and_validation(model):
    eng = make_engine(model, max_queue=3)
    try:
        eng.pause("in_place")
        futures = [eng.submit([5, 6], SamplingParams(max_new_tokens=2)) for _ in range(3)]
        with pytest.raises(OverloadedError):
            eng.submit([5, 6], SamplingParams(max_new_tokens=2))
        eng.resume()
        assert all(len(f.result(30)[0].output_ids) == 2 for f in futures)
        bad = [
            ([], SamplingParams()), ([1, TINY.vocab_size], SamplingParams()),
            ([-1], SamplingParams()), (["a"], SamplingParams()),
            ([5] * REF_LEN, SamplingParams()),  # prompt must be < max_length
            ([5], SamplingParams(temperature=-1)), ([5], SamplingParams(top_p=0)),
            ([5], SamplingParams(top_k=0)), ([5], SamplingParams(n=9)),
            ([5], SamplingParams(stop_token_ids=[10**6])), ([5], SamplingParams(stop=["x"])),
            ([5], SamplingParams(max_new_tokens=-1)),
        ]
        for ids, sp in bad:
            with pytest.raises(InvalidRequestError):
                eng.submit(ids, sp)
        (empty,) = eng.generate_sync([5], SamplingParams(max_new_tokens=0))
        assert empty.output_ids == [] and empty.finish_reason == "length"
    finally:
        eng.close()


async def test_update_weights_in_memory(engine, model):
    other = tiny_model(seed=1)
    prompt = random_prompt(np.random.default_rng(11), 15)
    sp = SamplingParams(max_new_tokens=10, ignore_eos=True, **GREEDY)
    before = await engine.generate(prompt, sp, session_id="w")
    assert before.output_ids == reference_greedy(model, prompt, 10)
    version = await engine.update_weights(other)  # an nnx model: no copy
    try:
        after = await engine.generate(prompt, sp, session_id="w")
        assert after.cached_tokens == 0  # prefix caches were invalidated
        assert after.weight_version == version
        assert after.output_ids == reference_greedy(other, prompt, 10)
        # A pure-dict pytree works as well.
        await engine.update_weights(nnx.state(model).to_pure_dict())
        again = await engine.generate(prompt, sp)
        assert again.output_ids == before.output_ids
    finally:
        await engine.update_weights(model)
    wrong = nnx.state(model).to_pure_dict()
    wrong["final_norm"]["scale"] = np.ones((3,), np.float32)
    with pytest.raises(ValueError):
        await engine.update_weights(wrong)


async def test_registry_and_backend_interface(model):
    backend = create_backend({"name": "embedded", "model": model, "max_batch": 8,
                              "max_length": REF_LEN, "prefill_chunks": (16, 64),
                              "prefill_tokens": 128, "decode_steps": 4})
    async with backend:
        assert await backend.health()
        res = await backend.generate([5, 6, 7], SamplingParams(max_new_tokens=4, **GREEDY))
        assert res.output_ids == reference_greedy(model, [5, 6, 7], 4, (TINY.eos_token_id,))
        many = await backend.generate_n([5, 6, 7], SamplingParams(max_new_tokens=4, n=2))
        assert len(many) == 2
    with pytest.raises(ValueError):
        create_backend("nope")


@pytest.fixture(scope="session")
def smollm2():
    from rollout_helpers import smollm2_engine
    return smollm2_engine()


def test_smollm2_capital_of_france(smollm2):
    from agentrl_jax.models.tokenizer import encode_chat

    engine = smollm2
    ids = encode_chat(engine.tokenizer, [{"role": "user",
                                          "content": "What is the capital of France?"}])
    (res,) = engine.generate_sync(ids, SamplingParams(max_new_tokens=24, **GREEDY))
    assert "Paris" in res.text, res.text
    assert res.finish_reason == "stop" and res.matched_stop in engine.eos_token_ids


@pytest.mark.parametrize("one_pass", [False, True])
def test_sample_tokens_distribution(one_pass):
    """The fused sampler draws from softmax(logits / T) restricted by top-k / top-p / min-p,
    with XLA's separate reductions and with the one-pass reduction (the GPU engine's)."""
    import jax
    import jax.numpy as jnp

    from agentrl_jax.rollout.engine.sampling import SAMPLE, SAMPLE_FILTERED, sample_tokens

    probs = np.array([0.4, 0.3, 0.15, 0.1, 0.05], np.float32)
    n = 4000
    logits = jnp.asarray(np.tile(np.log(probs), (n, 1)))
    keys = jnp.asarray(np.tile(np.array([0, 42], np.uint32), (n, 1)))
    counter = jnp.arange(n, dtype=jnp.int32)  # distinct counters -> independent draws

    fn = jax.jit(functools.partial(sample_tokens, one_pass=one_pass), static_argnums=(8,))

    def draw(mode, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
        full = lambda v, dt: jnp.full((n,), v, dt)  # noqa: E731
        tok, lp, raw = fn(logits, full(temperature, jnp.float32), full(top_k, jnp.int32),
                          full(top_p, jnp.float32), full(min_p, jnp.float32), keys,
                          full(0, jnp.int32), counter, mode)
        tok = np.asarray(tok)
        return np.bincount(tok, minlength=5) / n, tok, np.asarray(lp), np.asarray(raw)

    freq, tok, lp, raw = draw(SAMPLE)
    np.testing.assert_allclose(freq, probs, atol=0.03)
    np.testing.assert_allclose(raw, np.log(probs)[tok], atol=1e-5)
    freq, tok, lp, raw = draw(SAMPLE, temperature=0.5)
    tempered = probs ** 2 / (probs ** 2).sum()
    np.testing.assert_allclose(freq, tempered, atol=0.03)
    np.testing.assert_allclose(lp, np.log(tempered)[tok], atol=1e-5)  # tempered logprob
    np.testing.assert_allclose(raw, np.log(probs)[tok], atol=1e-5)  # untempered
    same, tok_f, _, _ = draw(SAMPLE_FILTERED)  # no truncation requested: identical draws
    assert np.array_equal(tok_f, draw(SAMPLE)[1])
    for kwargs in ({"top_k": 2}, {"top_p": 0.5}, {"min_p": 0.5}):
        freq, *_ = draw(SAMPLE_FILTERED, **kwargs)
        assert freq[2:].sum() == 0, kwargs
        np.testing.assert_allclose(freq[:2], probs[:2] / probs[:2].sum(), atol=0.03)


def test_logsumexp_and_argmax_in_one_pass_match_numpy():
    """The sampler's one-pass reduction against float64 NumPy: logsumexp, max and argmax
    (first index on ties), rows with -inf entries and a row of only -inf."""
    import jax

    from agentrl_jax.rollout.engine.sampling import logsumexp_and_argmax

    def logsumexp(a, axis):
        top = a.max(axis=axis, keepdims=True)
        safe = np.where(np.isfinite(top), top, 0.0)
        return (safe + np.log(np.exp(a - safe).sum(axis=axis, keepdims=True))).squeeze(axis)

    rng = np.random.default_rng(0)
    x = (rng.standard_normal((6, 5000)) * 8).astype(np.float32)
    x[1, [17, 4000]] = 60.0  # a tie: the first index wins
    y = x.copy() + rng.standard_normal(x.shape).astype(np.float32)  # a different argmax input
    y[2, :2500] = -np.inf
    x[3, ::2] = -np.inf
    x[4] = -np.inf
    y[4] = -np.inf
    lse, top, idx = jax.jit(logsumexp_and_argmax)(x, y)
    np.testing.assert_allclose(np.asarray(lse), logsumexp(x.astype(np.float64), axis=1),
                               rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(idx), np.argmax(y, axis=1))
    np.testing.assert_array_equal(np.asarray(top), y.max(axis=1))
    _, _, same = logsumexp_and_argmax(x, x)
    assert int(same[1]) == 17


def test_head_major_forward_matches_model():
    """rollout.engine.forward (head-major cache) == CausalLM (its own cache, and no cache) on the
    architecture features the Llama engine tests above do not cover."""
    import jax
    import jax.numpy as jnp

    from agentrl_jax.models.llama import KVCache
    from agentrl_jax.rollout.engine.forward import HeadMajorCache, forward

    from agentrl_jax.models.llama import init_model

    # Qwen2 q/k/v biases + Qwen3 q/k norms + tied embeddings + one KV head + head_dim != D/H.
    cfg = TINY.replace(model_type="qwen3", attention_bias=True, qk_norm=True,
                       tie_word_embeddings=True, head_dim=24, num_kv_heads=1)
    model = init_model(cfg, 3)
    graphdef, state = nnx.split(model)
    rng = np.random.default_rng(0)
    b, s = 3, 24
    ids = rng.integers(3, cfg.vocab_size, size=(b, s)).astype(np.int32)

    @jax.jit
    def run(state, ids):
        m = nnx.merge(graphdef, state)
        full = m(ids).hidden
        # chunk 1: positions 0..15 (row 2 only 0..9, the rest padded to S -> dropped)
        pos1 = np.tile(np.arange(16, dtype=np.int32), (b, 1))
        pos1[2, 10:] = 64
        cache = HeadMajorCache.zeros(cfg, b, 64)
        ref_cache = KVCache.zeros(cfg, b, 64)
        h1, cache = forward(m, ids[:, :16], pos1, cache)
        r1 = m(ids[:, :16], pos1, ref_cache)
        # chunk 2: one decode step at position 16 for rows 0-1, 10 for row 2
        pos2 = np.array([[16], [16], [10]], np.int32)
        tok2 = jnp.stack([ids[0, 16], ids[1, 16], ids[2, 10]])[:, None]
        h2, cache = forward(m, tok2, pos2, cache)
        r2 = m(tok2, pos2, r1.cache)
        return full, h1, r1.hidden, h2, r2.hidden

    full, h1, r1, h2, r2 = map(np.asarray, run(state, ids))
    np.testing.assert_allclose(h1[:2], full[:2, :16], atol=2e-5)
    np.testing.assert_allclose(h1[2, :10], full[2, :10], atol=2e-5)
    np.testing.assert_allclose(h1, r1, atol=2e-5)
    np.testing.assert_allclose(h2[:2, 0], full[:2, 16], atol=2e-5)
    np.testing.assert_allclose(h2[2, 0], full[2, 10], atol=2e-5)
    np.testing.assert_allclose(h2, r2, atol=2e-5)


def test_merged_projections_forward_matches_model():
    """forward(..., merged=merge_projections(m)) (q/k/v and gate/up as one GEMM each) gives
    the same hidden states as the model's separate projections, with q/k/v biases and GQA."""
    import jax

    from agentrl_jax.models.llama import init_model
    from agentrl_jax.rollout.engine.forward import HeadMajorCache, forward, merge_projections

    cfg = TINY.replace(model_type="qwen2", attention_bias=True, num_kv_heads=2)
    model = init_model(cfg, 5)
    graphdef, state = nnx.split(model)
    ids = np.random.default_rng(1).integers(3, cfg.vocab_size, size=(2, 12)).astype(np.int32)
    pos = np.tile(np.arange(12, dtype=np.int32), (2, 1))

    @jax.jit
    def run(state, ids):
        m = nnx.merge(graphdef, state)
        merged = merge_projections(m)
        plain, _ = forward(m, ids, pos, HeadMajorCache.zeros(cfg, 2, 32))
        fused, cache = forward(m, ids, pos, HeadMajorCache.zeros(cfg, 2, 32), merged=merged)
        step_plain, _ = forward(m, ids[:, :1], pos[:, :1] + 12, cache)
        step_fused, _ = forward(m, ids[:, :1], pos[:, :1] + 12, cache, merged=merged)
        return plain, fused, step_plain, step_fused

    plain, fused, step_plain, step_fused = map(np.asarray, run(state, ids))
    np.testing.assert_allclose(fused, plain, atol=2e-5)
    np.testing.assert_allclose(step_fused, step_plain, atol=2e-5)
    assert np.abs(plain).max() > 0.1  # a real comparison, not zeros


@pytest.mark.parametrize("gemm", ["merged", "merged_cublas"])
def test_merged_decode_gemm_engine(model, gemm):
    """An engine with merged decode GEMMs generates the reference greedy tokens and
    logprobs (cuBLAS-only is a GPU compiler option; on CPU the merged path runs as is)."""
    eng = make_engine(model, decode_gemm=gemm, prefill_chunks=(64,), warmup=False)
    try:
        assert eng.decode_gemm == gemm
        check_greedy(eng, model, seed=13, prompt_len=20, new_tokens=12)
    finally:
        eng.close()


def test_merged_weights_follow_weight_updates_and_kv_release(model):
    """The merged decode weights are built once per weight version: an update rebuilds them
    (the new model's greedy tokens come out), release_kv_cache frees them with the cache (the
    bytes returned count both) and the next request rebuilds both."""
    eng = make_engine(model, decode_gemm="merged", prefill_chunks=(64,), warmup=False)
    other = tiny_model(seed=7)
    sp = SamplingParams(max_new_tokens=8, ignore_eos=True, **GREEDY)
    prompt = random_prompt(np.random.default_rng(21), 15)
    try:
        merged_before = eng.weights.merged
        eng.update_weights_sync(other)
        assert eng.weights.merged is not merged_before
        (res,) = eng.generate_sync(prompt, sp)
        assert res.output_ids == reference_greedy(other, prompt, 8)
        cfg, c = TINY, eng.config
        kv = 2 * cfg.num_layers * c.max_batch * c.max_length * cfg.num_kv_heads * cfg.head_dim * 4
        per_layer = cfg.hidden_size * ((cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
                                       + 2 * cfg.intermediate_size)
        assert eng.release_kv_cache_sync() == kv + cfg.num_layers * per_layer * 4  # float32
        assert eng.kv.cache is None and eng.weights.merged is None
        (res,) = eng.generate_sync(prompt, sp)
        assert res.output_ids == reference_greedy(other, prompt, 8)
        assert eng.weights.merged is not None
    finally:
        eng.close()


def test_decode_gemm_config():
    """``auto`` is merged_cublas only for a one-GPU head-major engine; bad values fail."""
    from agentrl_jax.rollout.engine.engine import EngineConfig

    auto = EngineConfig()
    assert auto.resolved_decode_gemm("gpu", 1) == "merged_cublas"
    assert auto.resolved_decode_gemm("gpu", 2) == "xla"
    assert auto.resolved_decode_gemm("cpu", 1) == "xla"
    assert EngineConfig(kv_layout="bskd").resolved_decode_gemm("gpu", 1) == "xla"
    assert EngineConfig(decode_gemm="merged").resolved_decode_gemm("gpu", 2) == "merged"
    with pytest.raises(ValueError, match="decode_gemm"):
        EngineConfig(decode_gemm="cublas")
    with pytest.raises(ValueError, match="kv_layout"):
        EngineConfig(decode_gemm="merged", kv_layout="bskd")


def test_model_layout_engine(model):
    """kv_layout='bskd' runs the model's own forward and cache: same greedy output."""
    eng = make_engine(model, kv_layout="bskd", prefill_chunks=(64,), warmup=False)
    try:
        check_greedy(eng, model, seed=12, prompt_len=30, new_tokens=10)
    finally:
        eng.close()


async def test_weights_from_the_learner_do_not_recompile(model, tokenizer):
    """The learner's parameters (committed to its mesh's NamedSharding) are moved to the
    engine's layout: the compiled decode / prefill functions are reused. Before, the first
    rollout after every weight sync recompiled them (docs/PERFORMANCE.md, "A whole RL step")."""
    import jax

    from agentrl_jax.learner import Learner, LearnerConfig
    from agentrl_jax.sharding.mesh import make_mesh

    learner = Learner(model, LearnerConfig(kl_coef=0.0, entropy_coef=0.0, dtype="float32",
                                           remat=False),
                      mesh=make_mesh(devices=jax.devices()[:1]))
    assert all(x.committed for x in jax.tree.leaves(learner.params))
    engine = make_engine(model, tokenizer)  # fresh: its compilation cache is this test's own
    try:
        prompt = random_prompt(np.random.default_rng(12), 9)
        sp = SamplingParams(max_new_tokens=6, ignore_eos=True, **GREEDY)
        await engine.generate(prompt, sp)
        sizes = (engine.functions.decode._cache_size(), engine.functions.prefill._cache_size())
        await engine.update_weights(learner.params)
        after = await engine.generate(prompt, sp)
        assert after.output_ids == reference_greedy(model, prompt, 6)
        assert (engine.functions.decode._cache_size(), engine.functions.prefill._cache_size()) == sizes
    finally:
        await engine.aclose()


def test_prefill_kv_buckets_choose_the_smallest_row_prefix():
    from agentrl_jax.rollout.engine.engine import EngineConfig
    from agentrl_jax.rollout.engine.resolution import resolve_engine_config

    # the default "auto": the whole row on CPU, powers of two from 512 on an accelerator
    assert resolve_engine_config(EngineConfig(max_length=4096), "cpu").kv_buckets == (4096,)
    c = resolve_engine_config(EngineConfig(max_length=4096, max_batch=32, prefill_tokens=4096,
                                           prefill_chunks=(64, 256, 1024),
                                           prefill_kv_buckets=None, prefill_attention="dense"),
                              "gpu")
    assert c.kv_buckets == (512, 1024, 2048, 4096)  # None ("auto"): powers of two from 512
    assert c.prefill_kv(64, 10) == 512 and c.prefill_kv(64, 512) == 512
    assert c.prefill_kv(64, 513) == 1024 and c.prefill_kv(256, 3000) == 4096
    assert c.prefill_kv(1024, 100) == 1024  # never below the chunk: fewer compiled shapes
    assert (1024, 4, 512) not in c.prefill_shapes() and (64, 32, 512) in c.prefill_shapes()
    assert len(c.prefill_shapes()) == 4 + 4 + 3
    assert resolve_engine_config(EngineConfig(max_length=384, prefill_kv_buckets=None,
                                              prefill_attention="dense"), "gpu"
                                 ).kv_buckets == (384,)
    with pytest.raises(ValueError, match="resolve"):  # "auto" is no length until resolved
        EngineConfig(max_length=4096).kv_buckets
    assert EngineConfig(max_length=4096, prefill_kv_buckets=()).kv_buckets == (4096,)
    assert EngineConfig(max_length=100, prefill_kv_buckets=(32, 64, 500)).kv_buckets == (
        32, 64, 100)
    with pytest.raises(ValueError):
        EngineConfig(prefill_kv_buckets=(0,))


def test_prefill_over_kv_buckets_matches_reference(model):
    """Prefill calls that read / write only a bucket of each row's prefix (16 / 32 / 64 of 128
    positions) give the reference greedy tokens and teacher-forced log-probs, in multi-turn
    sessions whose cached prefix crosses the buckets, the same as an engine that always
    attends over the whole row."""
    bucketed = make_engine(model, prefill_kv_buckets=(16, 32, 64), warmup=False)
    whole = make_engine(model, prefill_kv_buckets=(), warmup=False)
    try:
        assert bucketed.config.kv_buckets == (16, 32, 64, 128)
        rng = np.random.default_rng(11)
        sampling = SamplingParams(max_new_tokens=6, ignore_eos=True, **GREEDY)
        # two sessions at once (rows of one prefill call need different buckets)
        histories = {"a": random_prompt(rng, 5), "b": random_prompt(rng, 23)}
        for turn in range(4):
            for sid, history in histories.items():
                (rb,) = bucketed.generate_sync(history, sampling, session_id=sid)
                (rw,) = whole.generate_sync(history, sampling, session_id=sid)
                assert rb.output_ids == reference_greedy(model, history, 6)
                check_logprobs(model, history, rb)
                assert rb.output_ids == rw.output_ids and rb.cached_tokens == rw.cached_tokens
                np.testing.assert_allclose(rb.output_logprobs, rw.output_logprobs, atol=ATOL)
                histories[sid] = history + rb.output_ids + random_prompt(rng, 9 + 4 * turn)
        assert max(len(h) for h in histories.values()) > 64  # the last turns used kv 128
    finally:
        bucketed.close()
        whole.close()


def test_parallel_warmup_compiles_every_shape_ahead(model, monkeypatch):
    """warmup(parallel=True) compiles decode, every prefill bucket and the row copy ahead of
    time on a thread pool; the warm-up calls after it then compile nothing (jit's cache holds
    what ``lower().compile()`` built), and the engine generates the reference tokens."""
    from jax._src import monitoring

    from agentrl_jax import compile_notice

    phase = {"name": "before"}
    compiles: dict[str, int] = {"before": 0, "ahead": 0, "after": 0}
    compiled_ahead: list[int] = []
    real_ahead = compile_notice.compile_ahead

    def ahead(calls, workers=None):
        phase["name"] = "ahead"
        compiled_ahead.append(real_ahead(calls, workers))
        phase["name"] = "after"
        return compiled_ahead[-1]

    def listen(name, _secs, **_kw):
        if name == "/jax/core/compile/backend_compile_duration":
            compiles[phase["name"]] += 1

    monitoring.register_event_duration_secs_listener(listen)
    monkeypatch.setattr(compile_notice, "compile_ahead", ahead)
    # shapes no other test's engine uses, so nothing is in jit's cache yet
    engine = make_engine(model, warmup=False, max_batch=5, prefill_kv_buckets=(16, 48))
    try:
        phase["name"] = "before"
        compiles.update(before=0, ahead=0, after=0)
        engine.warmup(parallel=True)
        shapes = engine.config.prefill_shapes(engine.packed_prefill)
        assert compiled_ahead == [2 + len(shapes) + 1]
        # chunked: 2 chunks x KV buckets (16, 48, 128) >= the chunk; packed: 2 row buckets
        assert len(shapes) == (2 if engine.packed_prefill else 4)
        assert compiles["ahead"] >= len(shapes) + 2, compiles
        assert compiles["after"] == 0, compiles
        prompt = random_prompt(np.random.default_rng(3), 21)
        (r,) = engine.generate_sync(prompt, SamplingParams(max_new_tokens=5, ignore_eos=True,
                                                           **GREEDY))
        assert r.output_ids == reference_greedy(model, prompt, 5)
    finally:
        phase["name"] = "done"
        monitoring.unregister_event_duration_listener(listen)
        engine.close()
