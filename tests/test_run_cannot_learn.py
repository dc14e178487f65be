"""Runs that cannot learn stop and say so (issue 52, items 3-5), fast.

* Settings that make every step train nothing are refused before anything starts: a group
  estimator with one sample per task (the estimator registry knows each estimator's smallest
  group; checked here against what each estimator computes for groups of one), clip ratios
  outside their meaning, a context or response prefix that leaves the first turn no room (a
  lower bound of the first prompt, checked against real first prompts).
* Settings that used to crash late: a random model's head counts, an ``env.timeout`` too short
  to reach a server, environment servers that cannot list their tasks.
* A non-finite loss, gradient or parameter stops the run in the step it appears, before the
  weights reach the backend or a checkpoint (the trainer's real loop with a recording learner;
  the learner's finiteness flag on a real tiny model).
* A step whose episodes generated nothing (``context_limit`` before the first turn) is a
  failed step.
* SIGTERM during the opening or the final evaluation stops the run with its one line.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.agent.actor_pool import TaskRef, summarize
from agentrl_jax.agent.chat import ChatFormatter
from agentrl_jax.agent.episode import MIN_NEW_TOKENS
from agentrl_jax.agent.prompts import first_user_message, system_prompt
from agentrl_jax.agent.trajectory import Trajectory
from agentrl_jax.algorithms import ADVANTAGE_ESTIMATORS, is_logprob_level, is_turn_level
from agentrl_jax.algorithms import compute_advantages, min_group_size
from agentrl_jax.learner import LearnerConfig
from agentrl_jax.training.config.experiment import base_config
from agentrl_jax.training.rl.failed_steps import RunFailure
from agentrl_jax.training.rl.nonfinite import nonfinite_values
from agentrl_jax.training.preflight.prompt_room import first_prompt_floor
from agentrl_jax.training.rl.task_sampler import TaskSampler
from agentrl_jax.training.rl.trainer import Trainer
from agentrl_jax.training.preflight.validate import config_problems, run_problems
from learner_helpers import tiny_batch, tiny_learner
from tests.test_trainer_failed_step import (FailingPool, RecordingBackend, RecordingLearner,
                                            fake_loop_config, run_fake_loop)


def _smoke():
    return importlib.import_module("experiments.smoke").get_config()


# ------------------------------------------------------------------ refused before the start
def test_min_group_size_is_what_each_estimator_does_with_groups_of_one():
    """The registry's smallest group against the estimators themselves: with every group of
    one sample, an estimator of smallest group 2 gives only zero advantages (whatever the
    rewards), one of smallest group 1 does not."""
    rng = np.random.default_rng(0)
    b, t = 6, 5
    rewards = jnp.asarray(rng.normal(size=b), jnp.float32)
    mask = jnp.ones((b, t), jnp.float32)
    groups = jnp.arange(b)  # every group of one
    checked = {}
    for name in ADVANTAGE_ESTIMATORS.names():
        if is_turn_level(name):  # gigpo: anchor groups within an episode can hold two turns
            assert min_group_size(name) == 1
            continue
        extra = {}
        if is_logprob_level(name):
            extra = dict(logprobs=jnp.asarray(rng.normal(size=(b, t)), jnp.float32),
                         ref_logprobs=jnp.zeros((b, t), jnp.float32))
        values = jnp.zeros((b, t), jnp.float32) if name == "gae" else None
        adv = compute_advantages(name, rewards=rewards, loss_mask=mask, group_ids=groups,
                                 values=values, **extra).advantages
        all_zero = not np.any(np.asarray(adv))
        assert all_zero == (min_group_size(name) == 2), name
        checked[name] = min_group_size(name)
    assert checked["grpo"] == checked["drgrpo"] == checked["rloo"] == checked["dpo"] == 2
    assert checked["gae"] == checked["reinforce_pp"] == 1


def test_a_group_estimator_with_one_sample_per_task_is_refused():
    c = _smoke()
    c.train.samples_per_task = 1
    assert config_problems(c) == [
        "train.samples_per_task: learner.advantage_estimator='grpo' needs at least 2 samples "
        "per task (its baseline is the task's group: with 1 every advantage is 0 and no step "
        "trains anything)"]
    c.learner.advantage_estimator = "Dr-GRPO"  # any spelling the registry takes
    assert [p.split(":")[0] for p in config_problems(c)] == ["train.samples_per_task"]
    for fine in ("gae", "reinforce_pp"):
        c.learner.advantage_estimator = fine
        assert config_problems(c) == []
    c.learner.advantage_estimator = "grpo"
    c.train.samples_per_task = 2
    assert config_problems(c) == []


@pytest.mark.parametrize("key,value,problem", [
    ("clip_ratio_low", 1.0, "must be a number in (0, 1), or None (got 1.0)"),
    ("clip_ratio_low", 0.0, "must be a number in (0, 1), or None (got 0.0)"),
    ("clip_ratio_high", 0.0, "must be a finite number > 0 (got 0.0)"),
    ("dual_clip", 1.0, "must be a finite number > 1 (got 1.0)"),
    ("dual_clip", 0.5, "must be a finite number > 1 (got 0.5)"),
])
def test_clip_ratios_outside_their_meaning_are_refused(key, value, problem):
    c = _smoke()
    c.learner[key] = value
    assert config_problems(c) == [f"learner.{key}: {problem}"]


def test_clip_ratios_inside_their_meaning_are_accepted():
    c = _smoke()
    c.learner.clip_ratio_low, c.learner.clip_ratio_high, c.learner.dual_clip = 0.1, 0.28, 1.5
    assert config_problems(c) == []
    c.learner.dual_clip = None
    assert config_problems(c) == []
    LearnerConfig(clip_ratio_low=0.999, clip_ratio_high=5.0, dual_clip=None)  # no error


def test_random_init_shapes_are_checked_as_the_network_config_checks_them():
    from agentrl_jax.models.config import ModelConfig

    c = _smoke()
    c.model.random_init.num_kv_heads = 3
    with pytest.raises(ValueError) as network:  # the error the run used to die of, late
        ModelConfig(vocab_size=10, **c.model.random_init.to_dict())
    assert config_problems(c) == [f"model.random_init: {network.value}"]
    assert "num_heads=4 is not a multiple of num_kv_heads=3" in str(network.value)
    c = _smoke()
    del c.model.random_init["head_dim"]
    assert config_problems(c) == [
        "model.random_init: lacks head_dim (a random model needs hidden_size, "
        "intermediate_size, num_layers, num_heads, num_kv_heads, head_dim)"]
    c.model.random_init = {}  # a pretrained model: nothing to check here
    assert config_problems(c) == []


def test_an_env_timeout_too_short_to_reach_a_server_is_refused():
    c = _smoke()
    c.env.timeout = 0.001
    assert config_problems(c) == ["env.timeout: must be a finite number >= 1 (got 0.001)"]
    c.env.timeout = 1.0
    assert config_problems(c) == []


def test_the_first_prompt_floor_is_below_every_real_first_prompt(tokenizer):
    """The floor against the real first prompts of BabyAI and TextCraft (their servers'
    instructions and an observation), for each answer format and several prefixes; and it
    grows with the prefix by exactly the prefix's tokens."""
    from environments.babyai.env import INSTRUCTIONS as BABYAI
    from environments.textcraft.env import INSTRUCTIONS as TEXTCRAFT

    formatter = ChatFormatter(tokenizer)
    observations = {"babyai": "Your mission: go to the red ball.\nYou see a wall 2 steps ahead.",
                    "textcraft": "Crafting commands:\ncraft 4 oak planks using 1 oak log\n"
                                 "Goal: craft oak planks."}
    for env, instructions in (("babyai", BABYAI), ("textcraft", TEXTCRAFT)):
        for style in ("action", "react"):
            for prefix in ("", "Action:", "Thought: let me think.\n" * 20):
                floor = first_prompt_floor(formatter, env, style, prefix)
                real = (formatter.prompt_ids(system_prompt(instructions, env, style),
                                             first_user_message(observations[env]))
                        + (formatter.encode_text(prefix) if prefix else []))
                assert 0 < floor <= len(real), (env, style, prefix, floor, len(real))
                # the bound is not vacuous: the template and answer format are in it
                assert floor >= len(formatter.encode_text(prefix)) + 20 if prefix else floor > 20
        base = first_prompt_floor(formatter, env, "action", "")
        long_prefix = "Action: " * 100
        assert first_prompt_floor(formatter, env, "action", long_prefix) == (
            base + len(formatter.encode_text(long_prefix)))


