"""The default answer format and the per-turn counts of benchmarks/analysis/action_format.py,
on hand-built cases."""

from __future__ import annotations

import asyncio
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


def test_benchmark_scores_the_task_reward_and_counts_flat_groups():
    bench = _benchmark()
    # two tasks x 2 episodes: task a's returns 0.3 (evidence, wrong) and 0.0; task b's 0.15 and
    # 0.15 (both wrong after one article: flat for the trainer too); one correct episode 1.15
    rewards = {("a", 0): (0.3, 0.3), ("a", 1): (0.0, 0.0), ("b", 0): (0.15, 0.15),
               ("b", 1): (0.15, 0.15), ("c", 0): (1.15, 0.15)}
    episodes = []
    for (task, sample), (reward, shaping) in rewards.items():
        t = _trajectory(["Action: x"], [1], invalid=0)
        t.task_id, t.sample_index, t.reward, t.shaping = task, sample, reward, shaping
        episodes.append(t)
    stats = bench.FormatStats("x")
    bench.count_turns(stats, episodes, parse_react, max_new_tokens=24)
    assert [e[1] for e in stats.episode_scores] == [0.0, 0.0, 0.0, 0.0, 1.0]
    assert stats.score_sum == 1.0 and stats.scored == 1 and stats.shaped == 4
    assert abs(stats.return_sum - 1.75) < 1e-12
    assert stats.episode_shaping == [0.3, 0.0, 0.15, 0.15, 0.15]
    # groups of >= 2: a (returns differ) and b (flat); by the task score both are flat
    assert bench.flat_groups(stats.episode_scores, stats.episode_shaping) == (2, 2, 1)


def test_action_prompt_examples_belong_to_the_environment():
    babyai = system_prompt("Go to the ball.", "babyai", "action")
    assert babyai == ("You are an agent acting in the babyai environment.\nGo to the ball.\n\n"
                      "Each turn, reply with exactly one action, in this format:\n"
                      "Action: <the action>\nFor example:\nAction: turn left")
    textcraft = system_prompt("Craft.", "textcraft", "action")
    assert textcraft.endswith("Action: get 1 oak log") and "turn left" not in textcraft
    assert system_prompt("Click.", "miniwob", "action").endswith("Action: <the action>")
    assert "For example" not in system_prompt("Go.", "babyai", "react")


def test_benchmark_example_action_replaces_the_family_example_within_its_block():
    bench = _benchmark()
    fmt = "Each turn, reply with exactly one action, in this format:\nAction: <the action>"
    with bench.example_action("turn left"):  # the prompt every family had before 2026-11-26
        assert system_prompt("Craft.", "textcraft", "action") == (
            "You are an agent acting in the textcraft environment.\nCraft.\n\n"
            f"{fmt}\nFor example:\nAction: turn left")
        assert "For example" not in system_prompt("Craft.", "textcraft", "react")
    with bench.example_action(""):
        assert system_prompt("Craft.", "textcraft", "action").endswith(fmt)
    with bench.example_action(None):
        assert system_prompt("Craft.", "textcraft", "action").endswith("Action: get 1 oak log")
    try:
        with bench.example_action("turn left"):
            raise RuntimeError
    except RuntimeError:
        pass
    assert system_prompt("Craft.", "textcraft", "action").endswith("Action: get 1 oak log")


def test_benchmark_episode_record_keeps_the_counts_and_messages():
    bench = _benchmark()
    t = _trajectory(["Action: turn left", "I think so"], [5, 24], invalid=2)
    t.parse_failures, t.status, t.reward = 1, "max_turns", 0.0
    record = bench.episode_record("action", t)
    assert record == {"style": "action", "task_id": "t", "status": "max_turns", "reward": 0.0,
                      "shaping": 0.0, "success": False, "num_turns": 2, "invalid_actions": 2, "parse_failures": 1,
                      "messages": t.messages}
    assert [m["content"] for m in record["messages"] if m["role"] == "assistant"] == [
        "Action: turn left", "I think so"]


def _choice_trajectory() -> Trajectory:
    """Three choice turns, by hand: turn 1 names option b of three (accepted: the env steps
    "go to red ball 1"), turn 2 names c of two (unparsable: no option c), turn 3 starts with no
    letter (unparsable); 2 + 1 + 1 generated tokens, reward 0.25, 40 tokens in all."""
    t = Trajectory(env="babyai", task_id="t", group_id=0, sample_index=0)
    t.append(list(range(30)), generated=False, turn=-1)
    t.messages = [{"role": "system", "content": "s"},
                  {"role": "user", "content": "You see a ball.\nOptions: a) turn left, "
                   "b) go to red ball 1, c) pick up, the key"}]
    for turn, (reply, n, observation) in enumerate([
            ("Action: b)", 2, "Nothing.\nOptions: a) turn right, b) drop"),
            ("Action: c", 1, "Invalid.\nOptions: a) turn right, b) drop"),
            ("Action: 7", 1, "Invalid.\nOptions: a) turn right, b) drop")]):
        t.append(list(range(n)), generated=True, turn=turn)
        t.append([9, 9], generated=False, turn=turn)
        t.messages += [{"role": "assistant", "content": reply},
                       {"role": "user", "content": observation}]
    t.num_turns, t.invalid_actions, t.reward, t.status = 3, 2, 0.25, "max_turns"
    return t


