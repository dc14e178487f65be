"""benchmarks/analysis/learning_report.py: the paired bootstrap interval on hand-computed cases."""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks", "analysis"))
import learning_report  # noqa: E402


def test_constant_gain_has_a_point_interval():
    before = {f"t{i}": [0.0, 0.0, 0.0, 1.0] for i in range(20)}
    after = {f"t{i}": [0.0, 1.0, 1.0, 1.0] for i in range(20)}
    r = learning_report.paired_bootstrap(before, after, draws=500)
    assert r["gain"] == pytest.approx(0.5)
    assert r["gain_ci95_low"] == pytest.approx(0.5) and r["gain_ci95_high"] == pytest.approx(0.5)
    assert r["tasks"] == 20 and r["samples_per_task"] == 4


def test_interval_covers_the_mean_and_only_paired_tasks_count():
    before = {"a": [0.0], "b": [0.0], "c": [1.0], "d": [0.0], "only_before": [1.0]}
    after = {"a": [1.0], "b": [0.0], "c": [1.0], "d": [1.0], "only_after": [0.0]}
    r = learning_report.paired_bootstrap(before, after, draws=2000)
    assert r["tasks"] == 4
    assert r["gain"] == pytest.approx(0.5)  # diffs 1, 0, 0, 1
    assert 0.0 <= r["gain_ci95_low"] < 0.5 < r["gain_ci95_high"] <= 1.0


