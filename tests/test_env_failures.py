"""Dead environment servers. Before: the run went on, skipped the family without a warning,
evaluated "over 2 tasks" (or "over 0 tasks") and exited 0.

Now: a server started by the launcher that dies is restarted on its port, up to
``env.max_restarts`` times, then given up on; the trainer warns about ``env_error`` episodes and
stops the run (``RunFailure``, exit code 3 from ``launch/run.py``) when a server is dead for good
or the env_error rate over a window of rollouts is too high; an evaluation that scored too few
tasks is not a result (no success number). The whole-run version (a server killed with SIGKILL
in the middle of a smoke run) is in ``tests/test_kill_resume.py``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
import urllib.request

import pytest

from agentrl_jax.agent.actor_pool import summarize
from agentrl_jax.agent.trajectory import Trajectory
from agentrl_jax.training.config.experiment import base_config
from agentrl_jax.training.evaluation.held_out import score_trajectories
from agentrl_common.processes import ServerSupervisor, start_env_server
from agentrl_jax.training.rl.failed_steps import RunFailure
from agentrl_jax.training.rl.trainer import Trainer


def _health(url: str) -> dict:
    with urllib.request.urlopen(url + "/health", timeout=5) as response:
        return json.loads(response.read())


def _wait(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_supervisor_restarts_a_killed_server_on_its_port_then_gives_up():
    server = start_env_server("babyai")
    events: list[str] = []
    try:
        with ServerSupervisor([server], max_restarts=1, poll_interval=0.1,
                              on_event=events.append) as supervisor:
            url, first_pid = server.url, server.pid
            assert _health(url)["status"] == "ok"
            os.kill(first_pid, signal.SIGKILL)
            _wait(lambda: server.restarts == 1 and server.alive() and any(
                "restarted" in e for e in events))
            assert server.pid != first_pid and server.url == url  # same port, new process
            assert _health(url)["status"] == "ok"
            assert server.previous_exit_codes == [-signal.SIGKILL]
            assert supervisor.failures == []
            os.kill(server.pid, signal.SIGKILL)  # the second death: no restart left
            _wait(lambda: supervisor.failures)
            time.sleep(0.3)  # a few more polls: nothing is restarted
            assert not server.alive() and server.restarts == 1
        assert supervisor.failures == [
            f"babyai server {url} died (exit code -9) after 1 restart(s); env.max_restarts=1 "
            "reached, not restarting it"]
        assert events[0] == (f"babyai server {url} died (exit code -9); restarting it "
                             "(restart 1 of at most 1)")
        assert events[1].startswith(f"babyai server {url} restarted (pid ")
        assert events[2] == supervisor.failures[0] and len(events) == 3
    finally:
        server.stop()
    assert not server.alive()


def _traj(env: str, task: str, status: str = "done", reward: float = 0.0) -> Trajectory:
    t = Trajectory(env=env, task_id=task, group_id=0, sample_index=0, status=status,
                   reward=reward, error=f"step: {env} is gone" if status == "env_error" else None)
    t.success = reward > 0
    return t


def test_an_evaluation_without_scored_tasks_is_not_a_result():
    # 4 tasks x k=2: babyai's server died, so both of its tasks have only env_error episodes
    trajs = [_traj("textcraft", "t1", reward=1.0), _traj("textcraft", "t1"),
             _traj("textcraft", "t2"), _traj("textcraft", "t2"),
             *[_traj("babyai", b, "env_error") for b in ("b1", "b1", "b2", "b2")]]
    r = score_trajectories(trajs, k=2)  # default: 90% of the tasks must be scored
    assert (r.tasks_total, r.tasks_scored, r.tasks_failed, r.valid) == (4, 2, 2, False)
    assert r.avg_at_k is None and r.pass_at_k is None and r.mean_reward is None
    assert r.per_env == {} and r.errors == {"env_error": 4} and r.dropped == 4
    assert r.describe_failure() == "only 2 of 4 tasks scored (2 failed; error episodes: " \
                                   "4 env_error)"
    metrics = r.as_metrics()
    assert metrics == {"eval/dropped": 4.0, "eval/tasks_scored": 2.0, "eval/tasks_failed": 2.0,
                       "eval/valid": 0.0}  # no avg@k / pass@k that could pass for a result
    # the same episodes with a lower bar: a result over the 2 scored tasks
    r = score_trajectories(trajs, k=2, min_scored=0.5)
    assert r.valid and r.avg_at_k == pytest.approx(1 / 4) and r.pass_at_k == pytest.approx(1 / 2)
    assert r.as_metrics()["eval/avg@2"] == pytest.approx(1 / 4)
    # every task failed: never a result, whatever the bar
    r = score_trajectories([_traj("babyai", "b1", "env_error")], k=1, min_scored=0.0)
    assert not r.valid and r.tasks_scored == 0 and r.avg_at_k is None
    # an episode error in a task whose other episode finished: the task is scored
    r = score_trajectories([_traj("babyai", "b1", "env_error"), _traj("babyai", "b1", reward=1)],
                           k=2)
    assert r.valid and r.tasks_failed == 0 and r.avg_at_k == 1.0


def _trainer(tmp_path, **train) -> Trainer:
    c = base_config()
    for key, value in train.items():
        c.train[key] = value
    return Trainer(c, str(tmp_path), progress=False)


def test_env_errors_warn_and_stop_the_run_over_the_threshold(tmp_path, caplog):
    trainer = _trainer(tmp_path, max_env_error_rate=0.3, env_error_window=3)
    trainer.checkpoints.saved_step = 4

    def rollout(errors: int, n: int = 8) -> list[Trajectory]:
        return ([_traj("babyai", f"b{i}", "env_error") for i in range(errors)]
                + [_traj("textcraft", f"t{i}") for i in range(n - errors)])

    with caplog.at_level(logging.WARNING, logger="agentrl_jax.training.rl.trainer"):
        for step, errors in enumerate((0, 2, 4)):  # window rates 0, 2/16, 6/24: go on
            trajs = rollout(errors)
            trainer.env_errors.check(step, trajs, summarize(trajs, 1.0),
                                     trainer.checkpoints.resume_hint())
        warnings = [r.getMessage() for r in caplog.records]
    assert warnings == [
        "step 2: 2 of 8 episodes ended with env_error (babyai 2); first error: step: babyai "
        "is gone",
        "step 3: 4 of 8 episodes ended with env_error (babyai 4); first error: step: babyai "
        "is gone"]
    trajs = rollout(6)  # window (steps 2-4): 12 of 24 = 0.5 > 0.3
    with pytest.raises(RunFailure) as failure:
        trainer.env_errors.check(3, trajs, summarize(trajs, 1.0),
                                 trainer.checkpoints.resume_hint())
    assert str(failure.value) == (
        f"stopped at step 4: 12 of 24 episodes of the last 3 rollout(s) ended with env_error "
        f"(rate 0.50 > train.max_env_error_rate=0.3); last error: step: babyai is gone; the "
        f"same command resumes from the checkpoint of step 4 (workdir {tmp_path})")


def test_a_server_dead_for_good_stops_the_run(tmp_path):
    class GaveUp:
        failures = ["babyai server http://127.0.0.1:1 died (exit code -9) after 3 restart(s); "
                    "env.max_restarts=3 reached, not restarting it"]

    trainer = _trainer(tmp_path)
    trainer.env_errors.supervisor = GaveUp()
    trajs = [_traj("textcraft", "t")]
    with pytest.raises(RunFailure, match=r"^stopped at step 1: babyai server http://127.0.0.1:1 "
                                         r"died .*; the same command starts it again"):
        trainer.env_errors.check(0, trajs, summarize(trajs, 1.0),
                                 trainer.checkpoints.resume_hint())
