"""benchmarks/analysis/deepsearch_diagnosis.py against hand-computed counts on a hand-made run
folder (config, metrics, evaluation episodes) and a hand-made search tree."""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks", "analysis"))
import deepsearch_diagnosis as dd


def _episode(task: str, step: int, status: str, reward: float, turns: int) -> dict:
    return {
        "env": "deepsearch",
        "task_id": task,
        "step": step,
        "status": status,
        "reward": reward,
        "success": reward > 0,
        "num_turns": turns,
        "invalid_actions": 0,
        "parse_failures": 0,
        "context_tokens": 100 * turns,
    }


EPISODES = [
    # step 0: 2 of 5 answer (turns 3 and 5), one of them correct; 3 never answer
    _episode("t1", 0, "max_turns", 0.0, 10),
    _episode("t1", 0, "done", 1.0, 3),
    _episode("t2", 0, "max_turns", 0.0, 10),
    _episode("t2", 0, "done", 0.0, 5),
    _episode("t3", 0, "context_limit", 0.0, 9),
    # step 45: all 4 answer (turns 3, 3, 3, 2); t2 correct twice, t3 once
    _episode("t1", 45, "done", 0.0, 3),
    _episode("t2", 45, "done", 1.0, 3),
    _episode("t2", 45, "done", 1.0, 3),
    _episode("t3", 45, "done", 1.0, 2),
]

# 4 groups a step; horizon 5 for steps 1-3, then 8 for steps 4-5
METRICS = [
    {"step": 0, "eval/avg@4": 0.1},
    {
        "step": 1,
        "train/horizon": 5,
        "rollout/episodes": 8,
        "rollout/flat_groups_skipped": 4,
        "rollout/mean_reward": 0.0,
        "rollout/mean_turns": 5.0,
        "rollout/status/max_turns": 8,
        "train/step_seconds": 6.0,
    },
    {
        "step": 2,
        "train/horizon": 5,
        "rollout/episodes": 8,
        "rollout/flat_groups_skipped": 3,
        "rollout/mean_reward": 0.125,
        "rollout/mean_turns": 4.0,
        "rollout/status/done": 2,
        "rollout/status/max_turns": 6,
        "train/step_seconds": 8.0,
        "actor/entropy": 1.5,
    },
    {
        "step": 3,
        "train/horizon": 5,
        "rollout/episodes": 8,
        "rollout/flat_groups_skipped": 2,
        "rollout/mean_reward": 0.25,
        "rollout/mean_turns": 3.0,
        "rollout/status/done": 6,
        "rollout/status/max_turns": 2,
        "train/step_seconds": 10.0,
        "actor/entropy": 1.0,
    },
    {
        "step": 4,
        "train/horizon": 8,
        "rollout/episodes": 8,
        "rollout/flat_groups_skipped": 1,
        "rollout/mean_reward": 0.5,
        "rollout/mean_turns": 3.0,
        "rollout/status/done": 7,
        "rollout/status/context_limit": 1,
        "train/step_seconds": 4.0,
        "actor/entropy": 0.5,
    },
    {
        "step": 5,
        "train/horizon": 8,
        "rollout/episodes": 8,
        "rollout/flat_groups_skipped": 4,
        "rollout/mean_reward": 0.0,
        "rollout/mean_turns": 2.0,
        "rollout/status/done": 8,
        "train/step_seconds": 2.0,
    },
    {"step": 5, "eval/avg@4": 0.2},
]


@pytest.fixture()
def run(tmp_path) -> str:
    path = tmp_path / "run"
    os.makedirs(path)
    (path / "config.json").write_text(json.dumps({"train": {"tasks_per_step": 4}}))
    (path / "eval_episodes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in EPISODES))
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in METRICS))
    return str(path)


def test_eval_counts_by_hand(run):
    evals = dd.diagnose_run(run)["evals"]
    assert set(evals) == {"0", "45"}
    first, final = evals["0"], evals["45"]
    assert first["episodes"] == 5 and first["answered"] == 2 and first["never_answered"] == 3
    assert first["answer_turns"] == {"3": 1, "5": 1}
    assert first["answer_turn_mean"] == pytest.approx(4.0)
    assert first["correct"] == 1 and first["correct_when_answered"] == pytest.approx(0.5)
    assert first["tasks_solved"] == ["t1"]
    assert first["status"] == {"max_turns": 2, "done": 2, "context_limit": 1}
    assert final["answered"] == 4 and final["never_answered"] == 0
    assert final["answer_turns"] == {"2": 1, "3": 3}
    assert final["answer_turn_mean"] == pytest.approx(11 / 4)
    assert final["correct"] == 3 and final["correct_when_answered"] == pytest.approx(0.75)
    assert final["tasks_solved"] == ["t2", "t3"]


def test_train_signal_by_hand(run):
    train = dd.diagnose_run(run)["train"]
    assert set(train) == {"5", "8"}
    h5, h8 = train["5"], train["8"]
    assert (h5["steps"], h5["first_step"], h5["last_step"]) == (3, 1, 3)
    assert h5["nonflat_groups"] == 0 + 1 + 2
    assert h5["flat_share"] == pytest.approx(1 - 3 / 12)
    assert h5["steps_without_update"] == 1
    assert h5["reward_mean"] == pytest.approx(0.375 / 3)
    assert h5["answered_share"] == pytest.approx(8 / 24)
    assert h5["turns_mean"] == pytest.approx(4.0)
    assert (h5["entropy_first"], h5["entropy_last"]) == (1.5, 1.0)
    assert h5["entropy_mean"] == pytest.approx(1.25)
    assert h5["step_seconds_mean"] == pytest.approx(8.0)
    assert h5["context_limit"] == 0
    assert h8["nonflat_groups"] == 3 and h8["steps_without_update"] == 1
    assert h8["flat_share"] == pytest.approx(1 - 3 / 8)
    assert h8["answered_share"] == pytest.approx(15 / 16)
    assert h8["entropy_first"] == h8["entropy_last"] == 0.5
    assert h8["context_limit"] == 1


def test_consistent_paths_by_hand():
    # a tree of two searches: "a" adds 10 tokens, "b" 20, "c" 30 (first search only "a"/"b";
    # after "a" the list is "b"/"c", after "b" it is "a"/"c"); start 100
    lists = {(): ["a", "b"], ("a",): ["b", "c"], ("b",): ["a", "c"]}
    cost = {"a": 10, "b": 20, "c": 30}
    calls = []

    def increment(path):
        calls.append(path)
        return cost[path[-1]]

    def listed(path):
        return lists[path]

    # context 130: a+b (10+20) and b+a (20+10); a+c = 140, b+c = 150
    assert sorted(dd.consistent_paths(130, 100, listed, increment, 2)) == [("a", "b"), ("b", "a")]
    assert dd.consistent_paths(150, 100, listed, increment, 2) == [("b", "c")]
    assert dd.consistent_paths(125, 100, listed, increment, 2) == []
    assert dd.consistent_paths(110, 100, listed, increment, 1) == [("a",)]
    # a branch past the target is cut: with target 115 "b" (120) is never grown
    calls.clear()
    dd.consistent_paths(115, 100, listed, increment, 2)
    assert ("b",) in calls and not any(len(p) == 2 and p[0] == "b" for p in calls)