def test_report_from_run_files(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    with open(run / "metrics.jsonl", "w") as f:
        for step in (1, 2):
            f.write(json.dumps({"step": step, "rollout/mean_reward": 0.1 * step}) + "\n")
    with open(run / "eval_episodes.jsonl", "w") as f:
        for step, ok in ((0, False), (2, True)):
            for task in ("x", "y"):
                f.write(json.dumps({"env": "babyai", "task_id": task, "step": step,
                                    "status": "done", "success": ok, "reward": float(ok)}) + "\n")
    out = tmp_path / "out"
    learning_report.main([str(run), "--out", str(out)])
    gain = json.loads((out / "gain.json").read_text())["run"]
    assert gain["before_avg"] == 0.0 and gain["after_avg"] == 1.0 and gain["gain"] == 1.0
    assert (out / "curves.png").stat().st_size > 1000
    assert (out / "metrics.jsonl").exists()


def test_differences_between_runs(tmp_path):
    """--diff B:A pairs the runs' evaluations by task: B's last minus A's first / last."""
    def run(name, evals):
        d = tmp_path / name
        d.mkdir()
        with open(d / "trajectories_eval.jsonl", "w") as f:
            for step, successes in evals.items():
                for task, ok in successes.items():
                    for o in ok:
                        f.write(json.dumps({"env": "babyai", "task_id": task, "step": step,
                                            "status": "done", "success": bool(o),
                                            "reward": float(o)}) + "\n")
        return str(d)

    a = run("a", {0: {"x": [0, 0], "y": [0, 0], "z": [1, 0]},
                  5: {"x": [1, 0], "y": [0, 0], "z": [1, 1]}})
    b = run("b", {7: {"x": [1, 1], "y": [1, 0], "z": [1, 1], "w": [1, 1]}})
    out = tmp_path / "out"
    learning_report.main([a, b, "--labels", "a,b", "--diff", "b:a,b:a@first",
                          "--out", str(out)])
    diffs = json.loads((out / "gain.json").read_text())["differences"]
    last, first = diffs["b:a"], diffs["b:a@first"]
    # per task (x, y, z): b = 1, .5, 1; a@5 = .5, 0, 1; a@0 = 0, 0, .5 ("w" is not paired)
    assert last["tasks"] == 3 and last["gain"] == pytest.approx((0.5 + 0.5 + 0) / 3)
    assert (last["a_step"], last["b_step"]) == (5, 7)
    assert first["gain"] == pytest.approx((1 + 0.5 + 0.5) / 3) and first["a_step"] == 0
    with pytest.raises(ValueError, match="labels"):
        learning_report.differences("c:a", {"a": {}})


def _write(path, episodes):
    with open(path, "w") as f:
        for e in episodes:
            f.write(json.dumps(e) + "\n")


def _episodes(step, successes, extra=None):
    """``successes``: {task: [0/1 per sample]}; one line per sample (full-trajectory fields in
    ``extra``: token ids and the like, which --collect drops)."""
    return [{"env": "babyai", "task_id": task, "step": step, "status": "done",
             "success": bool(o), "reward": float(o), "sample_index": i, **(extra or {})}
            for task, ok in successes.items() for i, o in enumerate(ok)]


def test_collect_then_report_and_missing_runs(tmp_path):
    """--collect writes eval_episodes.jsonl (small fields only) from a run's full trajectories;
    a run holding both kinds of file counts its episodes once; launch/eval.py's output (no
    step) is step 0, or its eval.json's checkpoint step; a missing run or one without
    evaluations gets "missing" and so do the differences naming it, while the others are
    computed."""
    grpo, base, empty = tmp_path / "grpo", tmp_path / "base", tmp_path / "empty"
    for d in (grpo, base, empty):
        d.mkdir()
    big = {"token_ids": list(range(50)), "messages": [{"role": "user", "content": "x" * 100}]}
    _write(grpo / "trajectories_eval.jsonl", _episodes(0, {"x": [0, 0], "y": [0, 1]}, big)
           + _episodes(9, {"x": [1, 1], "y": [1, 1]}, big))
    (grpo / "summary.json").write_text("{}")
    base_eps = _episodes(0, {"x": [0, 0], "y": [1, 1]})
    for e in base_eps:
        del e["step"]
    _write(base / "eval_trajectories.jsonl", base_eps)  # launch/eval.py --output eval.json
    (base / "eval.json").write_text("{}")
    small = tmp_path / "small"
    learning_report.main([str(grpo), str(base), str(empty), str(tmp_path / "nope"),
                          "--labels", "grpo,base,empty,nope", "--collect", "--out", str(small)])
    lines = (small / "grpo" / "eval_episodes.jsonl").read_text().splitlines()
    assert len(lines) == 8 and "token_ids" not in lines[0] and "messages" not in lines[0]
    assert (small / "grpo" / "summary.json").exists() and (small / "base" / "eval.json").exists()
    assert not (small / "empty" / "eval_episodes.jsonl").exists()
    # both the full and the small file in one directory: counted once
    _write(grpo / "eval_episodes.jsonl", [json.loads(x) for x in lines])
    assert sum(len(v) for v in learning_report.eval_success_by_task(str(grpo))[9].values()) == 4
    out = tmp_path / "out"
    learning_report.main([str(small / "grpo"), str(small / "base"), str(small / "empty"),
                          str(tmp_path / "nope"), "--labels", "grpo,base,empty,nope",
                          "--diff", "grpo:base,grpo@first:base,empty:grpo,grpo:nope",
                          "--out", str(out)])
    r = json.loads((out / "gain.json").read_text())
    assert r["grpo"]["gain"] == pytest.approx(0.75) and r["grpo"]["after_avg"] == 1.0
    assert r["base"]["eval_steps"] == [0] and r["base"]["avg_by_step"] == {"0": 0.5}
    assert "missing" in r["empty"] and "no run directory" in r["nope"]["missing"]
    d = r["differences"]
    assert d["grpo:base"]["gain"] == pytest.approx(0.5)  # x: 1 - 0, y: 1 - 1
    assert d["grpo@first:base"]["gain"] == pytest.approx(-0.25)  # x: 0 - 0, y: .5 - 1
    assert "missing" in d["empty:grpo"] and "missing" in d["grpo:nope"]
    # launch/eval.py's output of a checkpoint: its episodes take eval.json's step
    (base / "eval.json").write_text(json.dumps({"step": 113, "avg_at_k": 0.5}))
    learning_report.main([str(base), "--labels", "ckpt", "--collect", "--out", str(small)])
    steps = {json.loads(x)["step"]
             for x in (small / "ckpt" / "eval_episodes.jsonl").read_text().splitlines()}
    assert steps == {113}