def test_listed_options_read_back_the_options_block():
    bench = _benchmark()
    from agentrl_jax.agent.parsing import options_block

    options = ["turn left", "go to red ball 1", "pick up, the key"]
    assert bench.listed_options("obs\n" + options_block(options)) == options
    assert bench.listed_options("You see a ball.") == []
    assert bench.listed_options("Options: x") == []
    many = [f"open door {i}" for i in range(30)]  # 26 letters: the first 26 are listed
    assert bench.listed_options(options_block(many)) == many[:26]


def test_benchmark_counts_choice_turns_against_their_options():
    bench = _benchmark()
    from agentrl_jax.agent.parsing import parse_choice

    t = _choice_trajectory()
    assert [opts for _, opts in bench.replies_with_options(t)] == [
        ["turn left", "go to red ball 1", "pick up, the key"],
        ["turn right", "drop"], ["turn right", "drop"]]
    stats = bench.FormatStats("choice")
    bench.count_turns(stats, [t], parse_choice, max_new_tokens=2)
    assert (stats.episodes, stats.turns, stats.parsable, stats.accepted, stats.capped,
            stats.generated_tokens) == (1, 3, 1, 1, 1, 4)
    assert (stats.score_sum, stats.scored, stats.completed) == (0.25, 1, 0)
    assert (stats.context_tokens, stats.max_context_tokens, stats.context_limit) == (40, 40, 0)
    ended = _choice_trajectory()
    ended.status, ended.reward, ended.success = "context_limit", 1.5, True  # score clipped to 1
    bench.count_turns(stats, [ended], parse_choice, max_new_tokens=2)
    assert (stats.episodes, stats.score_sum, stats.scored, stats.completed,
            stats.context_limit) == (2, 1.25, 2, 1, 1)
    assert stats.per_episode(stats.turns) == 3.0
    assert stats.episode_scores == [["t", 0.25, 3], ["t", 1.0, 3]]  # per episode, to split tasks


def test_turn_contexts_are_each_turns_prompt_plus_reply_whole_and_windowed():
    """By hand. The choice trajectory's turns end at ids 31, 34 and 37 (a 30-id prompt, then
    per turn the reply and 2 observation ids): contexts 32, 35, 38. A windowed trajectory of
    one-id replies whose third turn starts a new chunk of a 20-id prompt: 31, 34, then
    20 + 1 = 21."""
    bench = _benchmark()
    t = _choice_trajectory()
    assert bench.turn_contexts(t) == [32, 35, 38]
    w = Trajectory(env="babyai", task_id="w", group_id=0, sample_index=0)
    w.append(list(range(30)), generated=False, turn=-1)
    for turn in range(2):
        w.append([1], generated=True, turn=turn)
        w.append([9, 9], generated=False, turn=turn)
    w.start_chunk(list(range(20)))
    w.append([1], generated=True, turn=2)
    w.num_turns = 3
    assert w.chunk_bounds() == [(0, 36), (36, 57)]
    assert bench.turn_contexts(w) == [31, 34, 21]
    stats = bench.FormatStats("x", turn_contexts=[[32, 35, 38], [31, 34], [10]])
    assert stats.context_by_turn() == [(32 + 31 + 10) / 3, (35 + 34) / 2, 38]


def test_the_task_sample_is_evenly_spaced_or_the_splits_first():
    """An evenly spaced sample of an interleaved split (MiniWoB: index i is task i % 22) can land
    on two tasks; ``--sample first`` takes one of each of the first tasks."""
    bench = _benchmark()

    class Catalog:
        async def tasks(self, split):
            return [f"task{i % 22}/seed={i // 22}" for i in range(22 * 1000)]

    def sample(how: str) -> list[str]:
        args = bench.argparse.Namespace(split="train", episodes=16, sample=how)
        return [t.task_id for t in asyncio.run(bench.sample_tasks({"miniwob": Catalog()}, args))]

    assert {t.split("/")[0] for t in sample("spaced")} == {"task0", "task11"}
    assert sample("first") == [f"task{i}/seed=0" for i in range(16)]


