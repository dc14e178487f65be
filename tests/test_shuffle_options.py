"""Shuffled options (``agent.shuffle_options``): a lettered-choice turn lists the environment's
options in the order ``parsing.option_order(options, seed)``, a function of the option list and
the rollout's base seed only; the reply's letter names the option shown at it.

References: the permutations below were derived once from the formula in ``option_order``'s
docstring (CRC-32 salt over the joined list started from the seed, then each option's CRC-32
started from the salt, indices sorted by key) in a separate Python shell and are written here as
literals, so a salted or changed hash fails; the options block text is written by hand.
"""

from __future__ import annotations

import asyncio
import re

import pytest
from fake_backends import ScriptedBackend

from agentrl_jax.agent.actor_pool import ActorPool, TaskRef
from agentrl_jax.agent.chat import ChatFormatter
from agentrl_jax.agent.parsing import get_parser, option_order, shuffled_options
from agentrl_jax.rollout.contract import SamplingParams
from agentrl_jax.training.config.experiment import (
    ConfigError,
    base_config,
    to_run_config,
)
from agentrl_jax.training.evaluation.held_out import evaluate
from environments.core.base import StepResult

#: the options of task "A" and of task "B" (deep-search-like: a fixed structure, searches first)
OPTIONS_A = ["<search> Ada Lovelace </search>", "<search> analytical engine </search>",
             "<answer> Charles Babbage </answer>", "<answer> 1843 </answer>"]
OPTIONS_B = ["<search> Ada Lovelace </search>", "<search> Charles Babbage </search>",
             "<answer> Ada Lovelace </answer>", "<answer> 1815 </answer>"]
#: option_order(OPTIONS_A, 7) and option_order(OPTIONS_B, 7), derived once by hand (module doc)
ORDER_A_7 = [3, 1, 2, 0]
ORDER_B_7 = [2, 3, 0, 1]
SEED = 7


class ListingEnv:
    """Lists ``OPTIONS_A`` (task "A") or ``OPTIONS_B`` (task "B") in every state; records each
    action it is stepped with; an episode ends after its second step."""

    def __init__(self):
        self.n, self.tasks, self.steps = 0, {}, {}
        self.actions: list[tuple[str, str]] = []  # (task, action), in step order

    def _info(self, task: str) -> dict:
        return {"instructions": "Pick one.", "listed_actions": list(
            OPTIONS_A if task == "A" else OPTIONS_B)}

    async def create(self, task_id=None, seed=None):
        self.n += 1
        env_id = f"e{self.n}"
        self.tasks[env_id], self.steps[env_id] = task_id, 0
        return env_id, f"Question of task {task_id}.", self._info(task_id)

    async def step(self, env_id, action):
        task = self.tasks[env_id]
        self.actions.append((task, action))
        self.steps[env_id] += 1
        done = self.steps[env_id] >= 2
        return StepResult(observation="Searched.", reward=0.0, done=done, truncated=False,
                          info=self._info(task))

    async def close(self, env_id):
        return True


def _pool(tokenizer, backend, env, shuffle: bool, workers: int = 0) -> ActorPool:
    return ActorPool(backend, {"fake": env}, ChatFormatter(tokenizer),
                     SamplingParams(max_new_tokens=1), max_context=4096, max_concurrency=8,
                     parser=get_parser("choice"), prompt_style="choice",
                     response_prefix="Action:", history_turns=0, history_stride=1,
                     option_limits=True, shuffle_options=shuffle, workers=workers)


def _block(options: list[str]) -> str:
    return "Options: " + ", ".join(f"{'abcd'[i]}) {o}" for i, o in enumerate(options))


def _first_user(traj) -> str:
    return traj.messages[1]["content"]


def test_the_order_is_the_documented_formula_and_stable_across_processes():
    assert option_order(OPTIONS_A, SEED) == ORDER_A_7
    assert option_order(OPTIONS_B, SEED) == ORDER_B_7
    # the docstring's example, also derived once by hand
    assert option_order(["turn left", "turn right", "go forward"], 0) == [1, 2, 0]
    assert shuffled_options(OPTIONS_A, SEED) == [OPTIONS_A[i] for i in ORDER_A_7]
    assert option_order([], SEED) == []
    # a permutation even with repeated options
    assert sorted(option_order(["x", "x", "y"], 3)) == [0, 1, 2]


def test_shuffled_turns_show_a_permutation_and_the_letter_acts_on_the_shown_option(tokenizer):
    env = ListingEnv()
    backend = ScriptedBackend(tokenizer, " a", eos=False)
    pool = _pool(tokenizer, backend, env, shuffle=True)
    trajectories, _ = asyncio.run(pool.collect([TaskRef("fake", "A")], 1, horizon=4, seed=SEED))
    (traj,) = trajectories
    shown = [OPTIONS_A[i] for i in ORDER_A_7]
    assert sorted(shown) == sorted(OPTIONS_A) and shown != OPTIONS_A
    assert _first_user(traj).endswith(_block(shown))
    # "a" is the option shown first, <answer> 1843 </answer>, not the env's first (a search)
    assert env.actions == [("A", "<answer> 1843 </answer>")] * 2
    assert traj.num_turns == 2 and traj.status == "done"
    # the later observations show the same state's order again; option limits count 4 a turn
    assert traj.messages[3]["content"].endswith(_block(shown))
    assert [s.option_count for s in backend.sampling] == [4, 4]
    # the picks: letter a (shown index 0) is the environment's option 3 (ORDER_A_7[0])
    assert traj.letter_picks == [0, 0] and traj.option_picks == [ORDER_A_7[0]] * 2 == [3, 3]


