"""A policy restricted to its action tokens (``ModelConfig.output_token_ids``,
``models/output_tokens.py``; the run setting ``model.output_tokens``).

References: the restricted log-probs and entropies are a NumPy log-softmax over the allowed
columns of the *unrestricted* model's logits (learner: full head, scored head, packed rows;
engine: prefill + decode under every decode GEMM variant); many temperature-1 samples never
leave the allowed set; the engine's sampled log-probs equal the learner's for the same tokens;
the gradient is finite and never reaches a disallowed token's output weights; the setting
resolves through a tokenizer (one token each, EOS added) and is refused where it cannot hold.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentrl_jax.learner.logprobs import token_logprobs
from agentrl_jax.learner.scored import scored_token_logprobs
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.llama import init_model
from agentrl_jax.models.output_tokens import resolve_output_tokens
from agentrl_jax.rollout.contract import SamplingParams
from agentrl_jax.rollout.engine.forward import DECODE_GEMM

CFG = ModelConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=8, eos_token_id=1, bos_token_id=0,
                  pad_token_id=1, max_position_embeddings=256)
ALLOWED = (1, 7, 8, 30, 55, 90)  # EOS (1) among them
T = 24


def _models(logit_scale: float = 8.0):
    """(unrestricted, restricted) models with the same weights; the head scaled so that the
    distributions are far from uniform (a wrong column set shows)."""
    free = init_model(CFG, seed=3)
    free.lm_head.kernel[...] = free.lm_head.kernel[...] * logit_scale
    restricted = init_model(CFG.replace(output_token_ids=ALLOWED), seed=3)
    nnx.update(restricted, nnx.state(free, nnx.Param))
    return free, restricted


def _numpy_restricted(logits: np.ndarray, temperature: float = 1.0
                      ) -> tuple[np.ndarray, np.ndarray]:
    """(log-probs [..., V] with -inf outside ALLOWED, entropy [...]) of the softmax over the
    allowed columns of ``logits / temperature``, by a plain NumPy log-sum-exp."""
    z = logits.astype(np.float64) / temperature
    cols = np.asarray(ALLOWED)
    sub = z[..., cols]
    lse = np.log(np.sum(np.exp(sub - sub.max(-1, keepdims=True)), -1)) + sub.max(-1)
    lp = np.full_like(z, -np.inf)
    lp[..., cols] = sub - lse[..., None]
    p = np.exp(lp[..., cols])
    return lp, -np.sum(p * lp[..., cols], -1)


def _tokens(rng, rows: int, length: int) -> np.ndarray:
    """Prompt tokens anywhere in the vocabulary, the generated part (from position 4) drawn
    from the allowed set, as a sampler of the restricted policy would."""
    toks = rng.integers(2, CFG.vocab_size, (rows, length))
    toks[:, 4:] = rng.choice(ALLOWED, (rows, length - 4))
    return toks.astype(np.int32)


def test_config_keeps_sorted_distinct_ids_and_refuses_bad_ones():
    assert CFG.replace(output_token_ids=(9, 2, 5)).output_token_ids == (2, 5, 9)
    for bad, fragment in [((), "at least one"), ((3, 3), "repeats"),
                          ((96,), "not a token id"), ((-1,), "not a token id")]:
        with pytest.raises(ValueError, match=fragment):
            CFG.replace(output_token_ids=bad)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_learner_logprobs_and_entropy_are_the_softmax_over_the_allowed_columns(temperature):
    free, restricted = _models()
    toks = _tokens(np.random.default_rng(0), 3, T)
    logits = np.asarray(free(jnp.asarray(toks)).logits)  # unrestricted, [B, T, V]
    ref_lp, ref_ent = _numpy_restricted(logits, temperature)
    graphdef, params = nnx.split(restricted)
    lp, ent = token_logprobs(graphdef, params, jnp.asarray(toks), temperature=temperature,
                             with_entropy=True)
    want = np.take_along_axis(ref_lp[:, :-1], toks[:, 1:, None], -1)[..., 0]
    np.testing.assert_allclose(np.asarray(lp)[:, 1:], want, atol=2e-5)
    np.testing.assert_allclose(np.asarray(ent)[:, 1:], ref_ent[:, :-1], atol=2e-5)
    # a prompt token outside the set has probability 0 under the restricted policy
    assert np.isneginf(np.asarray(lp)[:, 1:4]).all()
    # the model's own logits (generate.py, __call__) are restricted the same way
    own = np.asarray(restricted(jnp.asarray(toks)).logits)
    outside = np.setdiff1d(np.arange(CFG.vocab_size), ALLOWED)
    assert np.isneginf(own[..., outside]).all()
    np.testing.assert_allclose(own[..., list(ALLOWED)], logits[..., list(ALLOWED)], atol=1e-5)


def test_scored_head_and_packed_rows_match_the_reference():
    free, restricted = _models()
    rng = np.random.default_rng(1)
    toks = _tokens(rng, 2, T)
    loss_mask = np.zeros_like(toks, np.float32)
    loss_mask[:, 4:] = 1.0
    graphdef, params = nnx.split(restricted)
    lp = np.asarray(scored_token_logprobs(graphdef, params, jnp.asarray(toks), None,
                                          jnp.asarray(loss_mask), capacity=32))
    ref_lp, _ = _numpy_restricted(np.asarray(free(jnp.asarray(toks)).logits))
    want = np.take_along_axis(ref_lp[:, :-1], toks[:, 1:, None], -1)[..., 0]
    np.testing.assert_allclose(lp[:, 4:], want[:, 3:], atol=2e-5)
    assert (lp[:, :4] == 0).all()  # unscored positions
    # packed: the two rows end to end in one row, positions restarting, segment ids 1 and 2
    packed = toks.reshape(1, -1)
    positions = np.tile(np.arange(T, dtype=np.int32), 2)[None]
    segments = np.repeat(np.array([1, 2], np.int32), T)[None]
    lp_packed, _ = token_logprobs(graphdef, params, jnp.asarray(packed),
                                  positions=jnp.asarray(positions),
                                  segment_ids=jnp.asarray(segments))
    got = np.asarray(lp_packed).reshape(2, T)
    np.testing.assert_allclose(got[:, 4:], want[:, 3:], atol=2e-5)


def test_gradient_is_finite_and_never_reaches_a_disallowed_token():
    _, restricted = _models()
    toks = jnp.asarray(_tokens(np.random.default_rng(2), 2, T))
    graphdef, params = nnx.split(restricted)

    def loss(p):
        lp, ent = token_logprobs(graphdef, p, toks, with_entropy=True)
        return -jnp.sum(lp[:, 4:]) - 0.1 * jnp.sum(ent[:, 4:])

    grads = jax.grad(loss)(params)
    assert all(bool(jnp.isfinite(g).all()) for g in jax.tree.leaves(grads))
    head = np.asarray(grads["lm_head"]["kernel"][...])  # [D, V]
    outside = np.setdiff1d(np.arange(CFG.vocab_size), ALLOWED)
    assert (head[:, outside] == 0).all()
    assert np.abs(head[:, list(ALLOWED)]).sum() > 0


@pytest.fixture(scope="module")
def models():
    return _models()


@pytest.mark.parametrize("decode_gemm", DECODE_GEMM)
def test_engine_samples_only_allowed_tokens_with_the_learners_logprobs(models, decode_gemm):
    from rollout_helpers import make_engine

    free, restricted = models
    engine = make_engine(restricted, warmup=False, max_batch=8, decode_gemm=decode_gemm)
    try:
        rng = np.random.default_rng(4)
        prompt = [int(t) for t in rng.integers(2, CFG.vocab_size, 9)]
        futures = [engine.submit(prompt, SamplingParams(temperature=1.0, max_new_tokens=12,
                                                        n=8, seed=seed, ignore_eos=True))
                   for seed in range(4)]
        results = [r for f in futures for r in f.result(600)]
    finally:
        engine.close()
    drawn = np.array([t for r in results for t in r.output_ids])
    assert len(drawn) == 32 * 12 and set(drawn) <= set(ALLOWED)
    assert len(set(drawn)) == len(ALLOWED)  # temperature 1: every allowed token comes up
    graphdef, params = nnx.split(restricted)
    for r in results[:6]:
        seq = np.asarray([prompt + r.output_ids], np.int32)
        ref_lp, _ = _numpy_restricted(np.asarray(free(jnp.asarray(seq)).logits)[0])
        out = np.asarray(r.output_ids)
        rows = np.arange(len(prompt) - 1, seq.shape[1] - 1)
        np.testing.assert_allclose(r.output_logprobs, ref_lp[rows, out], atol=2e-5)
        np.testing.assert_allclose(r.output_logprobs_raw, ref_lp[rows, out], atol=2e-5)
        learner_lp, _ = token_logprobs(graphdef, params, jnp.asarray(seq))
        np.testing.assert_allclose(r.output_logprobs,
                                   np.asarray(learner_lp)[0, len(prompt):], atol=2e-5)


class _CharTokenizer:
    """One token per character, except "xy" (two tokens)."""

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]


def test_setting_resolves_one_token_each_and_adds_eos():
    tok = _CharTokenizer()
    assert resolve_output_tokens(tok, "cab", eos_token_ids=(2,)) == (2, 97, 98, 99)
    assert resolve_output_tokens(tok, [" ", "z"]) == (32, 122)
    with pytest.raises(ValueError, match=r"'xy' is 2 tokens"):
        resolve_output_tokens(tok, ["a", "xy"])
    with pytest.raises(ValueError, match="the same token"):
        resolve_output_tokens(tok, "aba")
    with pytest.raises(ValueError, match="lists no token"):
        resolve_output_tokens(tok, [])


def test_run_config_refuses_sglang_and_tokens_that_are_not_one_token():
    from agentrl_jax.training.config.experiment import ConfigError, base_config, to_run_config
    from agentrl_jax.training.preflight.validate import output_token_problems

    c = base_config()
    c.model.output_tokens = "abc"
    c.rollout.backend = "sglang"
    c.rollout.urls = "http://127.0.0.1:30000"
    with pytest.raises(ConfigError, match="model.output_tokens: rollout.backend='sglang'"):
        to_run_config(c)
    c.rollout.backend = "embedded"
    model = to_run_config(c).model
    assert output_token_problems(model) == []  # SmolLM2's tokenizer: one token per letter
    from agentrl_jax.training.config.sections import ModelConfig as ModelSection

    problems = output_token_problems(ModelSection(output_tokens=("a", " forward", "pickup up")))
    assert len(problems) == 1 and "'pickup up' is" in problems[0] and "not one" in problems[0]