def test_a_context_or_response_prefix_without_room_is_refused(tmp_path, tokenizer):
    formatter = ChatFormatter(tokenizer)
    c = _smoke()
    floors = {env: first_prompt_floor(formatter, env, "action", "Action:")
              for env in ("babyai", "textcraft")}
    c.rollout.max_context = min(floors.values()) + MIN_NEW_TOKENS - 1  # no room for either
    c.rollout.max_new_tokens = 8
    problems = run_problems(c, str(tmp_path / "run"))
    assert [p.split(" leave")[0] for p in problems] == [
        f"rollout.max_context: {c.rollout.max_context} tokens"] * 2
    assert problems[0] == (
        f"rollout.max_context: {c.rollout.max_context} tokens leave no room for the first turn "
        f"of babyai: its first prompt takes at least {floors['babyai']} tokens (system prompt "
        f"and chat template {floors['babyai'] - 2}, agent.response_prefix 2) before the "
        f"instructions and the observation, and a turn needs {MIN_NEW_TOKENS} more to "
        f"generate; every episode would end with context_limit before its first turn")
    c = _smoke()  # 1024 tokens of context, a prefix of 4,000 characters
    c.agent.response_prefix = "Action: " * 500
    prefix_tokens = len(formatter.encode_text(c.agent.response_prefix))
    assert prefix_tokens + MIN_NEW_TOKENS <= 1024  # the prefix alone would fit
    problems = run_problems(c, str(tmp_path / "run"))
    assert len(problems) == 2, problems
    assert all(f"agent.response_prefix {prefix_tokens})" in p for p in problems), problems
    assert run_problems(_smoke(), str(tmp_path / "run")) == []


