"""Multiple-choice actions (``rollout.parser = "choice"``) and per-environment task filters.

The parser against hand-written replies; an episode on a real BabyAI server with a scripted
backend, checked against ``BabyAIEnv`` itself (the options shown are the environment's own
available actions, the chosen letter steps the environment with that option); the task filter
against a fake task list and the config check.
"""

from __future__ import annotations

import re

import pytest

from fake_backends import GO_TO_RED_BALL, ScriptedBackend, choice_episode
from agentrl_jax.agent.parsing import (INVALID_FORMAT_FEEDBACK, get_parser, options_block,
                                       parse_choice, takes_options)
from agentrl_jax.models.pretrained import resolve_model_path
from agentrl_jax.models.tokenizer import load_tokenizer
from agentrl_jax.training.runtime import services
from agentrl_jax.training.config.experiment import base_config, to_run_config
from agentrl_jax.training.preflight.validate import ConfigError, check_config
from environments.babyai.env import BabyAIEnv

pytestmark = pytest.mark.timeout(120)

OPTIONS = ["turn left", "turn right", "go to red ball 1"]


@pytest.mark.parametrize("text, action", [
    ("Action: a", "turn left"),
    ("Action: B", "turn right"),
    ("Action:c)", "go to red ball 1"),
    ("Action: bread and butter", "turn right"),  # only the first letter counts
    ("c", "go to red ball 1"),  # no marker: the whole reply
    ("Action: x\nAction: a", "turn left"),  # the last marker, as for react
])
def test_choice_parser_maps_the_first_letter_to_the_option(text, action):
    parsed = parse_choice(text, OPTIONS)
    assert parsed.action == action and OPTIONS[parsed.option] == action


def test_equal_option_texts_keep_the_letter_named():
    parsed = parse_choice("Action: c", ["go", "turn", "go"])
    assert parsed.action == "go" and parsed.option == 2  # not the first "go"


@pytest.mark.parametrize("text, options, error", [
    ("Action: d", OPTIONS, "no option 'd' (options a to c)"),
    ("Action: 2", OPTIONS, "the reply starts with '2', not an option letter"),
    ("Action: é", OPTIONS, "the reply starts with 'é', not an option letter"),
    ("Action:   ", OPTIONS, "empty reply"),
    ("Action: a", [], "no options were listed"),
])
def test_choice_parser_rejects_replies_that_name_no_option(text, options, error):
    parsed = parse_choice(text, options)
    assert parsed.action is None and parsed.error == error and parsed.option is None


def test_options_block_and_registry():
    assert options_block(OPTIONS) == "Options: a) turn left, b) turn right, c) go to red ball 1"
    many = [f"o{i}" for i in range(30)]  # 26 letters: the rest cannot be named
    assert options_block(many).endswith("z) o25") and parse_choice("Action: z", many).action == "o25"
    assert get_parser("choice") is parse_choice and takes_options(parse_choice)
    assert not takes_options(get_parser("react"))


async def test_episode_shows_the_options_and_steps_the_chosen_one(babyai):
    reference = BabyAIEnv()  # the same task, played by hand: turn left, turn right, go to ball
    options0 = reference.reset(GO_TO_RED_BALL).info["available_actions"]
    assert options0[:4] == ["turn left", "turn right", "move forward", "go to red ball 1"]
    options1 = reference.step("turn left").info["available_actions"]
    options2 = reference.step("turn right").info["available_actions"]
    finish = reference.step("go to red ball 1")
    assert finish.done and finish.info["success"] and finish.reward > 0

    tokenizer = load_tokenizer(resolve_model_path("smollm2"))
    # "z" names no option (the environment is not stepped), "a" = turn left, "b" = turn right,
    # "d" = go to red ball 1 (its letter in options2, the same view as at the start)
    backend = ScriptedBackend(tokenizer, [" z", " a", " bread", " d"], logprob=-1.0)
    traj = await choice_episode(babyai.url, backend, tokenizer, horizon=6, max_new_tokens=4)
    assert options2[3] == "go to red ball 1"
    users = [m["content"] for m in traj.messages if m["role"] == "user"]
    assert users[0].endswith("\n" + options_block(options0))
    assert users[1] == INVALID_FORMAT_FEEDBACK + "\n" + options_block(options0)
    assert users[2].endswith("\n" + options_block(options1))
    assert users[3].endswith("\n" + options_block(options2))
    assert len(users) == 4  # the last observation (episode over) gets no options
    assert "reply with its letter" in traj.messages[0]["content"]
    assert traj.num_turns == 4 and traj.invalid_actions == 1
    assert traj.turn_rewards == [0.0, 0.0, 0.0, pytest.approx(finish.reward)]
    assert traj.success and traj.status == "done"
    # every prompt the backend saw ends with the response prefix after the options
    assert all(tokenizer.decode(p).endswith("Action:") for p in backend.prompts)


class _Tasks:
    def __init__(self, ids):
        self.ids = ids

    async def tasks(self, split):
        return self.ids


async def test_task_filter_keeps_matching_ids_in_full():
    ids = [f"L{i % 3}/seed={i}" for i in range(12)]  # L0, L1, L2 interleaved
    config = base_config()
    config.env.names = "babyai,textcraft"
    config.env.task_filter = {"babyai": r"L1/seed=[0-9]+"}
    filters = services.task_filters(to_run_config(config))
    refs = await services.task_refs({"babyai": _Tasks(ids), "textcraft": _Tasks(ids[:2])}, "train",
                                    filters=filters)
    assert [r.task_id for r in refs if r.env == "babyai"] == [t for t in ids if t.startswith("L1/")]
    assert [r.task_id for r in refs if r.env == "textcraft"] == ids[:2]  # no filter: all
    limited = await services.task_refs({"babyai": _Tasks(ids)}, "test", 2, filters=filters)
    assert [r.task_id for r in limited] == ["L1/seed=1", "L1/seed=7"]  # evenly spaced
    config.env.task_filter = {"babyai": "L1"}  # a full match is needed: "L1" alone keeps nothing
    with pytest.raises(ValueError, match=re.escape("env.task_filter.babyai ('L1') keeps none of "
                                                   "the 12 train tasks of babyai")):
        await services.task_refs({"babyai": _Tasks(ids)}, "train",
                                 filters=services.task_filters(to_run_config(config)))


@pytest.mark.parametrize("given, message", [
    ({"textcraft": ".*"}, "env.task_filter.textcraft: names no environment of env.names"),
    ({"babyai": "BabyAI-(GoTo"}, "env.task_filter.babyai: is not a regular expression"),
    ({"babyai": 3}, "env.task_filter.babyai: must be a regular expression string"),
])
def test_bad_task_filters_are_refused(given, message):
    config = base_config()
    config.model.random_init = dict(hidden_size=64, intermediate_size=128, num_layers=2,
                                    num_heads=4, num_kv_heads=2, head_dim=16)
    config.env.task_filter = given
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_config(config)
