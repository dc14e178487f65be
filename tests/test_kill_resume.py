"""kill -9 of a trainer and of an environment server, on the smoke config.

* The trainer is killed with SIGKILL twice: during a rollout or its first update (drawn at
  random, seeded), then during a checkpoint save, each a random delay after the line that opens
  the phase; then resumed to the end with ``max_staleness=1`` (updates overlap rollouts).
  Checked: the checkpoint loads, every step appears exactly once in ``metrics.jsonl`` and
  ``trajectories_*.jsonl``, no episode failed, every turn is within the staleness bound, the
  run finishes.
* An environment server is killed with SIGKILL during a rollout: the launcher restarts it, the
  episodes it held end as ``env_error`` (with a warning) and the run goes on; killed again with
  no restart left (``env.max_restarts=1``), the run stops with a clear message and exit code 3.

The runs share the test session's JAX compilation cache (``compile_cache_env``,
tests/conftest.py, also used by tests/test_e2e.py's smoke runs) so that restarts do not compile
everything again. ``benchmarks/checks/kill_resume.py`` runs longer campaigns of random kills.
"""

from __future__ import annotations

import os
import random
import re
import signal
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks" / "checks"))

from kill_resume import (Run, children, kill_and_resume,  # noqa: E402
                         kill_server_holding_a_session, rows, wait_gone)

SEED = 12


@pytest.fixture
def jax_cache(compile_cache_env) -> str:
    """The test session's JAX compilation cache directory (tests/conftest.py)."""
    return compile_cache_env["JAX_COMPILATION_CACHE_DIR"]


@pytest.mark.slow
def test_trainer_killed_at_random_points_resumes_with_every_step_once(tmp_path, jax_cache):
    # kill 1 during a rollout (of step 1 or 2) or the first update, kill 2 during the save of a
    # step >= 2 (so that the last session resumes from a checkpoint), each a random delay (up
    # to 0.5 s) after the line that opens the phase; then the rest with overlapped updates
    rng = random.Random(SEED)
    kills = [(rng.choice(["rollout", "first update"]), rng.uniform(0, 0.5), rng.randint(0, 1)),
             ("later save", rng.uniform(0, 0.5), 0)]
    report = kill_and_resume(str(tmp_path / "run"), jax_cache, kills, total=4)
    # kill_and_resume checked the run: finished, each step once in metrics.jsonl and
    # trajectories_*.jsonl, no failed episode, every turn within its staleness bound
    assert report["steps"] == 4 and report["check"] == {"train_rows": 4, "episodes": 16,
                                                        "eval_episodes": 4}
    sessions = report["sessions"]
    assert [s.get("killed") for s in sessions] == [kills[0][0], "later save", None]
    # the last session restored a checkpoint and overlapped updates with rollouts (no
    # engine_error: checked). On CPU this does not catch an engine on the learner's donated
    # buffers: the first update's compilation outlasts the rollout it overlaps (the old code
    # passes here); tests/test_resume_donation.py does
    assert sessions[-1]["finished"] and sessions[-1]["resumed_at"] >= 1
    assert sessions[-1]["overlapped_updates"] >= 1


@pytest.mark.slow
def test_env_server_killed_mid_run_is_restarted_then_the_run_stops(tmp_path, jax_cache):
    workdir = str(tmp_path / "run")
    run = Run(workdir, jax_cache, "--config.train.total_steps=4", "--config.env.max_restarts=1")
    i = run.wait_for(r"^environment servers: babyai ")
    url = re.search(r"babyai (http://\S+),", run.lines[i]).group(1)
    # 1st kill, while one of step 2's BabyAI episodes is in flight (checked with the trainer
    # paused: a kill raced against the progress line can land after the rollout, as it did in
    # CI once): restarted, those episodes env_error
    step2 = run.wait_for(r"^step 2/4 rollout \(horizon 2\): ")
    (babyai,) = children(run.proc.pid, "environments.babyai")
    kill_server_holding_a_session(run, babyai, url, until=r"^step 2/4 rollout .*: 4/4 episodes")
    restarted = run.wait_for(rf"babyai server {re.escape(url)} restarted \(pid \d+\)", after=step2)
    servers = children(run.proc.pid, "environments.")
    (babyai,) = children(run.proc.pid, "environments.babyai")
    # 2nd kill, during step 3's rollout: no restart left, the run stops after that rollout
    run.wait_for(r"^step 3/4 rollout \(horizon 3\): \d/4 episodes, [1-9]\d* turns", after=restarted)
    os.kill(babyai, signal.SIGKILL)
    assert run.finish() == 3, run.output[-4000:]
    out = run.output
    assert re.search(rf"^W.*\] babyai server {re.escape(url)} died \(exit code -9\); "
                     r"restarting it \(restart 1 of at most 1\)$", out, re.M), out[-4000:]
    # warnings (absl's format: "W1126 12:01:45.024708 ... trainer_eval.py:80] step 3: ...")
    assert re.search(r"^W.*trainer_eval\.py:\d+\] step 2: [1-9] of 4 episodes ended with env_error "
                     r"\(babyai [1-9]\); first error: ", out, re.M), out[-4000:]
    # The run stops at the first step whose rollout meets the dead server: step 3, or step 4
    # when step 3's episodes had all finished before the kill landed (a race with the kill).
    last = out.strip().splitlines()[-1]
    stop = int(re.match(r"run failed: stopped at step (\d+):", last).group(1))
    assert stop in (3, 4), last
    assert last == (
        f"run failed: stopped at step {stop}: babyai server {url} died (exit code -9) after 1 "
        f"restart(s); env.max_restarts=1 reached, not restarting it; the same command resumes "
        f"from the checkpoint of step {stop - 1} (workdir {workdir})")
    metrics = [m for m in rows(os.path.join(workdir, "metrics.jsonl")) if "train/horizon" in m]
    assert [m["step"] for m in metrics] == list(range(1, stop))  # the stop step did not update
    assert metrics[1]["rollout/status/env_error"] >= 1 and metrics[0].get(
        "rollout/status/env_error", 0) == 0
    failed = [t for t in rows(os.path.join(workdir, "trajectories_train.jsonl"))
              if t["status"] == "env_error"]
    assert failed and all(t["env"] == "babyai" and t["error"] for t in failed)
    assert {t["step"] for t in failed} <= set(range(2, stop + 1))  # the steps the dead server hit
    wait_gone(servers)  # every server stopped