# ------------------------------------------------------------------ non-finite updates
def test_nonfinite_values_names_losses_gradients_and_parameters():
    good = {"actor/pg_loss": 0.1, "actor/grad_norm": 2.0, "critic/vf_loss": 1.0,
            "learner/params_finite": 1.0, "rollout/mean_reward": float("nan"),
            "actor/pg_clipfrac": 0.0}
    assert nonfinite_values(good) == []  # a nan outside the update's losses is no fault
    bad = dict(good, **{"actor/pg_loss": float("nan"), "critic/grad_norm": float("inf"),
                        "learner/params_finite": 0.0})
    assert nonfinite_values(bad) == ["actor/pg_loss=nan", "critic/grad_norm=inf", "parameters"]
    assert nonfinite_values({"actor/total_loss": float("-inf")}) == ["actor/total_loss=-inf"]


class NonFiniteLearner(RecordingLearner):
    """Its update ``bad_at`` (1-based) returns a nan loss and non-finite parameters."""

    def __init__(self, bad_at: int):
        super().__init__()
        self.bad_at = bad_at

    def update(self, batch, options=None):
        metrics = super().update(batch, options)
        bad = len(self.updates) == self.bad_at
        return {**metrics, "actor/pg_loss": float("nan") if bad else 0.1,
                "actor/grad_norm": float("nan") if bad else 1.0,
                "learner/params_finite": 0.0 if bad else 1.0}


@pytest.mark.parametrize("save_every,saved", [(1, [1, 2]), (100, [])])
def test_a_nonfinite_update_stops_the_run_before_its_weights_are_synced_or_saved(
        tmp_path, save_every, saved):
    """The third update goes non-finite: the run stops in step 3 with one line, nothing of
    step 3 is synced, logged or saved (nor at the end: step 3 was the last step, and the
    SIGTERM save is not reached either)."""
    learner, backend = NonFiniteLearner(bad_at=3), RecordingBackend()
    with pytest.raises(RunFailure) as info:
        run_fake_loop(fake_loop_config(3, save_every=save_every), tmp_path, learner, backend,
                      FailingPool(failing=()))
    assert learner.saved == saved and backend.versions == ["1", "2"]
    assert [step for step, _ in learner.writer.rows] == [1, 2]
    kept = ("nothing was saved after the checkpoint of step 2; once a setting is changed (e.g. "
            "a smaller learner.learning_rate), the same command resumes from it" if saved else
            "no checkpoint was saved; once a setting is changed (e.g. a smaller "
            "learner.learning_rate), the same command starts the run again")
    assert str(info.value) == (
        f"stopped at step 3: the update went non-finite (actor/grad_norm=nan, "
        f"actor/pg_loss=nan, parameters); {kept} (workdir {tmp_path})")