def test_unshuffled_turns_keep_the_environment_order(tokenizer):
    env = ListingEnv()
    backend = ScriptedBackend(tokenizer, " a", eos=False)
    pool = _pool(tokenizer, backend, env, shuffle=False)
    trajectories, _ = asyncio.run(pool.collect([TaskRef("fake", "A")], 1, horizon=4, seed=SEED))
    assert _first_user(trajectories[0]).endswith(_block(OPTIONS_A))
    assert env.actions == [("A", OPTIONS_A[0])] * 2
    assert trajectories[0].letter_picks == trajectories[0].option_picks == [0, 0]


def test_a_reply_that_names_no_option_is_recorded_as_minus_one(tokenizer):
    env = ListingEnv()
    backend = ScriptedBackend(tokenizer, " z", eos=False)  # past the fourth option, "d"
    pool = _pool(tokenizer, backend, env, shuffle=True)
    trajectories, _ = asyncio.run(pool.collect([TaskRef("fake", "A")], 1, horizon=3, seed=SEED))
    (traj,) = trajectories
    assert env.actions == [] and traj.parse_failures == traj.num_turns == 3
    assert traj.letter_picks == traj.option_picks == [-1, -1, -1]


def test_a_group_shares_one_order_and_another_list_gets_another(tokenizer):
    env = ListingEnv()
    backend = ScriptedBackend(tokenizer, " b", eos=False)
    pool = _pool(tokenizer, backend, env, shuffle=True)
    tasks = [TaskRef("fake", "A"), TaskRef("fake", "B")]
    trajectories, _ = asyncio.run(pool.collect(tasks, 3, horizon=4, seed=SEED))
    by_task: dict[str, list] = {}
    for t in trajectories:
        by_task.setdefault(t.task_id, []).append(t)
    for task, order, options in (("A", ORDER_A_7, OPTIONS_A), ("B", ORDER_B_7, OPTIONS_B)):
        group = by_task[task]
        assert len(group) == 3 and len({t.sample_index for t in group}) == 3
        # identical first prompts within the group (the engine shares them)
        first = [t.token_ids[:t.prompt_length] for t in group]
        assert all(ids == first[0] for ids in first)
        assert _first_user(group[0]).endswith(_block([options[i] for i in order]))
    assert ORDER_A_7 != ORDER_B_7
    # "b": the second shown option of each task
    assert sorted(env.actions) == sorted([("A", OPTIONS_A[ORDER_A_7[1]])] * 6
                                         + [("B", OPTIONS_B[ORDER_B_7[1]])] * 6)
    # the engine was given the same first prompt by every sample of a group
    firsts: dict[tuple[int, ...], int] = {}
    for calls in backend.calls.values():
        firsts[tuple(calls[0][0])] = firsts.get(tuple(calls[0][0]), 0) + 1
    assert sorted(firsts.values()) == [3, 3]


def test_the_order_follows_the_rollout_seed_not_the_sample(tokenizer):
    env = ListingEnv()
    pool = _pool(tokenizer, ScriptedBackend(tokenizer, " a", eos=False), env, shuffle=True)
    other = option_order(OPTIONS_A, 8)
    assert other != ORDER_A_7
    trajectories, _ = asyncio.run(pool.collect([TaskRef("fake", "A")], 2, horizon=1, seed=8))
    for t in trajectories:
        assert _first_user(t).endswith(_block([OPTIONS_A[i] for i in other]))


def test_evaluation_shows_the_same_order(tokenizer):
    env = ListingEnv()
    pool = _pool(tokenizer, ScriptedBackend(tokenizer, " a", eos=False), env, shuffle=True)
    _, trajectories = asyncio.run(evaluate(pool, [TaskRef("fake", "A")], k=2, horizon=2,
                                           seed=SEED))
    assert len(trajectories) == 2
    for t in trajectories:
        assert _first_user(t).endswith(_block([OPTIONS_A[i] for i in ORDER_A_7]))


def test_worker_processes_get_the_setting(tokenizer, monkeypatch):
    from agentrl_jax.agent import workers

    made = []
    monkeypatch.setattr(workers, "WorkerGroup", lambda n, setup: made.append(setup) or object())

    class WithConfig(ListingEnv):
        def config(self):
            return {"url": "http://127.0.0.1:1"}

    for shuffle in (True, False):
        pool = _pool(tokenizer, ScriptedBackend(tokenizer, " a"), WithConfig(), shuffle,
                     workers=1)
        pool._worker_group()
        assert made[-1].shuffle_options is shuffle


def _choice_config():
    config = base_config()
    config.rollout.parser = "choice"
    config.agent.prompt_style = "choice"
    config.agent.shuffle_options = True
    return config


def test_config_takes_the_setting_with_the_choice_parser_only(tokenizer):
    assert not to_run_config(base_config()).agent.shuffle_options  # off by default
    assert to_run_config(_choice_config()).agent.shuffle_options
    config = _choice_config()
    config.rollout.parser = "react"
    with pytest.raises(ConfigError, match=re.escape(
            "agent.shuffle_options: needs rollout.parser='choice'")):
        to_run_config(config)
    from agentrl_jax.training.runtime import services

    for shuffle in (True, False):
        config = _choice_config()
        config.agent.shuffle_options = shuffle
        pool = services.make_actor_pool(to_run_config(config), object(), {}, tokenizer)
        assert pool.shuffle_options is shuffle


def test_the_deep_search_variant_differs_from_choice_gpu_by_the_shuffle_alone():
    from experiments import deepsearch

    plain = to_run_config(deepsearch.get_config("choice_gpu")).to_dict()
    shuffled = to_run_config(deepsearch.get_config("choice_shuffled_gpu")).to_dict()
    assert shuffled["agent"]["shuffle_options"] and not plain["agent"]["shuffle_options"]
    shuffled["agent"]["shuffle_options"] = False
    assert shuffled == plain
