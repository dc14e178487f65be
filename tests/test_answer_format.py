"""The default answer format and the per-turn counts of benchmarks/analysis/action_format.py,
on hand-built cases."""

from __future__ import annotations

import importlib.util
import os
import sys

from agentrl_jax.agent.parsing import parse_react
from agentrl_jax.agent.prompts import system_prompt
from agentrl_jax.agent.trajectory import Trajectory
from agentrl_jax.training.config.experiment import base_config, to_run_config, use_react
from agentrl_jax.training.runtime.services import make_sampling, stop_strings

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _benchmark():
    spec = importlib.util.spec_from_file_location(
        "action_format", os.path.join(REPO, "benchmarks", "analysis", "action_format.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_default_is_one_action_line_and_react_is_one_call_away():
    c = base_config()
    assert (c.agent.prompt_style, c.agent.response_prefix) == ("action", "Action:")
    sampling = make_sampling(to_run_config(c))
    assert sampling.max_new_tokens == 24 and sampling.stop == ["\n"]
    use_react(c)
    assert (c.agent.prompt_style, c.agent.response_prefix) == ("react", "")
    sampling = make_sampling(to_run_config(c))
    assert sampling.max_new_tokens == 128 and sampling.stop is None


def test_stop_strings():
    assert stop_strings(("\n",)) == ["\n"]
    assert stop_strings(["\n", "Observation:"]) == ["\n", "Observation:"]
    assert stop_strings("\n") == ["\n"]
    assert stop_strings(()) is None and stop_strings("") is None and stop_strings(None) is None
    assert stop_strings(("", "x")) == ["x"]


def test_a_prefixed_turn_parses_to_its_first_line():
    # the episode parses response_prefix + the generated text
    assert parse_react("Action:" + " go to red ball 1\n").action == "go to red ball 1"
    assert parse_react("Action:" + " pickup\nThe ball is red.").action == "pickup"
    assert parse_react("Action:" + "\n").action is None  # an empty action is invalid


def _trajectory(replies: list[str], generated_per_turn: list[int], invalid: int) -> Trajectory:
    t = Trajectory(env="babyai", task_id="t", group_id=0, sample_index=0)
    t.append([1, 2, 3], generated=False, turn=-1)
    t.messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "o"}]
    for turn, (reply, n) in enumerate(zip(replies, generated_per_turn)):
        t.append(list(range(n)), generated=True, turn=turn)
        t.append([9, 9], generated=False, turn=turn)
        t.messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "o"}]
    t.num_turns, t.invalid_actions = len(replies), invalid
    return t


def test_benchmark_counts_turns():
    bench = _benchmark()
    # turn 1 parsable and accepted; turn 2 unparsable and capped (24 tokens); turn 3 parsable
    # but refused by the environment: invalid_actions = 1 unparsable + 1 refused
    t = _trajectory(["Action: turn left", "I think so", "Action: fly"], [5, 24, 3], invalid=2)
    assert bench.turn_token_counts(t) == [5, 24, 3]
    stats = bench.FormatStats("x")
    bench.count_turns(stats, [t], parse_react, max_new_tokens=24)
    assert (stats.episodes, stats.turns, stats.parsable, stats.accepted, stats.capped,
            stats.generated_tokens) == (1, 3, 2, 1, 1, 32)
    failed = _trajectory(["Action: x"], [2], invalid=0)
    failed.status = "env_error"  # error episodes are not counted
    bench.count_turns(stats, [failed], parse_react, max_new_tokens=24)
    assert stats.turns == 3 and stats.rate(stats.parsable) == 2 / 3


def test_action_prompt_examples_belong_to_the_environment():
    babyai = system_prompt("Go to the ball.", "babyai", "action")
    assert babyai == ("You are an agent acting in the babyai environment.\nGo to the ball.\n\n"
                      "Each turn, reply with exactly one action, in this format:\n"
                      "Action: <the action>\nFor example:\nAction: turn left")
    textcraft = system_prompt("Craft.", "textcraft", "action")
    assert textcraft.endswith("Action: get 1 oak log") and "turn left" not in textcraft
    assert system_prompt("Click.", "miniwob", "action").endswith("Action: <the action>")
    assert "For example" not in system_prompt("Go.", "babyai", "react")