def test_the_learner_reports_whether_its_parameters_are_finite():
    """``learner/params_finite`` of real updates of a tiny model: 1.0 normally; 0.0 once a
    parameter is nan; and a learning rate of 1e10 makes some checked value non-finite within
    three updates (the reported run: pg_loss=nan from step 3)."""
    cfg = LearnerConfig(kl_coef=0.0, entropy_coef=0.0, micro_batch_size=4, dtype="float32",
                        learning_rate=1e-3)
    learner = tiny_learner(cfg)
    metrics = learner.update(tiny_batch(0, 4, 16))
    assert metrics["learner/params_finite"] == 1.0 and nonfinite_values(metrics) == []
    leaves, tree = jax.tree_util.tree_flatten(learner.params)
    leaves[0] = leaves[0].at[(0,) * leaves[0].ndim].set(jnp.nan)
    learner.params = jax.tree_util.tree_unflatten(tree, leaves)
    metrics = learner.update(tiny_batch(1, 4, 16))
    assert metrics["learner/params_finite"] == 0.0 and "parameters" in nonfinite_values(metrics)

    huge = tiny_learner(LearnerConfig(kl_coef=0.0, entropy_coef=0.0, micro_batch_size=4,
                                      dtype="float32", learning_rate=1e10))
    found = []
    for seed in range(3):
        found = nonfinite_values(huge.update(tiny_batch(seed, 4, 16)))
        if found:
            break
    assert found, "a learning rate of 1e10 stayed finite for three updates"


# ------------------------------------------------------------------ steps with nothing to train
class NoRoomPool(FailingPool):
    """Every episode ends with context_limit before its first turn (no generated token)."""

    async def collect(self, tasks, n_samples, horizon, policy_version=0, seed=None,
                      progress=None, version_fn=None, lockstep=False):
        self.rollouts += 1
        out = []
        for g, task in enumerate(tasks):
            for i in range(n_samples):
                t = Trajectory(env=task.env, task_id=task.task_id, group_id=g, sample_index=i,
                               horizon=horizon, policy_version=policy_version)
                t.append(list(range(60)), generated=False, turn=-1)
                t.status = "context_limit"
                t.error = "the first prompt takes 60 of the 64 tokens of the context: fewer " \
                          "than 8 are left to generate"
                out.append(t)
        return out, summarize(out, 0.1)


def test_steps_whose_episodes_generated_nothing_count_as_failed(tmp_path):
    pool, learner = NoRoomPool(failing=()), RecordingLearner()
    with pytest.raises(RunFailure) as info:
        run_fake_loop(fake_loop_config(40, save_every=1), tmp_path, learner, RecordingBackend(),
                      pool)
    assert pool.rollouts == 3 and learner.updates == [] and learner.saved == [1, 2]
    assert str(info.value) == (
        "stopped at step 3: 3 steps in a row had no episode to train on "
        "(train.max_failed_steps=3); the last one's episodes: context_limit 4; error: the first "
        "prompt takes 60 of the 64 tokens of the context: fewer than 8 are left to generate; "
        f"once that is fixed, the same command resumes from the checkpoint of step 2 (workdir "
        f"{tmp_path})")


# ------------------------------------------------------------------ SIGTERM in an evaluation
class SigtermInEvalPool(FailingPool):
    """Training rollouts as FailingPool's; the ``nth`` evaluation sends this process SIGTERM
    (only where the run catches it: the default action would end the test run) and waits."""

    def __init__(self, nth: int = 1):
        super().__init__(failing=())
        self.nth, self.evals = nth, 0

    async def collect(self, tasks, n_samples, horizon, policy_version=0, seed=None,
                      progress=None, version_fn=None, lockstep=False):
        if version_fn is not None:  # a training rollout
            return await super().collect(tasks, n_samples, horizon, policy_version, seed,
                                         progress, version_fn, lockstep)
        self.evals += 1
        if self.evals == self.nth:
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None), \
                "SIGTERM is not caught during this evaluation: it would end the run silently"
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.sleep(60)  # cancelled by the run's SIGTERM handler
            raise AssertionError("the evaluation was not cancelled by SIGTERM")
        return await super().collect(tasks, n_samples, horizon, policy_version, seed,
                                     progress, version_fn, lockstep)


