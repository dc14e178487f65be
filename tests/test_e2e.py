"""End to end on CPU: the smoke config trains against real BabyAI and TextCraft servers, writes a
checkpoint, TensorBoard events and trajectory JSONL, and a second run resumes at the right step
and horizon.

The four subprocesses share a JAX compilation cache (``compile_cache_env``, tests/conftest.py):
the resumed runs and the evaluation load the programs the first run compiled."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

from agentrl_common.jsonl_files import read_records

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(workdir: str, cache_env: dict[str, str], *overrides: str) -> str:
    env = dict(os.environ, **cache_env)
    env.pop("XLA_FLAGS", None)  # the job itself runs on the machine's real devices
    cmd = [sys.executable, "launch/run.py", "--config", "experiments/smoke.py",
           "--workdir", workdir, *overrides]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.slow
def test_smoke_run_then_resume(tmp_path, compile_cache_env):
    workdir = str(tmp_path / "run")
    out = _run(workdir, compile_cache_env, "--config.train.total_steps=2")
    assert "[step 2/2]" in out and "run finished" in out
    assert os.path.isdir(os.path.join(workdir, "checkpoints", "2"))
    assert glob.glob(os.path.join(workdir, "tensorboard", "events.out.tfevents.*"))
    trajectories = read_records(os.path.join(workdir, "trajectories_train.jsonl.gz"))
    # smoke: 2 tasks x 2 samples per step, alternating BabyAI and TextCraft
    assert len(trajectories) == 8
    assert {t["env"] for t in trajectories} == {"babyai", "textcraft"}
    assert {t["step"] for t in trajectories} == {1, 2}  # numbered as [step k/n] and metrics
    for t in trajectories:
        assert len(t["token_ids"]) == len(t["loss_mask"]) == len(t["logprobs"])
        assert sum(t["loss_mask"]) > 0 and t["horizon"] == 2

    out = _run(workdir, compile_cache_env, "--config.train.total_steps=3")
    assert "resumed at step 2" in out and "[step 3/3] horizon=3" in out
    metrics = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    steps = [m["step"] for m in metrics if "train/horizon" in m]
    assert steps == [1, 2, 3]
    assert [m["train/horizon"] for m in metrics if "train/horizon" in m] == [2, 2, 3]
    assert os.path.isdir(os.path.join(workdir, "checkpoints", "3"))
    resumed = read_records(os.path.join(workdir, "trajectories_train.jsonl.gz"))
    assert {t["step"] for t in resumed[8:]} == {3}
    # the task cursor continued where the first run stopped (5th and 6th draws of the sampler)
    first_tasks = [t["task_id"] for t in trajectories[::2]]
    assert [t["task_id"] for t in resumed[8::2]] not in (first_tasks[:2], first_tasks[2:])

    # Asynchronous overlap: step 5's rollout runs while step 4 trains (staleness <= 1).
    out = _run(workdir, compile_cache_env, "--config.train.total_steps=5",
               "--config.train.max_staleness=1")
    assert "resumed at step 3" in out and "[step 5/5]" in out
    metrics = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    train = [m for m in metrics if "train/horizon" in m]
    assert [m["step"] for m in train] == [1, 2, 3, 4, 5]
    assert train[-1]["rollout/stale_dropped"] == 0
    assert os.path.isdir(os.path.join(workdir, "checkpoints", "5"))

    # Evaluation of the trained checkpoint (Avg@k / Pass@k on held-out tasks).
    output = os.path.join(workdir, "eval", "result.json")
    env = dict(os.environ, **compile_cache_env)
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run(
        [sys.executable, "launch/eval.py", "--config", "experiments/smoke.py", "--checkpoint",
         os.path.join(workdir, "checkpoints"), "--k", "2", "--tasks", "2", "--horizon", "2",
         "--output", output], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "avg@2=" in proc.stdout and "pass@2=" in proc.stdout
    result = json.load(open(output))
    assert result["num_tasks"] == 4 and result["k"] == 2  # 2 BabyAI + 2 TextCraft test tasks
    evaluated = [json.loads(line) for line in open(output.replace(".json", "_trajectories.jsonl"))]
    assert len(evaluated) == 8 and all(t["horizon"] == 2 for t in evaluated)
    assert 0.0 <= result["avg_at_k"] <= result["pass_at_k"] <= 1.0


@pytest.mark.slow
def test_a_flat_held_out_curve_stops_the_run_and_its_resumption(tmp_path, compile_cache_env):
    """train.stop_on_plateau=2 with an evaluation before training and after every step: the
    smoke model scores 0 on every evaluation (nothing rises above step 0's), so the run stops
    after step 2, the second evaluation in a row that did not rise, checkpointed, recorded as
    "plateau" and finished (the same command says so). With a patience of 3 it is not flat
    yet: it resumes, the earlier session's evaluations (summary.json) still count, and the
    next evaluation (step 3) is the third flat one, where it stops again."""
    workdir = str(tmp_path / "run")
    flags = ["--config.train.total_steps=6", "--config.train.eval_every=1",
             "--config.train.eval_before=True"]
    out = _run(workdir, compile_cache_env, *flags, "--config.train.stop_on_plateau=2")
    assert "held-out curve flat after step 2" in out and "[step 3/6]" not in out
    assert os.path.isdir(os.path.join(workdir, "checkpoints", "2"))
    with open(os.path.join(workdir, "summary.json")) as f:
        summary = json.load(f)
    assert summary["sessions"][-1]["stopped"] == "plateau"
    assert summary["final_step"] == summary["finished_step"] == 2
    assert sorted(map(int, summary["evals"])) == [0, 1, 2]
    assert all(e["avg_at_k"] == 0.0 and e["avg_at_k_se"] == 0.0
               for e in summary["evals"].values())
    out = _run(workdir, compile_cache_env, *flags, "--config.train.stop_on_plateau=2")
    assert "run already finished at step 2" in out

    out = _run(workdir, compile_cache_env, *flags, "--config.train.stop_on_plateau=3")
    assert "resumed at step 2" in out and "held-out curve flat after step 3" in out
    with open(os.path.join(workdir, "summary.json")) as f:
        summary = json.load(f)
    assert [s["stopped"] for s in summary["sessions"] if s["steps"]] == ["plateau", "plateau"]
    assert summary["final_step"] == summary["finished_step"] == 3


@pytest.mark.slow
def test_a_run_with_actor_workers_trains_on_the_in_process_runs_episodes(tmp_path,
                                                                         compile_cache_env):
    """``rollout.actor_workers=2``: the trainer spawns the workers beside the model load and
    hands them to its pool (``services.spawn_actor_workers``); the run ends normally and its
    training episodes are the in-process run's, field for field."""
    episodes = {}
    for workers in (0, 2):
        workdir = str(tmp_path / f"w{workers}")
        out = _run(workdir, compile_cache_env, "--config.train.total_steps=1",
                   f"--config.rollout.actor_workers={workers}")
        assert "[step 1/1]" in out and "run finished" in out
        (path,) = glob.glob(os.path.join(workdir, "trajectories_train*.jsonl*"))
        episodes[workers] = list(read_records(path))
    assert len(episodes[2]) == len(episodes[0]) > 0
    for a, b in zip(episodes[0], episodes[2]):
        for field in ("task_id", "token_ids", "loss_mask", "logprobs", "messages", "reward",
                      "num_turns", "turn_versions"):
            assert a[field] == b[field], field
