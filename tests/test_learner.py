"""Learner tests on a tiny random model (8 virtual CPU devices from tests/conftest.py).

Compilation dominates on CPU, so compiled learners are shared through module-scoped fixtures
and the learner's own jit cache (same model / config / mesh -> same compiled step).
"""

from __future__ import annotations

import glob
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentrl_jax.learner import Learner, LearnerConfig, bucket_length
from agentrl_jax.learner.metrics import (matmul_params, peak_flops_per_device,
                                         train_flops_per_token)
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.llama import init_model
from agentrl_jax.sharding.mesh import make_mesh
from learner_helpers import update_logprobs

TINY = ModelConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2,
                   num_heads=4, num_kv_heads=2, head_dim=16)

# Shared by the logprob, sharding and gradient-accumulation tests.
BASE = LearnerConfig(dtype="float32", remat=False, learning_rate=1e-3, micro_batch_size=8,
                     min_length_bucket=32, logprob_chunk_size=12, kl_coef=0.01,
                     entropy_coef=0.01, clip_ratio_high=0.28, ratio_source="rollout")

needs_8 = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 (virtual) devices")


def one_device_mesh():
    return make_mesh(devices=jax.devices()[:1])


@pytest.fixture(scope="module")
def base_state():
    """Initial weights as host arrays (model init is slow on CPU: do it once)."""
    graphdef, state = nnx.split(init_model(TINY, seed=0))
    return graphdef, jax.tree.map(np.asarray, state)


def fresh_model(base_state):
    graphdef, state = base_state
    return nnx.merge(graphdef, jax.tree.map(jnp.asarray, state))


def multiturn_batch(seed: int, batch: int = 6, length: int = 30, vocab: int = 512):
    """Right-padded multi-turn rows: prompt, then generated / observation spans, then pad."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, (batch, length)).astype(np.int32)
    lens = rng.integers(length // 2, length + 1, batch)
    lens[0] = length
    attn = (np.arange(length)[None] < lens[:, None]).astype(np.int32)
    loss = np.zeros((batch, length), np.float32)
    for b in range(batch):
        t = int(rng.integers(2, 5))  # prompt
        gen = True
        while t < lens[b]:
            span = int(rng.integers(2, 6))
            if gen:
                loss[b, t:min(t + span, lens[b])] = 1
            t += span
            gen = not gen
    tokens = tokens * attn
    return {"tokens": tokens, "attention_mask": attn, "loss_mask": loss,
            "rollout_logprobs": (-rng.random((batch, length)) * 6 * loss).astype(np.float32),
            "group_id": np.arange(batch) // 2, "reward": rng.random(batch).astype(np.float32)}


def on_policy(learner: Learner, batch: dict, noise_seed: int = 0) -> dict:
    """Replace rollout logprobs by the learner's own + small noise (realistic ratios ~1)."""
    lp = update_logprobs(learner, batch)
    rng = np.random.default_rng(noise_seed)
    out = dict(batch)
    out["rollout_logprobs"] = ((lp + 0.05 * rng.standard_normal(lp.shape)) *
                               batch["loss_mask"]).astype(np.float32)
    return out


def host_params(learner: Learner):
    return jax.tree.map(np.asarray, jax.device_get(learner.params))


def assert_trees_close(a, b, atol, rtol=0.0):
    for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a)[0], jax.tree.leaves(b)):
        np.testing.assert_allclose(x, y, atol=atol, rtol=rtol, err_msg=jax.tree_util.keystr(path))


# ----------------------------------------------------------------- reference single-device run
@pytest.fixture(scope="module")
def reference_run(base_state):
    """1-device learner, two updates on two multi-turn batches; records everything."""
    learner = Learner(fresh_model(base_state), BASE, mesh=one_device_mesh())
    batches = [on_policy(learner, multiturn_batch(s), s) for s in (1, 2)]
    params, metrics = [], []
    for b in batches:
        metrics.append(learner.update(b))
        params.append(host_params(learner))
    return {"learner": learner, "batches": batches, "params": params, "metrics": metrics}


