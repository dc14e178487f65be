"""The BabyAI macro expert (``environments/babyai/macro_expert.py``): a copy of the text
environment is an independent episode, the macro plan replayed on a fresh environment solves
what the bot's primitives solve in fewer turns, and the recorder acts with it by name."""

from __future__ import annotations

import copy
import json
import os

import pytest

from environments.babyai.env import BabyAIEnv
from environments.babyai.macro_expert import MACRO_PREFIXES, bot_solution, macro_plan

pytestmark = pytest.mark.timeout(300)

# train tasks of levels with objects to go to, pick up and put next to, doors and a maze
TASKS = ("BabyAI-GoToLocal-v0/seed=3", "BabyAI-PickupLoc-v0/seed=5",
         "BabyAI-PutNextLocalS5N3-v0/seed=2", "BabyAI-GoToObjMaze-v0/seed=4",
         "BabyAI-OpenDoor-v0/seed=1", "BabyAI-UnlockLocal-v0/seed=6")


def _replay(task_id: str, actions) -> tuple[bool, list[str]]:
    """Play ``actions`` on a fresh environment: (solved, the observations)."""
    env = BabyAIEnv()
    observations = [env.reset(task_id).observation]
    solved = False
    for action in actions:
        result = env.step(action)
        observations.append(result.observation)
        assert not result.info["invalid_action"], (task_id, action)
        if result.done or result.truncated:
            solved = bool(result.done and result.info["success"])
            break
    env.close()
    return solved, observations


def test_a_copy_of_the_environment_is_an_independent_episode():
    env = BabyAIEnv()
    env.reset(TASKS[0])
    env.step("turn left")
    key = env.state_key()
    trial = copy.deepcopy(env)
    assert trial.state_key() == key and trial.available_actions() == env.available_actions()
    macro = next(a for a in trial.available_actions() if a.startswith("go to "))
    moved = trial.step(macro)
    assert trial.state_key() != key and env.state_key() == key  # the original did not move
    again = env.step(macro)  # the same action on the original: the same outcome
    assert again.observation == moved.observation and env.state_key() == trial.state_key()


@pytest.mark.parametrize("task_id", TASKS)
def test_the_plan_solves_what_the_bot_solves_in_fewer_turns(task_id):
    plan = macro_plan(task_id)
    primitives, bot_solved = bot_solution(task_id)
    assert list(plan.primitives) == primitives and plan.bot_solved == bot_solved
    assert _replay(task_id, primitives)[0] == bot_solved  # the bot's own path, independently
    solved, _ = _replay(task_id, plan.actions)
    assert solved == plan.solved
    if bot_solved:
        assert solved and len(plan.actions) <= len(primitives)


def test_macros_shorten_the_bot_overall():
    plans = [macro_plan(t) for t in TASKS]
    assert all(p.solved for p in plans)
    assert sum(len(p.actions) for p in plans) < 0.6 * sum(len(p.primitives) for p in plans)
    assert sum(a.startswith(MACRO_PREFIXES) for p in plans for a in p.actions) >= len(TASKS)


def test_the_recorder_acts_with_the_macro_expert_by_name(tmp_path):
    from experiments.smoke import sft as get_config

    from agentrl_jax.training.config.experiment import to_run_config
    from agentrl_jax.training.jobs.record_experts import record_experts_sync

    c = get_config()
    c.env.names = "babyai"
    c.rollout.max_context = 8192  # the smoke config's 1,024 cuts the bot's longer episodes
    quiet = dict(horizon=64, say=lambda *a, **k: None)
    run = to_run_config(c)
    meta = record_experts_sync(run, "babyai", 3, str(tmp_path / "macro"), expert="babyai_macro",
                               **quiet)
    assert meta["expert"] == "babyai_macro" and meta["successful"] == 3
    with open(tmp_path / "macro" / "babyai.jsonl") as f:
        episodes = [json.loads(line) for line in f]
    for ep in episodes:  # the recorded actions are the plan's, turn by turn
        said = [m["content"].split("Action:", 1)[-1].strip()
                for m in ep["messages"] if m["role"] == "assistant"]
        assert said == list(macro_plan(ep["task_id"]).actions), ep["task_id"]
    bot = record_experts_sync(run, "babyai", 3, str(tmp_path / "bot"), **quiet)
    assert bot["expert"] == "babyai" and bot["successful"] == 3
    assert meta["mean_turns_successful"] < bot["mean_turns_successful"]
    with pytest.raises(ValueError, match="no expert 'nope'"):
        record_experts_sync(run, "babyai", 1, str(tmp_path / "x"), expert="nope", **quiet)
    assert not os.path.exists(tmp_path / "x" / "babyai.jsonl")
    # the config's sft.expert is the default; an explicit --expert still wins
    c.sft.expert = "babyai_macro"
    run = to_run_config(c)
    by_config = record_experts_sync(run, "babyai", 1, str(tmp_path / "cfg"), **quiet)
    assert by_config["expert"] == "babyai_macro"
    with open(tmp_path / "cfg" / "babyai.jsonl") as f:
        ep = json.loads(f.readline())
    said = [m["content"].split("Action:", 1)[-1].strip()
            for m in ep["messages"] if m["role"] == "assistant"]
    assert said == list(macro_plan(ep["task_id"]).actions)
    assert record_experts_sync(run, "babyai", 1, str(tmp_path / "own"), expert="babyai",
                               **quiet)["expert"] == "babyai"


def test_an_expert_of_one_environment_never_records_another():
    from agentrl_jax.training.jobs.record_experts import resolve_expert

    assert resolve_expert("babyai", None) == "babyai"
    assert resolve_expert("babyai", "babyai_macro") == "babyai_macro"
    with pytest.raises(ValueError, match="not an expert of environment 'textcraft'"):
        resolve_expert("textcraft", "babyai_macro")
    with pytest.raises(ValueError, match="no expert 'nope'"):
        resolve_expert("babyai", "nope")
