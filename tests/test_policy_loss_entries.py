"""The policy-loss entries reach the train step: ``ppo``, ``ppo_dual_clip`` and ``clip_higher``
train differently, each with its own clip numbers (docs/ALGORITHMS.md's table), and the
learner's ``clip_ratio_*`` / ``dual_clip`` override an entry only when set.

The train step's loss (``train_step.policy_loss_fn``, a tiny model) is compared with a NumPy
float64 reference of the PPO surrogate on the model's own log-probs, the old log-probs placed
so that each token's ratio falls in a region where the three entries' bounds differ.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentrl_jax.learner.config import LearnerConfig
from agentrl_jax.learner.logprobs import token_logprobs
from agentrl_jax.learner.train_step import policy_loss_fn
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.llama import init_model

TINY = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1,
                   num_heads=2, num_kv_heads=1, head_dim=16)

#: docs/ALGORITHMS.md: name -> (clip_low, clip_high, dual_clip)
TABLE = {"ppo": (0.2, 0.2, None), "ppo_dual_clip": (0.2, 0.2, 3.0),
         "clip_higher": (0.2, 0.28, None)}

#: per-token (ratio, advantage sign): below 1 - 0.2; inside; between 1.2 and 1.28 (clip_higher
#: differs); above 1.28; a large ratio with A < 0 (the dual clip differs)
CASES = [(0.7, -1.0), (1.1, 1.0), (1.25, 1.0), (1.35, 1.0), (5.0, -1.0), (0.9, 1.0)]


def np_ppo(lp, old, adv, mask, clip_low, clip_high, dual_clip):
    """token_mean of the PPO surrogate (module docstring of ``algorithms/losses.py``)."""
    lp, old, adv, mask = (np.asarray(x, np.float64) for x in (lp, old, adv, mask))
    r = np.exp(np.clip(lp - old, -20, 20))
    loss = np.maximum(-adv * r, -adv * np.clip(r, 1 - clip_low, 1 + clip_high))
    if dual_clip is not None:
        loss = np.where(adv < 0, np.minimum(loss, -adv * dual_clip), loss)
    return (loss * mask).sum() / mask.sum()


@pytest.fixture(scope="module")
def setup():
    graphdef, params = nnx.split(init_model(TINY, seed=0), nnx.Param)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, TINY.vocab_size, (2, len(CASES) + 2)).astype(np.int32)
    lp = np.asarray(token_logprobs(graphdef, params, jnp.asarray(tokens))[0])
    mask = np.zeros(tokens.shape, np.float32)
    mask[:, 2:] = 1.0  # the first tokens are the prompt
    ratio = np.ones(tokens.shape)
    adv = np.zeros(tokens.shape, np.float32)
    for j, (r, a) in enumerate(CASES):
        ratio[:, 2 + j], adv[:, 2 + j] = r, a * (1.0 + 0.5 * np.arange(2))
    old = (lp - np.log(ratio)).astype(np.float32)
    mb = {"tokens": tokens, "loss_mask": mask, "old_logprobs": old, "advantages": adv}
    return graphdef, params, lp, {k: jnp.asarray(v) for k, v in mb.items()}


def train_step_loss(setup, **learner) -> float:
    graphdef, params, _, mb = setup
    config = LearnerConfig(dtype="float32", remat=False, kl_coef=0.0, entropy_coef=0.0,
                           **learner)
    loss, _ = jax.jit(policy_loss_fn(graphdef, config))(params, mb, mb["loss_mask"].sum())
    return float(loss)


def test_the_three_entries_train_differently(setup):
    _, _, lp, mb = setup
    np_mb = {k: np.asarray(v) for k, v in mb.items()}
    got = {name: train_step_loss(setup, policy_loss=name) for name in TABLE}
    for name, bounds in TABLE.items():
        expect = np_ppo(lp, np_mb["old_logprobs"], np_mb["advantages"], np_mb["loss_mask"],
                        *bounds)
        np.testing.assert_allclose(got[name], expect, rtol=1e-5, err_msg=name)
    # the entries differ exactly where their bounds differ (each pair differs in one bound)
    assert got["ppo"] != pytest.approx(got["ppo_dual_clip"], rel=1e-4)
    assert got["ppo"] != pytest.approx(got["clip_higher"], rel=1e-4)
    # the default is what runs trained with before the entries were honoured
    assert LearnerConfig().policy_loss == "ppo_dual_clip"
    assert train_step_loss(setup) == pytest.approx(got["ppo_dual_clip"], rel=1e-6)


def test_the_config_overrides_an_entry_only_where_set(setup):
    _, _, lp, mb = setup
    np_mb = {k: np.asarray(v) for k, v in mb.items()}
    assert LearnerConfig(policy_loss="clip_higher").policy_loss_options() == {
        "clip_low": 0.2, "clip_high": 0.28, "dual_clip": None}
    cfg = LearnerConfig(policy_loss="clip_higher", dual_clip=2.0, clip_ratio_low=0.1)
    assert cfg.policy_loss_options() == {"clip_low": 0.1, "clip_high": 0.28, "dual_clip": 2.0}
    got = train_step_loss(setup, policy_loss="clip_higher", dual_clip=2.0, clip_ratio_low=0.1)
    expect = np_ppo(lp, np_mb["old_logprobs"], np_mb["advantages"], np_mb["loss_mask"],
                    0.1, 0.28, 2.0)
    np.testing.assert_allclose(got, expect, rtol=1e-5)
    # a supervised entry has no clip numbers: set ones are not passed to it
    assert LearnerConfig(policy_loss="sft", clip_ratio_high=0.3).policy_loss_options() == {}


def test_a_dual_clip_at_or_below_one_is_refused_by_the_config():
    from agentrl_common.typed_sections import SectionError

    with pytest.raises(SectionError, match="learner.dual_clip"):
        LearnerConfig(dual_clip=1.0)
