"""Per-turn option limits (``models/output_tokens.py``, ``ModelConfig.option_token_ids``,
``SamplingParams.option_count``, ``RolloutBatch.option_counts``).

A turn that lists ``n`` options lets the restricted policy sample only the first ``n`` option
tokens (EOS excluded); ``n = 0`` keeps the static restriction. References: a NumPy log-softmax
of the *unrestricted* model's logits over each position's allowed set (the first ``n`` option
tokens in their listed order, or every restricted token where ``n = 0``). The learner matches
it with the full head, the scored head, packed rows, and through the update's own padded and
packed log-prob passes; the engine samples only allowed tokens and reports the same log-probs;
bad values are refused.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentrl_jax.learner import LearnerConfig, RolloutBatch
from agentrl_jax.learner.logprobs import token_logprobs
from agentrl_jax.learner.scored import scored_token_logprobs
from agentrl_jax.learner.update import UpdatePipeline
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.llama import init_model
from agentrl_jax.models.output_tokens import option_ranks
from agentrl_jax.rollout.contract import InvalidRequestError, SamplingParams

CFG = ModelConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=8, eos_token_id=1, bos_token_id=0,
                  pad_token_id=1, max_position_embeddings=256)
OPTIONS = (55, 8, 90, 30, 7, 12)  # option k's token, in listed order (not sorted on purpose)
EOS = 1
RESTRICTED = CFG.replace(output_token_ids=tuple(sorted(OPTIONS + (EOS,))),
                         option_token_ids=OPTIONS)
T = 24
# generated positions of the trajectory and each one's option count (0: no per-turn limit)
TURNS = {5: 2, 9: 3, 13: 1, 17: 6, 20: 0, 22: 4}


def _models(logit_scale: float = 8.0):
    """(unrestricted, restricted) models with the same weights, the head scaled so that the
    distributions are far from uniform (a wrong column set shows)."""
    free = init_model(CFG, seed=5)
    free.lm_head.kernel[...] = free.lm_head.kernel[...] * logit_scale
    restricted = init_model(RESTRICTED, seed=5)
    nnx.update(restricted, nnx.state(free, nnx.Param))
    return free, restricted


def _allowed(count: int) -> list[int]:
    return list(OPTIONS[:count]) if count > 0 else sorted(OPTIONS + (EOS,))


def _numpy_logprobs(logits: np.ndarray, count: int, temperature: float = 1.0
                    ) -> tuple[np.ndarray, float]:
    """(log-probs [V], -inf outside the allowed set; entropy) of one position's ``logits
    [V]`` under option count ``count``, by a float64 log-sum-exp over the allowed columns."""
    z = logits.astype(np.float64) / temperature
    cols = np.asarray(_allowed(count))
    sub = z[cols]
    lse = np.log(np.sum(np.exp(sub - sub.max()))) + sub.max()
    lp = np.full_like(z, -np.inf)
    lp[cols] = sub - lse
    return lp, float(-np.sum(np.exp(lp[cols]) * lp[cols]))


def _trajectory(rng: np.random.Generator, rows: int):
    """``rows`` token rows of length ``T`` with the generated tokens of ``TURNS`` (each drawn
    from its allowed set), their loss mask and token-aligned option counts."""
    toks = rng.integers(2, CFG.vocab_size, (rows, T)).astype(np.int32)
    counts = np.zeros((rows, T), np.int32)
    mask = np.zeros((rows, T), np.float32)
    for pos, n in TURNS.items():
        toks[:, pos] = rng.choice(_allowed(n), rows)
        counts[:, pos] = n
        mask[:, pos] = 1.0
    return toks, mask, counts


def _reference(free, toks: np.ndarray, temperature: float = 1.0):
    """(log-probs, entropies) ``[rows, T]`` at the generated positions (0 elsewhere)."""
    logits = np.asarray(free(jnp.asarray(toks)).logits)  # [rows, T, V], unrestricted
    lp = np.zeros(toks.shape)
    ent = np.zeros(toks.shape)
    for r in range(toks.shape[0]):
        for pos, n in TURNS.items():
            row_lp, row_ent = _numpy_logprobs(logits[r, pos - 1], n, temperature)
            lp[r, pos], ent[r, pos] = row_lp[toks[r, pos]], row_ent
    return lp, ent


@pytest.fixture(scope="module")
def models():
    return _models()


def test_ranks_name_the_first_n_options_in_listed_order():
    ranks = option_ranks(OPTIONS, CFG.vocab_size)
    for n in range(1, len(OPTIONS) + 1):
        assert sorted(np.flatnonzero(ranks < n)) == sorted(OPTIONS[:n])
    assert ranks[EOS] == CFG.vocab_size  # EOS is never among the first n
    with pytest.raises(ValueError, match="option_token_ids"):
        CFG.replace(output_token_ids=(7, 8), option_token_ids=(7, 9))  # 9 is not restricted


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_learner_heads_score_each_position_under_its_option_count(models, temperature):
    free, restricted = models
    toks, mask, counts = _trajectory(np.random.default_rng(0), 2)
    want_lp, want_ent = _reference(free, toks, temperature)
    graphdef, params = nnx.split(restricted)
    lp, ent = token_logprobs(graphdef, params, jnp.asarray(toks), temperature=temperature,
                             with_entropy=True, option_counts=jnp.asarray(counts))
    at = mask != 0
    np.testing.assert_allclose(np.asarray(lp)[at], want_lp[at], atol=2e-5)
    np.testing.assert_allclose(np.asarray(ent)[at], want_ent[at], atol=2e-5)
    scored = scored_token_logprobs(graphdef, params, jnp.asarray(toks), None, jnp.asarray(mask),
                                   capacity=8, temperature=temperature,
                                   option_counts=jnp.asarray(counts))
    np.testing.assert_allclose(np.asarray(scored)[at], want_lp[at], atol=2e-5)
    # the limit matters: without it the same tokens score differently
    plain, _ = token_logprobs(graphdef, params, jnp.asarray(toks), temperature=temperature)
    assert np.abs(np.asarray(plain)[at] - want_lp[at]).max() > 1e-2


def test_packed_rows_keep_each_sequences_option_counts(models):
    free, restricted = models
    toks, mask, counts = _trajectory(np.random.default_rng(1), 2)
    want_lp, _ = _reference(free, toks)
    graphdef, params = nnx.split(restricted)
    packed = dict(positions=jnp.asarray(np.tile(np.arange(T, dtype=np.int32), 2)[None]),
                  segment_ids=jnp.asarray(np.repeat(np.array([1, 2], np.int32), T)[None]))
    lp, _ = token_logprobs(graphdef, params, jnp.asarray(toks.reshape(1, -1)),
                           option_counts=jnp.asarray(counts.reshape(1, -1)), **packed)
    scored = scored_token_logprobs(graphdef, params, jnp.asarray(toks.reshape(1, -1)), None,
                                   jnp.asarray(mask.reshape(1, -1)), capacity=16,
                                   option_counts=jnp.asarray(counts.reshape(1, -1)), **packed)
    at = mask != 0
    np.testing.assert_allclose(np.asarray(lp).reshape(2, T)[at], want_lp[at], atol=2e-5)
    np.testing.assert_allclose(np.asarray(scored).reshape(2, T)[at], want_lp[at], atol=2e-5)


@pytest.mark.parametrize("pack_length", [0, 64])
def test_update_logprob_pass_matches_the_reference_in_both_layouts(models, pack_length):
    """The update's own old-log-prob pass (``UpdatePipeline``: the padded layout, or packed
    rows) over a batch that carries ``option_counts``."""
    from agentrl_jax.learner import Learner
    from agentrl_jax.sharding.mesh import make_mesh
    import jax

    free, restricted = models
    toks, mask, counts = _trajectory(np.random.default_rng(2), 3)
    want_lp, _ = _reference(free, toks)
    cfg = LearnerConfig(kl_coef=0.0, entropy_coef=0.0, dtype="float32", remat=False,
                        micro_batch_size=1, logprob_batch_size=2, pack_length=pack_length,
                        min_length_bucket=32, advantage_estimator="grpo", shuffle=False,
                        ratio_source="recompute", mini_batches=1, epochs=1)
    learner = Learner(restricted, cfg, mesh=make_mesh(fsdp=1, devices=jax.devices()[:1]))
    batch = RolloutBatch(tokens=toks, loss_mask=mask, attention_mask=np.ones_like(toks),
                         group_id=np.zeros(3), reward=np.arange(3.0),
                         rollout_logprobs=want_lp, option_counts=counts)
    pipeline = UpdatePipeline(learner, batch)
    lp, recomputed = pipeline.old_logprobs(pipeline.layout.place())
    assert recomputed
    got = np.asarray(lp)[:3, :T]
    at = mask != 0
    np.testing.assert_allclose(got[at], want_lp[at], atol=2e-5)
    # one update trains on the same distribution: the sampler's log-probs are the learner's
    metrics = learner.update(batch)
    assert metrics["rollout/logprob_abs_diff_max"] < 2e-5
    # the train step's log-probs too: one optimiser step at the sampling weights, ratio 1
    assert abs(metrics["actor/ppo_kl_k3"]) < 1e-6 and abs(metrics["actor/ppo_kl"]) < 1e-6


def test_batch_refuses_negative_option_counts():
    toks, mask, counts = _trajectory(np.random.default_rng(3), 1)
    counts[0, 5] = -1
    with pytest.raises(ValueError, match="option_counts"):
        RolloutBatch(tokens=toks, loss_mask=mask, attention_mask=np.ones_like(toks),
                     group_id=np.zeros(1), reward=np.zeros(1), option_counts=counts).validate()


def test_engine_samples_only_the_first_n_options_with_the_reference_logprobs(models):
    from rollout_helpers import make_engine

    free, restricted = models
    engine = make_engine(restricted, warmup=False, max_batch=8)
    try:
        rng = np.random.default_rng(4)
        prompt = [int(t) for t in rng.integers(2, CFG.vocab_size, 9)]
        three = [engine.submit(prompt, SamplingParams(temperature=1.0, max_new_tokens=1, n=8,
                                                      seed=seed, option_count=3))
                 for seed in range(12)]
        free_run = [engine.submit(prompt, SamplingParams(temperature=1.0, max_new_tokens=1,
                                                         n=8, seed=seed))
                    for seed in range(12)]
        three = [r for f in three for r in f.result(600)]
        free_run = [r for f in free_run for r in f.result(600)]
        # several tokens, each under the limit (the first after prefill and the decode steps)
        long = engine.submit(prompt, SamplingParams(temperature=1.0, max_new_tokens=6,
                                                    seed=7, option_count=2,
                                                    ignore_eos=True)).result(600)[0]
        for bad in (0, -1, 7, 2.5, "3", True):
            with pytest.raises(InvalidRequestError, match="option_count"):
                engine.submit(prompt, SamplingParams(option_count=bad))
    finally:
        engine.close()
    drawn = [r.output_ids[0] for r in three]
    assert set(drawn) == set(OPTIONS[:3])  # only the first three, and each of them comes up
    assert set(r.output_ids[0] for r in free_run) - set(OPTIONS[:3])  # the limit did that
    logits = np.asarray(free(jnp.asarray([prompt])).logits)[0, -1]
    want, _ = _numpy_logprobs(logits, 3)
    for r in three:
        np.testing.assert_allclose(r.output_logprobs[0], want[r.output_ids[0]], atol=2e-5)
        np.testing.assert_allclose(r.output_logprobs_raw[0], want[r.output_ids[0]], atol=2e-5)
    assert len(long.output_ids) == 6 and set(long.output_ids) <= set(OPTIONS[:2])
    seq = np.asarray([prompt + long.output_ids])
    full = np.asarray(free(jnp.asarray(seq)).logits)[0]
    for j, tok in enumerate(long.output_ids):
        ref, _ = _numpy_logprobs(full[len(prompt) - 1 + j], 2)
        np.testing.assert_allclose(long.output_logprobs[j], ref[tok], atol=2e-5)


def test_engine_without_option_tokens_refuses_a_limit():
    from rollout_helpers import make_engine

    engine = make_engine(init_model(CFG.replace(output_token_ids=(1, 7, 8)), seed=0),
                         warmup=False, max_batch=8)
    try:
        with pytest.raises(InvalidRequestError, match="restricted to its option tokens"):
            engine.submit([5, 6, 7], SamplingParams(option_count=1))
    finally:
        engine.close()


@pytest.fixture(scope="module")
def served(models):
    from rollout_helpers import make_engine, start_server

    engine = make_engine(models[1], warmup=False, max_batch=8)
    thread = start_server(engine, model_path="tiny-restricted")
    yield thread.url, engine
    thread.stop()
    engine.close()


async def _generate(url: str, sampling_params: dict) -> tuple[int, dict]:
    import aiohttp

    body = {"input_ids": [5, 6, 7], "sampling_params": sampling_params, "return_logprob": True}
    async with aiohttp.ClientSession() as http:
        async with http.post(url + "/generate", json=body) as response:
            return response.status, await response.json()


@pytest.mark.parametrize("bad", [0, -2, 7, 2.5, "3", True, [1]])
async def test_generate_refuses_a_bad_option_count_with_a_400(served, bad):
    url, engine = served
    status, out = await _generate(url, {"option_count": bad, "max_new_tokens": 1})
    assert status == 400, out
    assert "option_count" in out["error"]["message"], out
    assert not engine.paused


async def test_generate_samples_within_the_option_count(served):
    url, _ = served
    status, out = await _generate(url, {"option_count": 2, "max_new_tokens": 3, "n": 4,
                                        "temperature": 1.0, "sampling_seed": 3,
                                        "ignore_eos": True})
    assert status == 200, out
    tokens = [t for item in out for _, t, _ in item["meta_info"]["output_token_logprobs"]]
    assert len(tokens) == 12 and set(tokens) <= set(OPTIONS[:2])


# the OpenAI routes: a restricted policy over the byte tokenizer, options the letters a..f
LETTERS = "abcdef"


@pytest.fixture(scope="module")
def served_openai():
    """(url, engine, option ids in listed order) of a restricted 512-token model with the
    byte tokenizer; the head is not scaled, so every option comes up without a limit."""
    from rollout_helpers import byte_tokenizer, make_engine, start_server

    tokenizer = byte_tokenizer(512)
    options = tuple(tokenizer.convert_tokens_to_ids(list(LETTERS)))
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    cfg = CFG.replace(vocab_size=512, eos_token_id=eos, pad_token_id=0,
                      output_token_ids=tuple(sorted(options + (eos,))), option_token_ids=options)
    engine = make_engine(init_model(cfg, seed=3), tokenizer=tokenizer, warmup=False,
                         max_batch=8)
    thread = start_server(engine, model_path="tiny-restricted-bytes")
    yield thread.url, engine, options
    thread.stop()
    engine.close()


def _openai_body(route: str, **fields) -> dict:
    if route == "/v1/completions":
        return {"prompt": "xyz", **fields}
    return {"messages": [{"role": "user", "content": "xyz"}], **fields}


async def _post(url: str, body: dict) -> tuple[int, dict]:
    import aiohttp

    async with aiohttp.ClientSession() as http, http.post(url, json=body) as response:
        return response.status, await response.json()


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("bad", [0, -2, 7, 2.5, "3", True, [1]])
async def test_openai_routes_refuse_a_bad_option_count_with_a_400(served_openai, route, bad):
    url, engine, _ = served_openai
    status, out = await _post(url + route, _openai_body(route, option_count=bad, max_tokens=1))
    assert status == 400, out
    assert f"{route}: option_count: " in out["error"]["message"], out
    if bad in (0, -2, 7):  # the range names the policy's six option tokens
        assert "must be an integer in [1, 6]" in out["error"]["message"], out
    assert not engine.paused


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
async def test_openai_routes_sample_within_the_option_count(served_openai, route):
    """n = 2: every sampled token is option a or b (ids and text); the same request without
    the limit draws the other options too (the limit did that)."""
    url, _, _ = served_openai
    common = {"max_tokens": 3, "n": 8, "temperature": 1.0, "seed": 3, "ignore_eos": True,
              "logprobs": 1 if route == "/v1/completions" else True}
    drawn, texts = {}, {}
    for limit in (2, None):
        fields = common if limit is None else {**common, "option_count": limit}
        status, out = await _post(url + route, _openai_body(route, **fields))
        assert status == 200, out
        if route == "/v1/completions":
            text = "".join(c["text"] for c in out["choices"])
            tokens = [t for c in out["choices"] for t in c["logprobs"]["tokens"]]
        else:
            text = "".join(c["message"]["content"] for c in out["choices"])
            tokens = [t["token"] for c in out["choices"] for t in c["logprobs"]["content"]]
        assert len(tokens) == 24, tokens  # 8 choices x 3 tokens (ignore_eos)
        drawn[limit] = tokens
        texts[limit] = text
    assert set(drawn[2]) <= set(LETTERS[:2]), drawn[2]  # only options a and b ...
    assert len(texts[2]) == 24 and set(texts[2]) <= set(LETTERS[:2]), texts[2]
    # ... and without the limit the policy's other tokens (options c-f, EOS) come up
    assert set(drawn[None]) - set(LETTERS[:2]), drawn[None]
    assert set(drawn[None]) <= set(LETTERS) | {"<|im_end|>"}, drawn[None]


async def test_sglang_backend_refuses_option_count_and_engine_servers_send_it():
    from agentrl_jax.rollout.backends.sglang import SGLangBackend

    backend = SGLangBackend("http://127.0.0.1:9")  # never reached: refused before sending
    with pytest.raises(InvalidRequestError, match="option_count"):
        await backend.generate_n([5, 6], SamplingParams(option_count=2))
    # our servers apply it (a sampling_params field), also through the workers' clients
    assert SGLangBackend("http://127.0.0.1:9", takes_option_count=True).client_spec()[
        "takes_option_count"]
    assert SamplingParams(option_count=2).to_sglang()["option_count"] == 2
    assert "option_count" not in SamplingParams().to_sglang()


def test_the_first_update_with_option_counts_runs_the_programs_compiled_ahead(models):
    """``agent.option_limits`` runs compile ahead with the ``option_counts`` key
    (``ahead.py``): the first packed update with per-turn limits compiles none again."""
    import jax

    from agentrl_jax.learner import Learner, UpdateOptions
    from agentrl_jax.learner.ahead import compile_first_update, first_update_keys
    from agentrl_jax.sharding.mesh import make_mesh
    from learner_helpers import recorded_compiles

    cfg = LearnerConfig(kl_coef=0.0, entropy_coef=0.0, dtype="float32", remat=False,
                        micro_batch_size=2, logprob_batch_size=3, pack_length=72,
                        logprob_chunk_size=8, advantage_estimator="grpo", tis_cap=2.0)
    learner = Learner(models[1], cfg, mesh=make_mesh(fsdp=1, devices=jax.devices()[:1]))
    assert "option_counts" in first_update_keys(learner, option_counts=True)
    assert "option_counts" not in first_update_keys(learner)
    toks, mask, counts = _trajectory(np.random.default_rng(5), 4)
    batch = RolloutBatch(tokens=toks, loss_mask=mask, attention_mask=np.ones_like(toks),
                         group_id=np.array([0, 0, 1, 1]), reward=np.array([0., 1., 1., 0.]),
                         rollout_logprobs=np.where(mask != 0, -1.0, 0.0), option_counts=counts)
    with recorded_compiles() as names:
        assert list(compile_first_update(learner, option_counts=True)) == [
            "log-prob pass", "gradient accumulation", "optimiser apply"]
        big = {"jit(packed_logprobs)", "jit(accumulate)", "jit(apply)"}
        assert big <= set(names), names
        names.clear()
        metrics = learner.update(batch, UpdateOptions(log=False))
        assert np.isfinite(metrics["actor/pg_loss"])
        assert not big & set(names), names
