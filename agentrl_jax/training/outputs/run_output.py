"""What a run writes and prints (``Trainer`` is built on it): ``config.json``, trajectory logs
(rewound to the checkpoint on resume, ``training/outputs/runlog.py``), the session record and summary
(merged with earlier sessions, ``training/outputs/summary.py``) and the terminal's lines."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from typing import Any

import numpy as np

from agentrl_jax.agent.actor_pool import RolloutStats
from agentrl_jax.agent.trajectory import Trajectory
from agentrl_jax.training.outputs import runlog, storage
from agentrl_jax.training.config.experiment import config_json
from agentrl_jax.training.outputs.progress import say_line
from agentrl_jax.training.outputs.trajectory_log import TrajectoryLog
from agentrl_jax.training.outputs.summary import (SUMMARY_FILE, append_session, merge_summary, outcome,
                                          read_summary, write_json_atomic)

log = logging.getLogger(__name__)


@dataclasses.dataclass
class StepRecord:
    step: int
    horizon: int
    rollout: RolloutStats
    metrics: dict[str, float]
    seconds: float



class RunOutput:
    """The files and lines of :class:`~agentrl_jax.training.rl.trainer.Trainer`."""

    def _write_config(self) -> None:
        """``config.json`` of the workdir, without secrets (``rollout.api_key``)."""
        if not self.is_main:
            return
        with open(os.path.join(self.workdir, "config.json"), "w") as f:
            json.dump(config_json(self.config), f, indent=2)

    def _log_trajectories(self, step: int, trajectories: list[Trajectory], kind: str) -> None:
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

    def _rewind_logs(self, step: int) -> None:
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
            self._say(f"logs rewound to step {step}: dropped "
                      + ", ".join(f"{n} rows of {name}" for name, n in dropped.items())
                      + " (written after that checkpoint; those steps run again)")

    def _record_session(self, error: BaseException) -> str | None:
        """Append this session's record, ended by ``error``, to ``summary.json`` (process 0).
        Best effort: returns why it was not written (a full disk), else ``None``."""
        if not self.is_main:
            return None
        start = self.start_step if self.start_step is not None else 0
        record = {**self._session_record(start, max(self.step_done, start)), **outcome(error)}
        return append_session(self.workdir, record)

    def interrupted_message(self) -> str:
        """The line printed when Ctrl-C stops the run."""
        total = int(self.config.train.total_steps)
        where = (f"after step {self.step_done}/{total}" if self.step_done
                 else "before the first training step")
        resume = (f"the same command resumes from the checkpoint of step {self.saved_step}"
                  if self.saved_step else "the same command starts it again")
        return (f"interrupted (Ctrl-C) {where}; environment servers and rollout engine stopped; "
                f"{resume} (workdir {self.workdir})")

    def terminated_message(self) -> str:
        """The line printed when SIGTERM stopped the run (``training/rl/loop.py``)."""
        total = int(self.config.train.total_steps)
        if self.terminated_eval is not None and self.terminated_eval == self.saved_step:
            return (f"stopped by SIGTERM during the final evaluation at step "
                    f"{self.terminated_eval}/{total}; the same command evaluates the checkpoint "
                    f"of step {self.saved_step} again (workdir {self.workdir})")
        resume = (f"the same command resumes from the checkpoint of step {self.saved_step}"
                  if self.saved_step else "the same command starts it again")
        where = (f"during the evaluation at step {self.terminated_eval}, "
                 if self.terminated_eval is not None else "")
        return (f"stopped by SIGTERM {where}after step {self.step_done}/{total}, without the "
                f"final evaluation; {resume} (workdir {self.workdir})")

    def _session_record(self, start_step: int, total: int) -> dict[str, Any]:
        """What this invocation did (one entry of the summary's ``sessions``)."""
        record: dict[str, Any] = {
            "start_step": start_step, "final_step": total, "steps": len(self.history),
            "stopped": (self.stopped if self.history or total > start_step
                        or self.stopped == "terminated" else "evaluate_only"),
            "evals": [step for step, _ in self.evals],
            "seconds": round(time.time() - self._started, 1),
            "ended": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        if self.history:
            record["mean_step_seconds"] = float(np.mean([h.seconds for h in self.history]))
        return record

    def _summary(self, start_step: int, total: int) -> dict[str, Any]:
        summary: dict[str, Any] = {"workdir": self.workdir, "start_step": start_step,
                                   "final_step": total,
                                   "final_horizon": self.schedule.horizon(max(total - 1, 0))}
        if self.history:
            summary["first_reward"] = self.history[0].rollout.mean_reward
            summary["last_reward"] = self.history[-1].rollout.mean_reward
            summary["mean_step_seconds"] = float(np.mean([h.seconds for h in self.history]))
        if self.evals:
            summary["evals"] = {step: dataclasses.asdict(r) for step, r in self.evals}
        if self.multi_process:
            summary["process_count"] = self.process_count
        summary["sessions"] = [self._session_record(start_step, total)]
        summary["train_seconds"] = round(self.train_seconds(), 3)  # all sessions' loops
        # finished: trained to total_steps or to the end of the time budget, with the final
        # evaluation (if any) done; started again, such a run says so and exits (launch/run.py,
        # Trainer.finished_step)
        final_eval = self.evals[-1][1] if self.evals and self.evals[-1][0] == total else None
        if final_eval is not None and not final_eval.valid:
            summary["final_eval_invalid"] = final_eval.describe_failure()
        elif self.stopped != "terminated" and (total >= int(self.config.train.total_steps)
                                               or self.stopped == "time_budget"):
            summary["finished_step"] = total
        if self.is_main:  # merged with what earlier sessions of this workdir wrote
            invalid = "final_eval_invalid" in summary
            summary = merge_summary(read_summary(self.workdir), summary)
            if not invalid:  # an earlier session's invalid final evaluation was redone
                summary.pop("final_eval_invalid", None)
            write_json_atomic(os.path.join(self.workdir, SUMMARY_FILE), summary)
        ended = "stopped by SIGTERM" if self.stopped == "terminated" else "finished"
        lines = [f"run {ended}: steps {start_step}->{total}, final horizon "
                 f"{summary['final_horizon']}"]
        if self.history:
            lines.append(f"  train reward: first step {summary['first_reward']:.3f}, last step "
                         f"{summary['last_reward']:.3f}; {summary['mean_step_seconds']:.1f} s/step")
        for step, r in self.evals:
            lines.append(f"  eval @ step {step}: {r.describe_scores()} ({r.num_tasks} tasks)"
                         if r.valid else
                         f"  eval @ step {step}: not a result: {r.describe_failure()}")
        gz = ".gz" if self.config.train.compress_trajectories else ""
        lines.append(f"  outputs: {self.workdir} (checkpoints/, tensorboard/, metrics.jsonl, "
                     f"trajectories_*.jsonl{gz}, summary.json)")
        self._say("\n".join(lines))
        return summary

    def _say(self, message: str, end: str = "\n") -> None:
        if self.is_main:
            say_line(message, end=end)
        else:
            log.info("[process %d] %s", self.process_index, message)