def test_logprobs_match_numpy_float64(reference_run, base_state):
    learner = reference_run["learner"]
    batch = multiturn_batch(7, batch=5, length=27)
    lp, ent = update_logprobs(learner, batch, with_entropy=True)
    assert lp.shape == ent.shape == batch["tokens"].shape
    # NumPy float64 reference from the model's full [B, T, V] logits (explicit attention mask)
    # (jitted model calls: one program instead of an eager op-by-op run)
    logits = nnx.jit(lambda m, t, a: m(t, attention_mask=a).logits)(
        learner.policy_model(), jnp.asarray(batch["tokens"]), jnp.asarray(batch["attention_mask"]))
    z = np.asarray(logits, np.float64)
    logsm = z - z.max(-1, keepdims=True)
    logsm = logsm - np.log(np.exp(logsm).sum(-1, keepdims=True))
    expect = np.zeros(lp.shape)
    expect[:, 1:] = np.take_along_axis(logsm[:, :-1], batch["tokens"][:, 1:, None], -1)[..., 0]
    expect_ent = np.zeros(lp.shape)
    expect_ent[:, 1:] = -(np.exp(logsm) * logsm).sum(-1)[:, :-1]
    real = batch["attention_mask"] != 0
    real[:, 0] = False
    np.testing.assert_allclose(lp[real], expect[real], atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(ent[real], expect_ent[real], atol=2e-5, rtol=1e-5)
    assert np.all(lp[:, 0] == 0)
    # the reference model is the initial policy: after two updates they differ, a little
    ref = update_logprobs(learner, batch, which="reference")
    fresh = nnx.jit(lambda m, t: m(t).logits)(fresh_model(base_state),
                                             jnp.asarray(batch["tokens"]))
    zf = np.asarray(fresh, np.float64)
    zf = zf - zf.max(-1, keepdims=True)
    zf = zf - np.log(np.exp(zf).sum(-1, keepdims=True))
    ref_expect = np.take_along_axis(zf[:, :-1], batch["tokens"][:, 1:, None], -1)[..., 0]
    np.testing.assert_allclose(ref[:, 1:][real[:, 1:]], ref_expect[real[:, 1:]], atol=2e-5)
    assert np.abs(ref - lp)[real].max() > 1e-4


def test_update_metrics_are_sane(reference_run):
    m0, m1 = reference_run["metrics"]
    for m in (m0, m1):
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm",
                    "actor/pg_clipfrac", "actor/ppo_kl", "advantages/mean", "reward/mean",
                    "perf/tokens_per_s", "actor/lr"):
            assert key in m and np.isfinite(m[key]), key
        assert m["batch/padded_rows"] == 8 and m["batch/padded_length"] == 32
    assert 0 < m0["actor/grad_norm"] < 100
    assert m1["learner/optimizer_step"] == 2 and m1["learner/update_step"] == 2
    assert m0["actor/kl_loss"] < 1e-6 < m1["actor/kl_loss"]  # policy == reference at step 0
    assert abs(m0["actor/entropy"] - np.log(512)) < 0.1  # near-uniform random init


@needs_8
@pytest.mark.parametrize("mesh_shape", [dict(data=1, fsdp=4, tensor=2), dict(data=8, fsdp=1)],
                         ids=["fsdp4xtensor2", "data8"])
def test_sharded_step_matches_single_device(reference_run, base_state, mesh_shape):
    learner = Learner(fresh_model(base_state), BASE, mesh=make_mesh(**mesh_shape))
    q = learner.params["layers"][0]["attn"]["q_proj"]["kernel"][...]
    if mesh_shape["fsdp"] == 4:
        assert q.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor")
        assert len({s.device for s in q.addressable_shards}) == 8
    for step, batch in enumerate(reference_run["batches"]):
        metrics = learner.update(batch)
        ref_metrics = reference_run["metrics"][step]
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm"):
            np.testing.assert_allclose(metrics[key], ref_metrics[key], rtol=1e-4, atol=1e-6,
                                       err_msg=key)
        # AdamW's first steps move every weight by ~lr * sign(grad): where a gradient is ~0 a
        # different reduction order can flip the sign, so bound single entries by 0.1 * lr and
        # require the mean difference to be tiny.
        got, want = host_params(learner), reference_run["params"][step]
        assert_trees_close(got, want, atol=0.1 * BASE.learning_rate)
        diffs = [np.abs(x - y).mean() for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want))]
        assert max(diffs) < 1e-7
    # the optimizer state kept its sharding
    mu = learner.opt_state[1][0].mu["layers"][0]["mlp"]["up_proj"]["kernel"][...]
    assert mu.sharding.spec == learner.params["layers"][0]["mlp"]["up_proj"]["kernel"][...].sharding.spec


