"""The update pipeline (``learner/update.py``, ``learner/layouts.py``) against an independent
reference built from the pure functions, on a tiny float32 model, for padded and packed rows.

Reference (one optimiser step on the whole batch in one piece, no padding, no packing):
old and reference log-probs with ``logprobs.token_logprobs``, GRPO advantages with
``algorithms.compute_advantages``, the loss ``algorithms.actor_loss`` (PPO-clip + KL loss),
its gradient with ``jax.grad``, the step with ``optim.make_optimizer``. ``adam_eps=1`` makes
the first AdamW step nearly linear in the gradient, so parameter deltas compare gradients
tightly (a tiny-gradient element cannot flip sign under Adam's normalisation).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from agentrl_jax.algorithms import actor_loss, compute_advantages
from agentrl_jax.learner import Learner, LearnerConfig, RolloutBatch, UpdateOptions
from agentrl_jax.learner.logprobs import token_logprobs
from agentrl_jax.learner.optim import make_optimizer
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.llama import init_model
from agentrl_jax.sharding.mesh import make_mesh

SMALL = ModelConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_layers=1,
                    num_heads=2, num_kv_heads=1, head_dim=16)
CFG = LearnerConfig(entropy_coef=0.0, dtype="float32", remat=False, learning_rate=1e-2,
                    adam_eps=1.0,
                    grad_clip=None, micro_batch_size=2, min_length_bucket=32,
                    logprob_chunk_size=16, kl_coef=0.05, kl_in_reward=False,
                    ratio_source="recompute", clip_ratio_high=0.28, advantage_estimator="grpo")


def make_batch(seed: int = 0, b: int = 6, t: int = 28) -> dict[str, np.ndarray]:
    """Right-padded rows of different lengths: prompt, then generated / observation spans."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(t // 2, t + 1, b)
    lens[0] = t
    attn = (np.arange(t)[None] < lens[:, None]).astype(np.int32)
    loss = np.zeros((b, t), np.float32)
    for i in range(b):
        pos, gen = 3, True
        while pos < lens[i]:
            span = int(rng.integers(2, 5))
            if gen:
                loss[i, pos:min(pos + span, lens[i])] = 1
            pos, gen = pos + span, not gen
    tokens = rng.integers(1, SMALL.vocab_size, (b, t)).astype(np.int32) * attn
    return {"tokens": tokens, "attention_mask": attn, "loss_mask": loss,
            "rollout_logprobs": (-rng.random((b, t)) * loss).astype(np.float32),
            "group_id": np.arange(b) // 3, "reward": rng.random(b).astype(np.float32)}


@pytest.fixture(scope="module")
def reference():
    """``(pg_loss, grad_norm, new params)`` of the reference step on ``make_batch()``."""
    model = init_model(SMALL, seed=0)
    graphdef, params = nnx.split(model, nnx.Param)[:2]
    batch = make_batch()
    tokens, am = jnp.asarray(batch["tokens"]), jnp.asarray(batch["attention_mask"])
    mask = batch["loss_mask"]

    def logprobs(p):
        return token_logprobs(graphdef, p, tokens, am, chunk_size=16)[0]

    old = np.asarray(logprobs(params))
    ref = old  # the reference is the initial policy
    adv = np.asarray(compute_advantages("grpo", rewards=batch["reward"], loss_mask=mask,
                                        group_ids=batch["group_id"]).advantages)

    def loss(p):
        return actor_loss(logprobs(p), old, adv, mask, policy_loss=CFG.policy_loss,
                          ref_logprobs=ref, kl_coef=CFG.kl_coef, kl_estimator=CFG.kl_estimator,
                          entropy_coef=0.0, agg=CFG.loss_agg_mode, **CFG.policy_loss_options())
    (_, metrics), grads = jax.value_and_grad(loss, has_aux=True)(params)
    tx = make_optimizer(CFG)[0]
    updates, _ = tx.update(grads, tx.init(params), params)
    new = optax.apply_updates(params, updates)
    return {"pg_loss": float(metrics["pg_loss"]), "grad_norm": float(optax.global_norm(grads)),
            "params": jax.tree.map(np.asarray, new), "initial": params}


@pytest.mark.parametrize("pack_length", [0, 64], ids=["padded", "packed"])
def test_pipeline_step_equals_the_reference_step(reference, pack_length):
    learner = Learner(init_model(SMALL, seed=0), CFG.replace(pack_length=pack_length),
                      mesh=make_mesh(devices=jax.devices()[:1]))
    metrics = learner.update(RolloutBatch.from_mapping(make_batch()), UpdateOptions(log=False))
    assert metrics["batch/rows"] == 6
    assert ("batch/packed_rows" in metrics) == bool(pack_length)
    np.testing.assert_allclose(metrics["actor/pg_loss"], reference["pg_loss"], rtol=1e-5,
                               atol=1e-7)
    np.testing.assert_allclose(metrics["actor/grad_norm"], reference["grad_norm"], rtol=1e-5)
    got = jax.tree.map(np.asarray, jax.device_get(learner.params))
    for (path, x), y, x0 in zip(jax.tree_util.tree_flatten_with_path(got)[0],
                                jax.tree.leaves(reference["params"]),
                                jax.tree.leaves(reference["initial"])):
        # the step's delta (about lr x gradient) to 1e-4 of the step size
        np.testing.assert_allclose(x - x0, y - x0, atol=1e-4 * CFG.learning_rate, rtol=1e-4,
                                   err_msg=jax.tree_util.keystr(path))


def test_rollout_batch_checks_shapes_masks_and_keys():
    good = make_batch()
    batch = RolloutBatch.from_mapping(good)
    assert batch.shape == (6, 28) and batch.loss_mask.dtype == np.float32
    np.testing.assert_array_equal(batch.lengths(), good["attention_mask"].sum(1))
    batch.validate()
    with pytest.raises(ValueError, match="unknown batch keys.*'tokenz'"):
        RolloutBatch.from_mapping({**good, "tokenz": good["tokens"]})
    with pytest.raises(KeyError, match="reward"):
        RolloutBatch.from_mapping({k: v for k, v in good.items() if k != "reward"}).validate()
    with pytest.raises(ValueError, match=r"group_id must be \[B\]=6"):
        RolloutBatch.from_mapping({**good, "group_id": np.zeros(5)}).validate()
    bad = dict(good, loss_mask=good["loss_mask"].copy())
    bad["loss_mask"][1, 0] = 1
    with pytest.raises(ValueError, match=r"loss_mask\[:, 0\]"):
        RolloutBatch.from_mapping(bad).validate()
    left = {k: (v[:, ::-1].copy() if np.ndim(v) == 2 else v) for k, v in good.items()}
    left["loss_mask"][:, :3] = 0
    with pytest.raises(ValueError, match="right-padded"):
        RolloutBatch.from_mapping(left).validate()
    RolloutBatch.from_mapping(left).validate(right_padded=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        batch.tokens = good["tokens"]  # type: ignore[misc]
