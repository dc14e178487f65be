"""DPO as per-token weights of the supervised loss: its gradient equals the gradient of the DPO
loss (an independent per-pair loop, differentiated by JAX) at the parameters the log-probs came
from; a hand case; the learner runs it in the RL update (reference model built, old log-probs
recomputed)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.algorithms import compute_advantages, sft_policy_loss
from learner_helpers import update_logprobs


def _batch(seed: int, B: int = 7, T: int = 12):
    rng = np.random.default_rng(seed)
    m = (rng.random((B, T)) < 0.5).astype(np.float32)
    m[:, 0] = 0
    m[5] = 0  # a padding row
    return dict(rewards=np.array([1.0, 0.0, 0.4, 0.0, 0.0, 1.0, 0.7], np.float32), loss_mask=m,
                group_ids=np.array([3, 3, 3, 8, 8, 8, 8]),
                logprobs=rng.normal(-2, 1, (B, T)).astype(np.float32),
                ref_logprobs=rng.normal(-2, 1, (B, T)).astype(np.float32))


def dpo_loss_reference(logp, ref, m, rewards, groups, beta):
    """Mean over (successful, failed) pairs of one group of -log sigmoid(beta (s_w - s_l))."""
    s = [jnp.sum(m[i] * (logp[i] - ref[i])) for i in range(len(rewards))]
    valid = [bool(m[i].any()) for i in range(len(rewards))]
    terms = [-jax.nn.log_sigmoid(beta * (s[w] - s[l]))
             for w in range(len(rewards)) for l in range(len(rewards))
             if valid[w] and valid[l] and groups[w] == groups[l] and rewards[w] > 0
             and not rewards[l] > 0]
    return sum(terms) / len(terms)


@pytest.mark.parametrize("beta", [0.1, 2.0])
def test_gradient_is_the_dpo_gradient(beta):
    b = _batch(0)
    out = compute_advantages("dpo", **b, beta=beta)
    m = b["loss_mask"]

    def surrogate(logp):  # the sft loss with the estimator's weights (seq_mean_token_sum)
        return sft_policy_loss(logp, None, out.advantages, m, agg="seq_mean_token_sum")[0]

    lp = jnp.asarray(b["logprobs"])
    ours = jax.grad(surrogate)(lp)
    ref = jax.grad(lambda x: dpo_loss_reference(x, b["ref_logprobs"], m, b["rewards"],
                                                b["group_ids"], beta))(lp)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(ref), rtol=1e-5, atol=1e-7)
    assert np.all(np.asarray(out.advantages)[5] == 0)  # padding
    # the reported per-row loss averages each row's pair losses
    assert np.isfinite(np.asarray(out.returns)).all()


def test_hand_case_equal_log_ratios():
    """One task, one success and one failure with equal log-ratios: sigmoid(0) = 1/2, one
    pair, two rows: A = 2 * beta * 1/2 = +-beta on every generated token; a third task-mate
    that failed doubles the pairs and halves the chosen row's weight per pair."""
    m = np.array([[0, 1, 1], [0, 1, 0]], np.float32)
    z = np.zeros((2, 3), np.float32)
    out = compute_advantages("dpo", rewards=np.array([1.0, 0.0]), loss_mask=m,
                             group_ids=np.array([0, 0]), logprobs=z, ref_logprobs=z, beta=0.5)
    np.testing.assert_allclose(np.asarray(out.advantages), [[0, 0.5, 0.5], [0, -0.5, 0]])
    np.testing.assert_allclose(np.asarray(out.returns)[:, 1], np.log(2.0), rtol=1e-6)


def test_config_requires_the_supervised_loss():
    from agentrl_jax.learner import LearnerConfig

    with pytest.raises(ValueError, match="dpo"):
        LearnerConfig(advantage_estimator="dpo")
    cfg = LearnerConfig(advantage_estimator="dpo", policy_loss="sft",
                        loss_agg_mode="seq_mean_token_sum")
    assert cfg.use_reference and not cfg.use_critic


def test_learner_update_runs_dpo():
    """``advantage_estimator="dpo"`` in the learner: a reference model exists with kl_coef 0,
    and the first optimiser step's loss is the surrogate of the DPO weights computed from the
    learner's own (recomputed) and the reference log-probs (equal before any update: the
    weights are +-beta N / P sigmoid(0) sums, the loss their weighted NLL)."""
    from agentrl_jax.learner import Learner, UpdateOptions
    from agentrl_jax.models.config import ModelConfig
    from agentrl_jax.models.llama import init_model
    from agentrl_jax.sharding.mesh import make_mesh

    cfg = ModelConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_layers=1,
                      num_heads=2, num_kv_heads=1, head_dim=16)
    rng = np.random.default_rng(1)
    n, t = 4, 24
    m = np.zeros((n, t), np.float32)
    m[:, 5:12] = 1
    batch = {"tokens": rng.integers(0, 128, (n, t)).astype(np.int32),
             "attention_mask": np.ones((n, t), np.int32), "loss_mask": m,
             "rollout_logprobs": np.zeros((n, t), np.float32),
             "group_id": np.array([0, 0, 1, 1]), "reward": np.array([1.0, 0.0, 0.0, 0.0])}
    learner = Learner(init_model(cfg, seed=0),
                      dict(advantage_estimator="dpo", policy_loss="sft",
                           loss_agg_mode="seq_mean_token_sum", advantage_kwargs={"beta": 0.5},
                           dtype="float32", remat=False, micro_batch_size=2,
                           min_length_bucket=32, kl_coef=0.0, learning_rate=1e-3),
                      mesh=make_mesh(devices=jax.devices()[:1]))
    assert learner.ref_params is not None
    lp = update_logprobs(learner, batch)
    metrics = learner.update(batch, UpdateOptions(log=False))
    # one pair (rows 0, 1), policy == reference: A = +-(N=4) * 0.5 * 0.5 / 1 = +-1
    expected = (-(m[0] * lp[0]).sum() + (m[1] * lp[1]).sum()) / 4
    assert metrics["actor/pg_loss"] == pytest.approx(float(expected), rel=1e-4)
    assert metrics["advantages/max"] == pytest.approx(1.0)
    assert metrics["advantages/min"] == pytest.approx(-1.0)