def test_gradient_accumulation_equals_full_batch(reference_run, base_state):
    """micro_batch_size 2 (6 rows: 3 micro-batches, rounded up to 4 on CPU, the fourth all
    padding) == one micro-batch of 8 padded rows."""
    learner = Learner(fresh_model(base_state), BASE.replace(micro_batch_size=2),
                      mesh=one_device_mesh())
    metrics = learner.update(reference_run["batches"][0])
    assert metrics["batch/padded_rows"] == 8
    ref = reference_run["metrics"][0]
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm",
                "actor/pg_clipfrac"):
        np.testing.assert_allclose(metrics[key], ref[key], rtol=1e-5, atol=1e-7, err_msg=key)
    got, want = host_params(learner), reference_run["params"][0]
    assert_trees_close(got, want, atol=0.1 * BASE.learning_rate)  # see the sharded test
    diffs = [np.abs(x - y).mean() for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want))]
    assert max(diffs) < 1e-8


def test_batch_checks(reference_run):
    learner = reference_run["learner"]
    bad = multiturn_batch(3)
    for key in ("tokens", "attention_mask", "loss_mask"):  # left padding
        bad[key] = bad[key][:, ::-1].copy()
    bad["loss_mask"][:, :3] = 0
    with pytest.raises(ValueError, match="right-padded"):
        learner.update(bad)
    bad = multiturn_batch(3)
    bad["loss_mask"][:, 0] = 1
    with pytest.raises(ValueError, match="loss_mask"):
        learner.update(bad)
    assert learner.update_step == 2  # rejected batches changed nothing


# ----------------------------------------------------------------- learning on a synthetic task
PROMPT, GEN = 4, 12


def target_reward(tokens: np.ndarray) -> np.ndarray:
    """Fraction of generated tokens that are multiples of 8 (1/8 for a uniform policy)."""
    return ((tokens[:, PROMPT:] % 8) == 0).mean(-1).astype(np.float32)


@pytest.fixture(scope="module")
def sampler(base_state):
    """``make(policy_graphdef) -> jitted sample(params, key, prompts) -> (tokens, logprobs)``:
    ancestral sampling without a KV cache (a full forward per new token; tiny model)."""
    length = PROMPT + GEN

    def make(policy_graphdef):
        @jax.jit
        def sample(params, key, prompts):
            model = nnx.merge(policy_graphdef, params)
            b = prompts.shape[0]
            buf = jnp.zeros((b, length), jnp.int32).at[:, :PROMPT].set(prompts)
            lps = jnp.zeros((b, length), jnp.float32)

            def body(i, carry):
                buf, lps, key = carry
                pos = PROMPT + i
                logits = jax.lax.dynamic_index_in_dim(model(buf).logits, pos - 1, 1, False)
                key, sub = jax.random.split(key)
                tok = jax.random.categorical(sub, logits).astype(jnp.int32)
                lp = jax.nn.log_softmax(logits)[jnp.arange(b), tok]
                buf = jax.lax.dynamic_update_index_in_dim(buf, tok, pos, 1)
                lps = jax.lax.dynamic_update_index_in_dim(lps, lp, pos, 1)
                return buf, lps, key
            buf, lps, _ = jax.lax.fori_loop(0, GEN, body, (buf, lps, key))
            return buf, lps
        return sample
    return make


def train_on_task(learner: Learner, sample, steps: int, seed: int = 0) -> list[float]:
    rng = np.random.default_rng(seed)
    key = jax.random.key(seed)
    n_tasks, n_samples = 8, 4
    b, t = n_tasks * n_samples, PROMPT + GEN
    loss_mask = np.zeros((b, t), np.float32)
    loss_mask[:, PROMPT:] = 1
    rewards = []
    for _ in range(steps):
        prompts = np.repeat(rng.integers(0, TINY.vocab_size, (n_tasks, PROMPT)), n_samples, 0)
        key, sub = jax.random.split(key)
        tokens, lps = jax.device_get(sample(learner.params, sub, prompts.astype(np.int32)))
        r = target_reward(tokens)
        rewards.append(float(r.mean()))
        learner.update({"tokens": tokens, "attention_mask": np.ones((b, t), np.int32),
                        "loss_mask": loss_mask, "rollout_logprobs": lps,
                        "group_id": np.repeat(np.arange(n_tasks), n_samples), "reward": r})
    return rewards


