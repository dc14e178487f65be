"""Per-turn option limits in the agent (``agent.option_limits``): a lettered-choice turn that
lists ``n`` options asks for ``SamplingParams.option_count = n`` and records ``n`` on its
generated ids (``Trajectory.option_counts``); the batch carries them to the learner
(``RolloutBatch.option_counts``); the config refuses the switch where it cannot hold.

Reference: the options a real BabyAI server lists in each observation (``BabyAIEnv`` played by
hand with the same actions).
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from fake_backends import GO_TO_RED_BALL, ScriptedBackend, choice_episode

from agentrl_jax.models.pretrained import resolve_model_path
from agentrl_jax.models.tokenizer import load_tokenizer
from agentrl_jax.training.config.experiment import base_config, to_run_config
from agentrl_jax.training.rl.batching import assemble_batch
from environments.babyai.env import BabyAIEnv

pytestmark = pytest.mark.timeout(120)


async def _episode(url: str, option_limits: bool):
    tokenizer = load_tokenizer(resolve_model_path("smollm2"))
    # one token a turn, no EOS: turn left, turn right, go to red ball 1
    backend = ScriptedBackend(tokenizer, [" a", " b", " d"], eos=False, logprob=-0.5)
    traj = await choice_episode(url, backend, tokenizer, horizon=6, max_new_tokens=1,
                                option_limits=option_limits)
    return traj, backend


async def test_a_choice_turn_asks_for_and_records_its_option_count(babyai):
    reference = BabyAIEnv()
    shown = [len(reference.reset(GO_TO_RED_BALL).info["available_actions"]),
             len(reference.step("turn left").info["available_actions"]),
             len(reference.step("turn right").info["available_actions"])]
    traj, backend = await _episode(babyai.url, option_limits=True)
    assert traj.success and traj.num_turns == 3
    assert [s.option_count for s in backend.sampling] == shown
    generated = np.flatnonzero(traj.loss_mask)
    counts = np.asarray(traj.option_counts)
    assert len(counts) == len(traj.token_ids)
    assert counts[generated].tolist() == shown  # one token a turn
    assert not counts[np.asarray(traj.loss_mask) == 0].any()
    assert json.loads(json.dumps(traj.to_json()))["option_counts"] == counts.tolist()
    batch = assemble_batch([traj], pad_id=0)
    np.testing.assert_array_equal(batch.option_counts[0], counts)

    plain, backend = await _episode(babyai.url, option_limits=False)
    assert [s.option_count for s in backend.sampling] == [None] * 3
    assert not any(plain.option_counts)
    assert assemble_batch([plain], pad_id=0).option_counts is None


def _choice_config():
    config = base_config()
    config.rollout.parser = "choice"
    config.agent.prompt_style = "choice"
    config.model.output_tokens = tuple(" " + c for c in "abcdefghijklmnopqrstuvwxyz")
    config.agent.option_limits = True
    return config


def test_config_accepts_the_choice_recipe_and_refuses_the_rest():
    assert to_run_config(_choice_config()).agent.option_limits
    from agentrl_jax.training.config.experiment import ConfigError

    config = _choice_config()
    config.rollout.parser = "react"
    with pytest.raises(ConfigError, match=re.escape("needs rollout.parser='choice'")):
        to_run_config(config)
    for tokens in ("", "bacdefghijklmnopqrstuvwxyz", "abc"):
        config = _choice_config()
        config.model.output_tokens = tokens
        with pytest.raises(ConfigError, match="needs model.output_tokens to start with"):
            to_run_config(config)