def test_choice_styles_configure_the_restricted_policy():
    bench = _benchmark()
    args = bench.argparse.Namespace(experiment=os.path.join(REPO, "experiments", "babyai.py:grpo_gpu"),
                                    env="babyai",
                                    model="smollm2", episodes=4, samples=1, concurrency=0,
                                    server_args=None, max_new_tokens=0, max_context=0,
                                    temperature=1.0, history_turns=None)
    recipe = bench.style_config(args, "recipe")
    assert (recipe.rollout.parser, recipe.agent.prompt_style, recipe.rollout.max_new_tokens,
            recipe.rollout.max_context, recipe.model.output_tokens) == (
        "react", "action", 24, 3072, "")
    spaced = bench.style_config(args, "choice_space_letters")
    assert spaced.model.output_tokens == tuple(" " + c for c in "abcdefghijklmnopqrstuvwxyz")
    assert (spaced.rollout.parser, spaced.agent.prompt_style, spaced.rollout.max_new_tokens,
            spaced.agent.list_valid_actions, spaced.rollout.max_context) == (
        "choice", "choice", 1, 26, 3072)
    assert bench.style_config(args, "choice_letters").model.output_tokens == \
        "abcdefghijklmnopqrstuvwxyz"
    assert bench.style_config(args, "choice").model.output_tokens == ""
    assert spaced.agent.history_turns == 0  # the experiment's (babyai grpo_gpu: no window)
    args.history_turns = 4  # --history_turns replaces it
    assert bench.style_config(args, "choice_option_limits").agent.history_turns == 4


def test_the_model_loads_unrestricted_for_an_experiment_with_option_limits():
    bench = _benchmark()
    args = bench.argparse.Namespace(
        experiment=os.path.join(REPO, "experiments", "textcraft.py:choice_shuffled_gpu"),
        env="textcraft", model="smollm2", episodes=4, samples=1, concurrency=0,
        server_args=None, max_new_tokens=0, max_context=0, temperature=1.0, history_turns=None)
    whole = bench.whole_vocabulary_config(args)  # raised ConfigError before 2026-12-04
    assert whole.model.output_tokens == "" and not whole.agent.option_limits
    assert whole.agent.shuffle_options  # the rest is the experiment's
    assert bench.style_config(args, "choice_shuffled").agent.option_limits


def test_order_counts_compare_the_shown_options_with_the_environments():
    bench = _benchmark()
    from agentrl_jax.agent.parsing import options_block

    env = ["turn left", "turn right", "go forward"]
    # option_order(env, 0) == [1, 2, 0] (parsing.option_order's docstring example)
    shuffled = ["turn right", "go forward", "turn left"]
    t = Trajectory(env="babyai", task_id="t", group_id=0, sample_index=0)
    t.status = "done"
    t.messages = [{"role": "system", "content": "s"},
                  {"role": "user", "content": "o\n" + options_block(shuffled)},
                  {"role": "assistant", "content": "Action: a"},
                  {"role": "user", "content": "o\n" + options_block(env)},
                  {"role": "assistant", "content": "Action: a"},
                  {"role": "user", "content": "o\n" + options_block(["drop"])},
                  {"role": "assistant", "content": "Action: a"},
                  {"role": "user", "content": "o\n" + options_block(["x", "y"])},
                  {"role": "assistant", "content": "Action: a"}]
    stats = bench.FormatStats("choice_shuffled")
    # one list sent, in the environment's order; ["drop"] has one option, ["x", "y"] was not sent
    bench.count_orders(stats, [t], {tuple(sorted(env)): {tuple(env)},
                                    ("drop",): {("drop",)}}, seed=0)
    assert (stats.order_turns, stats.order_kept, stats.order_formula, stats.first_at_a) == (
        2, 1, 1, 1)
    recorder = bench.OrderRecorder(object())
    recorder._record({"listed_actions": env})
    recorder._record({"available_actions": ["b", "a"]})
    assert recorder.lists == {tuple(sorted(env)): {tuple(env)}, ("a", "b"): {("b", "a")}}


def test_the_shuffled_style_is_choice_option_limits_with_the_shuffle():
    bench = _benchmark()
    args = bench.argparse.Namespace(experiment=os.path.join(REPO, "experiments",
                                                            "deepsearch.py:grpo_gpu"),
                                    env="deepsearch", model="smollm2", episodes=4, samples=1,
                                    concurrency=0, server_args=None, max_new_tokens=0,
                                    max_context=6144, temperature=1.0, history_turns=0)
    shuffled = bench.style_config(args, "choice_shuffled").to_dict()
    limited = bench.style_config(args, "choice_option_limits").to_dict()
    assert shuffled["agent"]["shuffle_options"] and not limited["agent"]["shuffle_options"]
    shuffled["agent"]["shuffle_options"] = False
    assert shuffled == limited