TASK = LearnerConfig(kl_coef=0.0, entropy_coef=0.0, dtype="float32", remat=False,
                     learning_rate=1e-2, critic_learning_rate=1e-2,
                     micro_batch_size=32, min_length_bucket=16, ratio_source="rollout",
                     value_clip=None)


@pytest.mark.parametrize("estimator", ["grpo", "gae"], ids=["grpo", "ppo_critic"])
def test_rl_raises_reward(base_state, sampler, estimator):
    learner = Learner(fresh_model(base_state), TASK.replace(advantage_estimator=estimator),
                      mesh=one_device_mesh())
    assert (learner.critic_params is not None) == (estimator == "gae")
    rewards = train_on_task(learner, sampler(learner.graphdef), steps=24)
    start, end = np.mean(rewards[:3]), np.mean(rewards[-3:])
    assert start < 0.2, rewards
    assert end > start + 0.3, rewards


# ----------------------------------------------------------------- checkpoint / resume
RESUME = LearnerConfig(kl_coef=0.0, entropy_coef=0.0, dtype="float32", remat=False,
                       learning_rate=1e-3, micro_batch_size=4,
                       mini_batches=2, epochs=2, min_length_bucket=32, lr_schedule="warmup_cosine",
                       warmup_steps=3, decay_steps=20, weight_decay=0.01,
                       ratio_source="recompute", logprob_chunk_size=12)


def test_resume_continues_exactly(base_state, tmp_path):
    batches = [multiturn_batch(100 + i, batch=7) for i in range(8)]
    straight = Learner(fresh_model(base_state), RESUME, mesh=one_device_mesh())
    for b in batches:
        straight.update(b)

    ckpt = str(tmp_path / "ckpt")
    logs = str(tmp_path / "tb")
    first = Learner(fresh_model(base_state), RESUME, mesh=one_device_mesh(), checkpoint_dir=ckpt,
                    max_to_keep=2, log_dir=logs)
    for i, b in enumerate(batches[:4]):
        first.update(b)
        first.save({"data_cursor": i + 1, "phase": "short"})
    first.close()
    assert sorted(int(s) for s in os.listdir(ckpt) if s.isdigit()) == [3, 4]  # keep 2
    assert glob.glob(os.path.join(logs, "events.out.tfevents.*"))

    resumed = Learner(fresh_model(base_state), RESUME, mesh=one_device_mesh(),
                      checkpoint_dir=ckpt)
    extra = resumed.restore_latest()
    assert extra == {"data_cursor": 4, "phase": "short"}
    assert resumed.update_step == 4
    for b in batches[extra["data_cursor"]:]:
        metrics = resumed.update(b)
    resumed.close()
    assert metrics["learner/optimizer_step"] == 8 * 2 * 2  # updates x epochs x mini-batches
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(np.array_equal(a, b)),
                                     host_params(resumed), host_params(straight)))
    assert jax.tree.all(jax.tree.map(
        lambda a, b: bool(np.array_equal(np.asarray(a), np.asarray(b))),
        jax.device_get(resumed.opt_state), jax.device_get(straight.opt_state)))


def test_restore_latest_without_checkpoint_is_noop(base_state, tmp_path):
    learner = Learner(fresh_model(base_state), RESUME, mesh=one_device_mesh(),
                      checkpoint_dir=str(tmp_path / "empty"))
    assert learner.restore_latest() is None and learner.update_step == 0
    learner.close()


# ----------------------------------------------------------------- small pure pieces
def test_config_dict_roundtrip_and_validation():
    cfg = LearnerConfig.from_dict({"learning_rate": 2e-6, "length_buckets": [512, 128],
                                   "mesh": {"data": 2, "fsdp": -1}})
    assert cfg.length_buckets == (128, 512)
    assert LearnerConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="unknown keys"):
        LearnerConfig.from_dict({"learnig_rate": 1.0})
    with pytest.raises(ValueError):
        LearnerConfig(loss_agg_mode="sum")
    assert LearnerConfig(advantage_estimator="gae").use_critic
    assert not LearnerConfig().use_critic and not LearnerConfig(kl_coef=0.0).use_reference


