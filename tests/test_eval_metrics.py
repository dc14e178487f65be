"""The paper's metrics (``training/evaluation/eval_metrics.py``) against hand-computed cases, and every
consumer (the run's evaluation, the report, the results table's per-task values) using them."""

from __future__ import annotations

import json

import pytest

from agentrl_jax.agent.trajectory import Trajectory
from agentrl_jax.training.evaluation import eval_metrics as em
from agentrl_jax.training.evaluation.held_out import score_trajectories


def _ep(task: str, reward: float, success: bool = False, env: str = "e",
        status: str = "done") -> dict:
    return {"env": env, "task_id": task, "status": status, "reward": reward, "success": success}


def test_k_samples_per_task_mixed_scores_and_a_task_of_zeros():
    # BabyAI-like: 3 tasks x k=4; MiniGrid rewards 1 - 0.9 * steps / max_steps on success
    eps = ([_ep("a", r, r > 0) for r in (0.82, 0.0, 0.55, 0.91)]
           + [_ep("b", 0.0) for _ in range(4)]  # a task with all zeros
           + [_ep("c", r, r > 0) for r in (0.0, 0.0, 0.0, 0.1)])
    s = em.score(em.outcomes(eps), k=4)
    # by hand: task means a 2.28 / 4 = 0.57, b 0, c 0.025
    assert s.avg_at_k == pytest.approx((0.57 + 0.0 + 0.025) / 3)
    assert s.pass_at_k == pytest.approx(2 / 3)  # a and c have an episode scoring > 0
    assert s.success_rate == pytest.approx((3 / 4 + 0 + 1 / 4) / 3)
    assert (s.k, s.tasks, s.episodes) == (4, 3, 12)
    assert em.describe(s) == "avg@4=0.198 (mean score) pass@4=0.667 success=0.333"


def test_scienceworld_partial_scores_are_scores_not_successes():
    # ScienceWorld: reward = max(final score, 0) / 100; the flag only for a completed task
    eps = [_ep("boil/var=1", 0.15, env="scienceworld"), _ep("boil/var=1", 0.08,
                                                           env="scienceworld"),
           _ep("melt/var=2", 1.0, True, env="scienceworld"), _ep("melt/var=2", 0.0,
                                                                env="scienceworld")]
    s = em.score(em.outcomes(eps), k=2)
    assert s.avg_at_k == pytest.approx(((0.15 + 0.08) / 2 + 0.5) / 2)  # 0.3075
    assert s.pass_at_k == 1.0  # both tasks have a positive score (the paper's success)
    assert s.success_rate == pytest.approx((0 + 0.5) / 2)  # one completion of four
    # the old Avg@k (success flag or reward > 0 per episode) would have said 3 / 4
    old = sum(e["success"] or e["reward"] > 0 for e in eps) / len(eps)
    assert old == 0.75 and s.avg_at_k != pytest.approx(old)


def test_errors_left_out_tasks_weigh_the_same_and_scores_clipped():
    eps = [_ep("a", 1.0, True), _ep("a", 0.0, status="env_error"),  # a: one finished episode
           _ep("b", 0.0), _ep("b", 0.4), _ep("b", 0.2),  # b: three
           _ep("c", 0.0, status="engine_error"),  # c: never finished, not scored
           _ep("d", 7.0, True), _ep("d", -2.0), _ep("d", float("nan")), _ep("d", None)]
    outs = em.outcomes(eps)
    assert [o.score for o in outs if o.task_id == "d"] == [1.0, 0.0, 0.0, 0.0]
    s = em.score(outs, k=4)
    assert (s.tasks, s.episodes) == (3, 8)
    # task means: a 1.0, b 0.2, d 0.25 (mean over tasks, not over the 8 episodes)
    assert s.avg_at_k == pytest.approx((1.0 + 0.2 + 0.25) / 3)
    assert s.pass_at_k == 1.0
    assert s.success_rate == pytest.approx((1.0 + 0.0 + 0.25) / 3)


