"""Rewinding a run's per-step logs to its checkpoint (before: after a kill -9 and a resume,
metrics.jsonl and trajectories_*.jsonl held the re-run steps twice). The reference is the
hand-written list of rows each file must keep."""

from __future__ import annotations

import json
import os

from agentrl_jax.training.outputs.runlog import rewind_jsonl, rewind_run_logs


def _write(path, rows, tail: str = "") -> None:
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
        f.write(tail)


def _read(path):
    return [json.loads(line) for line in open(path)]


def _run_dir(tmp_path):
    """A run killed during step 4 (checkpoint 2 on disk; steps 3 and 4 logged after it)."""
    metrics = [{"step": 0, "eval/avg@1": 0.0}] + [
        {"step": s, "train/horizon": 2.0} for s in (1, 2, 3, 4)] + [{"step": 2, "eval/avg@1": 0.5}]
    train = [{"step": s, "sample_index": i} for s in (1, 2, 3, 4) for i in (0, 1)]
    evals = [{"step": 0, "task_id": "a"}, {"step": 2, "task_id": "a"}, {"step": 4, "task_id": "a"}]
    _write(tmp_path / "metrics.jsonl", metrics, tail='{"step": 5, "train/hor')  # cut by the kill
    _write(tmp_path / "trajectories_train.jsonl", train)
    _write(tmp_path / "trajectories_eval.jsonl", evals)
    return metrics, train, evals


def test_rewind_keeps_each_step_up_to_the_checkpoint_once(tmp_path):
    metrics, train, evals = _run_dir(tmp_path)
    dropped = rewind_run_logs(str(tmp_path), 2)
    assert dropped == {"metrics.jsonl": 3, "trajectories_train.jsonl": 4,
                       "trajectories_eval.jsonl": 1}
    # updates 1, 2 and their evaluations stay; the rows of steps 3, 4 and the cut line go
    assert _read(tmp_path / "metrics.jsonl") == [metrics[0], metrics[1], metrics[2], metrics[5]]
    # the episodes of updates 1 and 2 (stored as steps 1 and 2, as the terminal numbers them)
    assert _read(tmp_path / "trajectories_train.jsonl") == train[:4]
    assert _read(tmp_path / "trajectories_eval.jsonl") == evals[:2]
    # rewinding again changes nothing (and does not rewrite the files)
    mtime = os.stat(tmp_path / "metrics.jsonl").st_mtime_ns
    assert rewind_run_logs(str(tmp_path), 2) == {}
    assert os.stat(tmp_path / "metrics.jsonl").st_mtime_ns == mtime


def test_an_evaluation_run_again_is_dropped_too(tmp_path):
    metrics, train, evals = _run_dir(tmp_path)
    # resumed at 2 with step 2 evaluated again (e.g. a final evaluation killed part-way)
    rewind_run_logs(str(tmp_path), 2, redo_eval=True)
    assert _read(tmp_path / "metrics.jsonl") == [metrics[0], metrics[1], metrics[2]]
    assert _read(tmp_path / "trajectories_eval.jsonl") == evals[:1]
    # no checkpoint: everything but nothing goes, the opening evaluation too when it runs again
    _run_dir(tmp_path)
    rewind_run_logs(str(tmp_path), 0, redo_eval=True)
    assert [_read(tmp_path / f) for f in ("metrics.jsonl", "trajectories_train.jsonl",
                                          "trajectories_eval.jsonl")] == [[], [], []]


def test_only_the_named_processes_files(tmp_path):
    _write(tmp_path / "trajectories_train.process0.jsonl", [{"step": 1}, {"step": 3}])
    _write(tmp_path / "trajectories_train.process1.jsonl", [{"step": 1}, {"step": 3}])
    _write(tmp_path / "metrics.jsonl", [{"step": 1}, {"step": 4}])
    assert rewind_run_logs(str(tmp_path), 1, metrics=False, trajectory_suffix=".process1") == {
        "trajectories_train.process1.jsonl": 1}
    assert len(_read(tmp_path / "trajectories_train.process0.jsonl")) == 2
    assert len(_read(tmp_path / "metrics.jsonl")) == 2


def test_rewind_jsonl_is_atomic_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "x.jsonl"
    _write(path, [{"step": i} for i in range(5)], tail="not json\n")
    assert rewind_jsonl(str(path), lambda r: r["step"] % 2 == 0) == 3
    assert _read(path) == [{"step": 0}, {"step": 2}, {"step": 4}]
    assert sorted(os.listdir(tmp_path)) == ["x.jsonl"]
    assert rewind_jsonl(str(tmp_path / "missing.jsonl"), lambda r: False) == 0