def test_length_buckets():
    cfg = LearnerConfig()
    assert [bucket_length(n, cfg) for n in (1, 128, 129, 1000, 4096)] == [128, 128, 256, 1024, 4096]
    cfg = LearnerConfig(length_buckets=(100, 300))
    assert [bucket_length(n, cfg) for n in (50, 101, 300, 301)] == [100, 300, 300, 512]


def test_flops_and_peak_table():
    qwen = ModelConfig(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_layers=28,
                       num_heads=12, num_kv_heads=2, head_dim=128, tie_word_embeddings=True,
                       attention_bias=True, model_type="qwen2")
    assert qwen.num_parameters == 1_543_714_304  # Qwen2.5-1.5B
    assert matmul_params(qwen) == qwen.num_parameters
    per_tok = train_flops_per_token(qwen, 4096)
    assert per_tok == 6 * qwen.num_parameters + 6 * 28 * 12 * 128 * 4096
    assert peak_flops_per_device("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops_per_device("NVIDIA H100 PCIe") == 756e12
    assert peak_flops_per_device("NVIDIA H200") == 989e12
    assert peak_flops_per_device("TPU v5 lite") == 197e12
    assert peak_flops_per_device("TPU v5p") == 459e12
    assert peak_flops_per_device("TPU v4") == 275e12
    assert peak_flops_per_device("TPU v6 lite") == 918e12
    assert peak_flops_per_device("cpu") is None


@needs_8
def test_bf16_logprob_pass_casts_first_with_the_same_values(base_state):
    """The learner's log-prob pass casts the sharded float32 master weights to the compute
    dtype before the forward, as the update does (so that on GPUs FSDP can gather bfloat16
    weights: half the bytes; XLA:CPU gathers float32 for the update too, so the gathered dtype
    is not checked here), and the log-probs equal the uncast pass's exactly on an FSDP mesh
    (the model computes in bfloat16 either way)."""
    from agentrl_jax.learner.logprobs import token_logprobs
    from agentrl_jax.sharding.activations import activation_mesh
    from agentrl_jax.sharding.rules import batch_sharding

    cfg = LearnerConfig(kl_coef=0.0, entropy_coef=0.0, dtype="bfloat16", remat=False,
                        learning_rate=1e-3, micro_batch_size=4,
                        min_length_bucket=32, logprob_chunk_size=12)
    mesh = make_mesh(fsdp=4, devices=jax.devices()[:4])
    learner = Learner(fresh_model(base_state), cfg, mesh=mesh)
    assert jax.tree.leaves(learner.params)[0].dtype == jnp.float32
    batch = multiturn_batch(3, batch=4)
    tokens, mask = batch["tokens"], batch["attention_mask"]
    fn = learner.logprob_fn("float32")
    # inside the jitted pass, every use of a float32 parameter is its cast to bfloat16 (before:
    # the log-prob head's scan read the float32 output matrix too)
    inner = jax.make_jaxpr(fn)(learner.params, tokens, mask).jaxpr.eqns[0].params["jaxpr"].jaxpr
    param_vars = {id(v) for v in inner.invars[:len(jax.tree.leaves(learner.params))]}
    uses = {(e.primitive.name, str(e.params.get("new_dtype"))) for e in inner.eqns
            if any(id(v) in param_vars for v in e.invars)}
    assert uses == {("convert_element_type", "bfloat16")}, uses
    lp, _ = fn(learner.params, tokens, mask)

    def uncast(params, tokens, mask):  # the pass as it was: float32 weights into the model
        with activation_mesh(mesh):
            return token_logprobs(learner.graphdef, params, tokens, mask,
                                  chunk_size=cfg.logprob_chunk_size, temperature=cfg.temperature,
                                  use_attention_mask=cfg.use_attention_mask)[0]
    rows = batch_sharding(mesh, 2)
    want = jax.jit(uncast, in_shardings=(learner.param_shardings, rows, rows))(
        learner.params, tokens, mask)
    assert np.isfinite(np.asarray(want)).all()
    np.testing.assert_array_equal(np.asarray(lp), np.asarray(want))