def test_nothing_scored_and_bad_arguments():
    s = em.score([], k=4)
    assert (s.tasks, s.avg_at_k, s.pass_at_k, s.success_rate) == (0, None, None, None)
    assert em.describe(s) == "no task scored"
    with pytest.raises(ValueError, match="k must be >= 1"):
        em.score([], k=0)
    with pytest.raises(ValueError, match="unknown metric 'old'"):
        em.task_values([], "old")


def test_task_values_feed_the_seed_statistics():
    outs = em.outcomes([_ep("a", 0.5), _ep("a", 0.0, env="f"), _ep("a", 0.0), _ep("b", 1.0, True)])
    assert em.task_values(outs, "avg") == {"e/a": [0.5, 0.0], "f/a": [0.0], "e/b": [1.0]}
    assert em.task_values(outs, "pass") == {"e/a": [1.0], "f/a": [0.0], "e/b": [1.0]}
    assert em.task_values(outs, "success") == {"e/a": [0.0, 0.0], "f/a": [0.0], "e/b": [1.0]}
    per_env = em.score_per_env(outs, k=2)
    assert list(per_env) == ["e", "f"] and per_env["e"].avg_at_k == pytest.approx(0.625)


def test_the_runs_evaluation_uses_the_paper_metrics():
    def traj(task, reward, success, status="done"):
        return Trajectory(env="scienceworld", task_id=task, group_id=0, sample_index=0,
                          reward=reward, success=success, status=status)

    r = score_trajectories([traj("a", 0.15, False), traj("a", 0.25, False),
                            traj("b", 1.0, True), traj("b", 0.0, False)], k=2)
    assert r.avg_at_k == pytest.approx((0.2 + 0.5) / 2)
    assert r.pass_at_k == 1.0 and r.success_rate == pytest.approx(0.25)
    assert r.scoring == em.SCORING
    m = r.as_metrics()
    assert m["eval/success_rate"] == pytest.approx(0.25)
    assert m["eval/scienceworld/avg@2"] == pytest.approx(0.35)
    assert m["eval/scienceworld/success_rate"] == pytest.approx(0.25)


def test_report_reads_new_and_old_summaries(tmp_path):
    from agentrl_jax.training.outputs.report import build_report, eval_success_by_task

    run = tmp_path / "run"
    run.mkdir()
    with open(run / "eval_episodes.jsonl", "w") as f:
        for step, rewards in ((0, (0.0, 0.2)), (10, (0.6, 1.0))):
            for i, r in enumerate(rewards):
                f.write(json.dumps({**_ep("t", r, r == 1.0), "step": step,
                                    "sample_index": i}) + "\n")
    assert eval_success_by_task(str(run)) == {0: {"e/t": [0.0, 0.2]}, 10: {"e/t": [0.6, 1.0]}}
    assert eval_success_by_task(str(run), "success") == {0: {"e/t": [0.0, 0.0]},
                                                         10: {"e/t": [0.0, 1.0]}}
    new = {"k": 2, "avg_at_k": 0.8, "pass_at_k": 1.0, "success_rate": 0.5, "mean_reward": 0.8,
           "num_tasks": 1, "dropped": 0, "scoring": "paper"}
    old = {"k": 2, "avg_at_k": 1.0, "pass_at_k": 1.0, "mean_reward": 0.8, "num_tasks": 1,
           "dropped": 0}
    (run / "summary.json").write_text(json.dumps({"evals": {"0": old, "10": new}}))
    text = build_report(str(run))
    assert "| 10 | 0.800 | 1.000 | 0.500 | 0.800 | 1 | 2 | 0 |" in text
    # an old summary's Avg@k is marked as the old metric, its success rate unknown
    assert "| 0 | 1.000 (old metric) | 1.000 | – | 0.800 | 1 | 2 | 0 |" in text
    assert "Held-out Avg@k (mean task score) from step 0 to step 10: 0.100 -> 0.800" in text
