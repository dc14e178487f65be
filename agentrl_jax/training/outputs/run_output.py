"""What a run writes and prints (``RunOutput``, a collaborator of ``Trainer``): ``config.json``,
trajectory logs (rewound to the checkpoint on resume, ``training/outputs/runlog.py``), the step
records of this session, the session record and summary (merged with earlier sessions,
``training/outputs/summary.py``) and the terminal's lines."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from agentrl_jax.agent.actor_pool import RolloutStats
from agentrl_jax.agent.trajectory import Trajectory
from agentrl_jax.training.evaluation.held_out import EvalResult
from agentrl_jax.training.outputs import runlog, storage
from agentrl_jax.training.config.experiment import config_json
from agentrl_jax.training.outputs.progress import say_line
from agentrl_jax.training.outputs.code_version import code_version
from agentrl_jax.training.outputs.trajectory_log import TrajectoryLog
from agentrl_jax.training.outputs.summary import (SUMMARY_FILE, append_session, merge_summary, outcome,
                                          read_summary, write_json_atomic)

if TYPE_CHECKING:
    from agentrl_jax.training.config.sections import RunConfig

log = logging.getLogger(__name__)


@dataclasses.dataclass
class StepRecord:
    """One finished training step of this session (the bookkeeping stage's output).

    ``step``: 1-based (as ``[step k/n]``, metrics.jsonl and the checkpoints); ``horizon``: its
    rollout's turn limit; ``rollout``: the rollout's statistics over every process;
    ``metrics``: what was written for the step; ``seconds``: the step's wall time."""

    step: int
    horizon: int
    rollout: RolloutStats
    metrics: dict[str, float]
    seconds: float


@dataclasses.dataclass
class SessionEnd:
    """Where a session stands when its record is written: steps ``start_step -> final_step``,
    why it stopped (``total_steps | time_budget | terminated``), its evaluations and the
    seconds of training over every session of the run."""

    start_step: int
    final_step: int
    stopped: str
    evals: list[tuple[int, EvalResult]]
    train_seconds: float = 0.0


def interrupted_message(step_done: int, total: int, resume_hint: str, workdir: str) -> str:
    """The line printed when Ctrl-C stops the run after ``step_done`` of ``total`` steps."""
    where = (f"after step {step_done}/{total}" if step_done
             else "before the first training step")
    return (f"interrupted (Ctrl-C) {where}; environment servers and rollout engine stopped; "
            f"{resume_hint} (workdir {workdir})")


def terminated_message(step_done: int, total: int, saved_step: int | None,
                       terminated_eval: int | None, resume_hint: str, workdir: str) -> str:
    """The line printed when SIGTERM stopped the run (``training/rl/loop.py``)."""
    if terminated_eval is not None and terminated_eval == saved_step:
        return (f"stopped by SIGTERM during the final evaluation at step "
                f"{terminated_eval}/{total}; the same command evaluates the checkpoint "
                f"of step {saved_step} again (workdir {workdir})")
    where = (f"during the evaluation at step {terminated_eval}, "
             if terminated_eval is not None else "")
    return (f"stopped by SIGTERM {where}after step {step_done}/{total}, without the "
            f"final evaluation; {resume_hint} (workdir {workdir})")


class RunOutput:
    """The files and lines of one process of a run in ``workdir``; ``history``: the
    :class:`StepRecord` of each step this session trained."""

    def __init__(self, config: RunConfig, workdir: str, process_index: int = 0,
                 process_count: int = 1, eval_again: bool = False):
        self.config = config
        self.workdir = workdir
        self.process_index = process_index
        self.process_count = process_count
        self.multi_process = process_count > 1
        self.is_main = process_index == 0
        self.eval_again = eval_again
        self.history: list[StepRecord] = []
        self._started = time.time()

    def write_config(self) -> None:
        """``config.json`` of the workdir, without secrets (``rollout.api_key``)."""
        if not self.is_main:
            return
        with open(os.path.join(self.workdir, "config.json"), "w") as f:
            json.dump(config_json(self.config), f, indent=2)

    def log_trajectories(self, step: int, trajectories: list[Trajectory], kind: str) -> None:
        """Append ``step``'s episodes to this process's ``kind`` log: every evaluation episode,
        ``train.trajectory_share`` of the training groups (``training/outputs/trajectory_log.py``)."""
        train = self.config.train
        log = TrajectoryLog(self.workdir,
                            f".process{self.process_index}" if self.multi_process else "",
                            train.trajectory_share, train.compress_trajectories)
        path = log.path(kind)
        try:
            log.write(step, trajectories, kind)
        except OSError as error:  # a failed write of an open file names no file
            if error.filename:
                raise
            raise storage.with_path(error, path) from error

    def rewind_logs(self, step: int) -> None:
        """Rewind this process's per-step logs to checkpoint ``step`` (``training/outputs/runlog.py``);
        the evaluation of ``step`` is dropped too when this session runs it again (the opening
        evaluation of a run at step 0, the final one of a run killed during it)."""
        train = self.config.train
        evaluates = train.eval_tasks > 0
        redo_eval = evaluates and (
            step == 0 and train.eval_before
            or step >= train.total_steps and train.eval_after
            and not self.eval_again)
        suffix = f".process{self.process_index}" if self.multi_process else ""
        dropped = runlog.rewind_run_logs(self.workdir, step, redo_eval, metrics=self.is_main,
                                         trajectory_suffix=suffix)
        if dropped:
            self.say(f"logs rewound to step {step}: dropped "
                     + ", ".join(f"{n} rows of {name}" for name, n in dropped.items())
                     + " (written after that checkpoint; those steps run again)")

    def record_session(self, error: BaseException, end: SessionEnd) -> str | None:
        """Append this session's record, ended by ``error``, to ``summary.json`` (process 0).
        Best effort: returns why it was not written (a full disk), else ``None``."""
        if not self.is_main:
            return None
        return append_session(self.workdir, {**self.session_record(end), **outcome(error)})

    def session_record(self, end: SessionEnd) -> dict[str, Any]:
        """What this invocation did (one entry of the summary's ``sessions``), with the code it
        ran (``code``: ``training/outputs/code_version.py``)."""
        record: dict[str, Any] = {
            "start_step": end.start_step, "final_step": end.final_step,
            "steps": len(self.history),
            "stopped": (end.stopped if self.history or end.final_step > end.start_step
                        or end.stopped == "terminated" else "evaluate_only"),
            "evals": [step for step, _ in end.evals],
            "seconds": round(time.time() - self._started, 1),
            "ended": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "code": code_version()}
        if self.history:
            record["mean_step_seconds"] = float(np.mean([h.seconds for h in self.history]))
        return record

    def summary(self, end: SessionEnd, final_horizon: int) -> dict[str, Any]:
        """The summary of this session (process 0 merges it into ``summary.json`` with the
        earlier sessions' and writes it), printed as a few lines; ``final_horizon``: the turn
        limit of the last step."""
        start_step, total, evals = end.start_step, end.final_step, end.evals
        summary: dict[str, Any] = {"workdir": self.workdir, "start_step": start_step,
                                   "final_step": total, "final_horizon": final_horizon}
        if self.history:
            summary["first_reward"] = self.history[0].rollout.mean_reward
            summary["last_reward"] = self.history[-1].rollout.mean_reward
            summary["mean_step_seconds"] = float(np.mean([h.seconds for h in self.history]))
        if evals:
            summary["evals"] = {step: dataclasses.asdict(r) for step, r in evals}
        if self.multi_process:
            summary["process_count"] = self.process_count
        summary["sessions"] = [self.session_record(end)]
        summary["train_seconds"] = round(end.train_seconds, 3)  # all sessions' loops
        # finished: trained to total_steps, to the end of the time budget or to a flat held-out
        # curve (train.stop_on_plateau), with the final
        # evaluation (if any) done; started again, such a run says so and exits (launch/run.py,
        # Trainer.finished_step)
        final_eval = evals[-1][1] if evals and evals[-1][0] == total else None
        if final_eval is not None and not final_eval.valid:
            summary["final_eval_invalid"] = final_eval.describe_failure()
        elif end.stopped != "terminated" and (total >= int(self.config.train.total_steps)
                                              or end.stopped in ("time_budget", "plateau")):
            summary["finished_step"] = total
        if self.is_main:  # merged with what earlier sessions of this workdir wrote
            invalid = "final_eval_invalid" in summary
            summary = merge_summary(read_summary(self.workdir), summary)
            if not invalid:  # an earlier session's invalid final evaluation was redone
                summary.pop("final_eval_invalid", None)
            write_json_atomic(os.path.join(self.workdir, SUMMARY_FILE), summary)
        ended = "stopped by SIGTERM" if end.stopped == "terminated" else "finished"
        lines = [f"run {ended}: steps {start_step}->{total}, final horizon "
                 f"{summary['final_horizon']}"]
        if self.history:
            lines.append(f"  train reward: first step {summary['first_reward']:.3f}, last step "
                         f"{summary['last_reward']:.3f}; {summary['mean_step_seconds']:.1f} s/step")
        for step, r in evals:
            lines.append(f"  eval @ step {step}: {r.describe_scores()} ({r.num_tasks} tasks)"
                         if r.valid else
                         f"  eval @ step {step}: not a result: {r.describe_failure()}")
        gz = ".gz" if self.config.train.compress_trajectories else ""
        lines.append(f"  outputs: {self.workdir} (checkpoints/, tensorboard/, metrics.jsonl, "
                     f"trajectories_*.jsonl{gz}, summary.json)")
        self.say("\n".join(lines))
        return summary

    def say(self, message: str, end: str = "\n") -> None:
        """Print ``message`` (process 0; the others log it with their index)."""
        if self.is_main:
            say_line(message, end=end)
        else:
            log.info("[process %d] %s", self.process_index, message)