def _eval_loop(tmp_path, pool, eval_before: bool):
    c = fake_loop_config(2, save_every=1)
    c.train.eval_after = True
    c.train.eval_before = eval_before
    c.train.eval_samples = 1
    trainer = Trainer(c, str(tmp_path), progress=False)
    learner = RecordingLearner()
    sampler = TaskSampler([TaskRef("babyai", str(i)) for i in range(20)], seed=0)
    asyncio.run(trainer.train(learner, RecordingBackend(), pool, sampler,
                              [TaskRef("babyai", "t0"), TaskRef("babyai", "t1")], 0))
    return trainer, learner


def test_sigterm_during_the_final_evaluation_stops_with_one_line(tmp_path):
    pool = SigtermInEvalPool(nth=1)
    trainer, learner = _eval_loop(tmp_path, pool, eval_before=False)
    assert pool.rollouts == 2 and learner.saved == [1, 2]
    assert trainer.stopped == "terminated" and trainer.evals == []
    assert trainer.terminated_message() == (
        f"stopped by SIGTERM during the final evaluation at step 2/2; the same command "
        f"evaluates the checkpoint of step 2 again (workdir {tmp_path})")
    summary = json.load(open(tmp_path / "summary.json"))
    assert "finished_step" not in summary  # started again, the run evaluates step 2
    assert summary["sessions"][-1]["stopped"] == "terminated"
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # the handler is gone after


def test_sigterm_during_the_opening_evaluation_stops_before_any_step(tmp_path):
    pool = SigtermInEvalPool(nth=1)
    trainer, learner = _eval_loop(tmp_path, pool, eval_before=True)
    assert pool.rollouts == 0 and learner.saved == [] and trainer.stopped == "terminated"
    assert trainer.terminated_message() == (
        f"stopped by SIGTERM during the evaluation at step 0, after step 0/2, without the "
        f"final evaluation; the same command starts it again (workdir {tmp_path})")


# ------------------------------------------------------------------ servers that do not answer
def test_environment_servers_that_cannot_list_their_tasks_are_one_line(tmp_path):
    from environments.core.client import EnvConnectionError

    class Unreachable:
        async def tasks(self, split):
            raise EnvConnectionError("GET http://127.0.0.1:9/tasks failed: TimeoutError: ")

    trainer = Trainer(_smoke(), str(tmp_path), progress=False)
    with pytest.raises(RunFailure) as info:
        asyncio.run(trainer._task_lists({"babyai": Unreachable()}))
    assert str(info.value) == (
        "cannot list the tasks of the environment servers: GET http://127.0.0.1:9/tasks "
        "failed: TimeoutError:  (env.timeout=120 s); nothing was trained "
        f"(workdir {tmp_path})")

    class Listing:
        async def tasks(self, split):
            return ["GoTo/1", "GoTo/2"]

    c = _smoke()
    c.env.task_filter = {"babyai": "Pickup/.*"}
    trainer = Trainer(c, str(tmp_path), progress=False)
    with pytest.raises(RunFailure) as info:
        asyncio.run(trainer._task_lists({"babyai": Listing()}))
    assert str(info.value) == (
        "cannot list the tasks of the environment servers: env.task_filter.babyai "
        "('Pickup/.*') keeps none of the 2 train tasks of babyai; nothing was trained "
        f"(workdir {tmp_path})")


def test_an_engine_without_room_for_its_kv_cache_is_one_line(tmp_path, monkeypatch):
    """The engine's KV-cache check (tests/test_kv_memory_fit.py) reaches the trainer as a
    ``RunFailure`` (exit code 3, one line) before any step."""
    from agentrl_jax.rollout.engine import kv_memory
    from agentrl_jax.training.runtime.policy import load_policy

    config = _smoke()
    policy, tokenizer, model_path = load_policy(config)
    monkeypatch.setattr(kv_memory, "free_device_bytes", lambda devices: (2**20, 2**30))
    trainer = Trainer(config, str(tmp_path), progress=False)
    with pytest.raises(RunFailure) as info:
        trainer._start_backend(policy, tokenizer, model_path)
    message = str(info.value)
    assert message.startswith("cannot start the rollout engine: the engine's KV cache needs ")
    assert "but this process has 0.0 GiB of its 1.0 GiB left" in message
    assert message.endswith(f"; nothing was trained (workdir {tmp_path})")
