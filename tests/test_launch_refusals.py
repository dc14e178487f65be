"""Commands that cannot work are refused in one line before anything starts, and leave nothing
behind: ``launch/eval.py`` with a checkpoint folder that does not exist (or holds no such step),
``launch/sft.py`` without its expert data (issue 50, item 4)."""

from __future__ import annotations

import os
import subprocess
import sys

from agentrl_jax.training.preflight.validate import checkpoint_problem

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _launch(script: str, args: list[str], cwd: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=REPO)
    env.pop("XLA_FLAGS", None)
    return subprocess.run([sys.executable, os.path.join(REPO, "launch", script), *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=300)


def test_checkpoint_problem_names_what_is_wrong(tmp_path):
    missing = tmp_path / "runs" / "babyai" / "checkpoints"
    assert "does not exist" in checkpoint_problem(str(missing))
    assert not missing.exists()  # reading only: nothing created
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no finished checkpoint" in checkpoint_problem(str(empty))
    (tmp_path / "file").write_text("x")
    assert "is a file" in checkpoint_problem(str(tmp_path / "file"))
    run = tmp_path / "run"
    (run / "checkpoints" / "3").mkdir(parents=True)
    (run / "checkpoints" / "7").mkdir()
    (run / "checkpoints" / "9.orbax-checkpoint-tmp-1").mkdir()  # unfinished: not a step
    assert f"but {run / 'checkpoints'} does" in checkpoint_problem(str(run))
    assert checkpoint_problem(str(run / "checkpoints")) is None
    assert checkpoint_problem(str(run / "checkpoints"), 7) is None
    line = checkpoint_problem(str(run / "checkpoints"), 9)
    assert "no checkpoint of step 9" in line and "steps: 3, 7" in line


def test_eval_refuses_a_missing_checkpoint_in_one_line(tmp_path):
    proc = _launch("eval.py", ["--config", os.path.join(REPO, "experiments/smoke.py"),
                               "--checkpoint", "runs/babyai/checkpoints", "--tasks", "1"],
                   cwd=str(tmp_path))
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("cannot evaluate: --checkpoint: ")
    assert "runs/babyai/checkpoints does not exist" in lines[0]
    assert "starting" not in proc.stdout + proc.stderr  # no server, no model
    assert os.listdir(tmp_path) == []  # nothing left behind


def test_eval_refuses_a_step_the_folder_does_not_hold(tmp_path):
    (tmp_path / "ckpt" / "4").mkdir(parents=True)
    proc = _launch("eval.py", ["--config", os.path.join(REPO, "experiments/smoke.py"),
                               "--checkpoint", "ckpt", "--step", "5", "--output",
                               "out/eval.json"], cwd=str(tmp_path))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        f"cannot evaluate: --checkpoint: no checkpoint of step 5 in {tmp_path / 'ckpt'} "
        "(steps: 4)"]
    assert sorted(os.listdir(tmp_path)) == ["ckpt"] and not (tmp_path / "out").exists()


def test_sft_refuses_missing_expert_data_before_writing_its_workdir(tmp_path):
    proc = _launch("sft.py", ["--config", os.path.join(REPO, "experiments/smoke.py:sft"),
                              "--config.sft.data=nowhere/experts", "--workdir", "runs/sft"],
                   cwd=str(tmp_path))
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0] == "cannot train: sft.data: expert data nowhere/experts not found"
    assert os.listdir(tmp_path) == []
