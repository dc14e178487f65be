"""The end-of-run report (agentrl_jax/training/outputs/report.py): numbers in report.md against the run's
files computed here by hand, the curves PNG, the paired bootstrap on hand cases, and robustness
to missing, partial and malformed files."""

from __future__ import annotations

import json
import os

import pytest

from agentrl_jax.training.outputs import report


def write_run(d, metrics=True, summary=True, evals=True, config=True):
    os.makedirs(d, exist_ok=True)
    if metrics:
        with open(os.path.join(d, "metrics.jsonl"), "w") as f:
            f.write(json.dumps({"step": 0, "eval/avg@2": 0.25, "eval/pass@2": 0.5,
                                "eval/success_rate": 0.25}) + "\n")
            for s in range(1, 6):
                f.write(json.dumps({"step": s, "rollout/mean_reward": 0.1 * s,
                                    "rollout/success_rate": 0.05 * s, "actor/entropy": 2 - s / 10,
                                    "train/step_seconds": 10.0 + s,
                                    "rollout/status/done": 3, "rollout/status/max_turns": 5})
                        + "\n")
            f.write("{not json\n")
            f.write(json.dumps({"step": 5, "eval/avg@2": 0.75, "eval/pass@2": 1.0,
                                "eval/success_rate": 0.5}) + "\n")
    if summary:
        with open(os.path.join(d, "summary.json"), "w") as f:
            json.dump({"final_step": 5, "sessions": [{"stopped": "total_steps", "seconds": 125.0}],
                       "evals": {"0": {"k": 2, "num_tasks": 2, "avg_at_k": 0.25, "pass_at_k": 0.5,
                                       "success_rate": 0.25, "mean_reward": 0.2, "dropped": 0,
                                       "scoring": "paper"},
                                 "5": {"k": 2, "num_tasks": 2, "avg_at_k": 0.75, "pass_at_k": 1.0,
                                       "success_rate": 0.5, "mean_reward": 0.7, "dropped": 1,
                                       "scoring": "paper"}}}, f)
    if config:
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump({"model": {"name": "smollm2"}, "env": {"names": "babyai"},
                       "learner": {"advantage_estimator": "grpo", "learning_rate": 1e-5},
                       "horizon": {"type": "scaling_inter", "phases": [2, 3]},
                       "train": {"total_steps": 5, "tasks_per_step": 2,
                                 "samples_per_task": 4}}, f)
    if evals:
        with open(os.path.join(d, "trajectories_eval.jsonl"), "w") as f:
            # task a: 0/2 -> 2/2, task b: 1/2 -> 1/2 (+ an error episode, not counted)
            for step, task, ok in ((0, "a", 0), (0, "a", 0), (0, "b", 1), (0, "b", 0),
                                   (5, "a", 1), (5, "a", 1), (5, "b", 1), (5, "b", 0)):
                f.write(json.dumps({"env": "babyai", "task_id": task, "step": step,
                                    "status": "done", "success": bool(ok), "reward": float(ok),
                                    "token_ids": [1] * 50}) + "\n")
            f.write(json.dumps({"env": "babyai", "task_id": "b", "step": 5,
                                "status": "env_error", "success": True, "reward": 1.0}) + "\n")


def test_report_numbers_and_curves(tmp_path):
    d = str(tmp_path / "run")
    write_run(d)
    out = report.write_report(d)
    text = open(out["report"]).read()
    assert "| steps | 5 of 5 (stopped: total_steps) |" in text
    assert "| wall time | 2 min 5 s (1 session(s)) |" in text
    assert "| mean step time | 13.0 s |" in text  # mean of 11..15
    assert "| train reward, first -> last step | 0.100 -> 0.500 |" in text
    assert "| best train reward | 0.500 (step 5) |" in text
    assert "done 3, max_turns 5" in text
    assert "| 0 | 0.250 | 0.500 | 0.250 | 0.200 | 2 | 2 | 0 |" in text
    assert "| 5 | 0.750 | 1.000 | 0.500 | 0.700 | 2 | 2 | 1 |" in text
    # per task: a 0 -> 1, b 0.5 -> 0.5: mean 0.25 -> 0.75, gain +50 points
    assert "0.250 -> 0.750, gain +50.0 points" in text
    assert "paired bootstrap over 2 tasks" in text
    assert "![learning curves](report_curves.png)" in text
    with open(out["curves"], "rb") as f:
        png = f.read()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and 5_000 < len(png) < 300_000
    assert "train reward, held-out Avg@k, train success, entropy, step time" in text


def test_paired_bootstrap_hand_cases():
    same = {f"t{i}": [0.0, 1.0] for i in range(10)}
    better = {f"t{i}": [1.0, 1.0] for i in range(10)}
    r = report.paired_bootstrap(same, better, draws=500)
    assert r["gain"] == pytest.approx(0.5) and r["ci95_low"] == r["ci95_high"] == pytest.approx(0.5)
    r = report.paired_bootstrap({"a": [0.0], "b": [0.0], "x": [1.0]},
                                {"a": [1.0], "b": [0.0], "y": [0.0]}, draws=2000)
    assert r["tasks"] == 2 and r["gain"] == pytest.approx(0.5)
    assert r["ci95_low"] == pytest.approx(0.0) and r["ci95_high"] == pytest.approx(1.0)
    assert report.paired_bootstrap({"a": [1.0]}, {"b": [1.0]}) == {}


@pytest.mark.parametrize("missing", ["metrics", "summary", "evals", "config", "all"])
def test_report_survives_missing_files(tmp_path, missing):
    d = str(tmp_path / "run")
    kw = {"metrics": True, "summary": True, "evals": True, "config": True}
    if missing == "all":
        kw = {k: False for k in kw}
        os.makedirs(d)
    else:
        kw[missing] = False
    write_run(d, **kw)
    out = report.write_report(d)
    text = open(out["report"]).read()
    assert text.startswith("# Run report: run")
    if missing in ("metrics", "all"):
        assert out["curves"] is None and "learning curves" not in text
    if missing == "all":
        assert "No training step was logged." in text and "No evaluation was run." in text
        assert "Not found in the workdir: metrics.jsonl, summary.json, config.json" in text
    if missing == "summary":  # evaluations come from metrics.jsonl then
        assert "| 5 | 0.750 | 1.000 | 0.500 | – | – | 2 | – |" in text
    if missing == "evals":
        assert "gain" not in text


def test_write_report_safely_never_raises(tmp_path, monkeypatch):
    said = []
    monkeypatch.setattr(report, "write_report", lambda d: 1 / 0)
    assert report.write_report_safely(str(tmp_path), said.append) is None
    assert said == ["run report not written: ZeroDivisionError: division by zero"]
