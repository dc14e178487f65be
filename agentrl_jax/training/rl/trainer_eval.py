"""Evaluations during a run and the checks that stop one (``Trainer`` is built on it):
periodic and final evaluations, and the environment-error rate over the last rollouts."""

from __future__ import annotations

import collections
import logging
import time
from typing import Any


from agentrl_jax.agent.actor_pool import ActorPool, RolloutStats, TaskRef
from agentrl_jax.agent.trajectory import STATUS_ENV_ERROR, Trajectory
from agentrl_jax.training.runtime import distributed
from agentrl_jax.training.evaluation.held_out import EvalResult, evaluate, score_trajectories
from agentrl_jax.training.rl.failed_steps import RunFailure
from agentrl_jax.training.outputs.progress import EpisodeProgress, format_seconds

log = logging.getLogger(__name__)


class TrainerEvaluation:
    """Evaluating the policy and watching the environments of :class:`~agentrl_jax.training.rl.trainer.Trainer`."""

    async def _evaluate(self, pool: ActorPool, tasks: list[TaskRef], step: int,
                        learner: Any) -> EvalResult:
        t0 = time.monotonic()
        k = int(self.config.train.eval_samples)
        min_scored = self.config.train.eval_min_scored
        lo, hi = distributed.share(len(tasks))  # this process's tasks (all of them: one process)
        async with EpisodeProgress((hi - lo) * k, f"eval at step {step}", self.progress_mode,
                                   self.progress_seconds, self._say,
                                   counter=self.turn_counter) as progress:
            result, trajectories = await evaluate(pool, tasks[lo:hi], k=k,
                                                  horizon=int(self.config.train.eval_horizon),
                                                  policy_version=step,
                                                  seed=distributed.sampling_seed(self.config.seed),
                                                  progress=progress, min_scored=min_scored)
        if self.multi_process:
            for t in trajectories:
                t.group_id += lo
            result = score_trajectories(distributed.global_records(trajectories), k, min_scored)
        self._log_trajectories(step, trajectories, "eval")
        metrics = result.as_metrics()
        metrics["eval/seconds"] = time.monotonic() - t0
        if learner.writer is not None:
            learner.writer.write(step, metrics)
        self.evals.append((step, result))
        if not result.valid:
            log.warning("evaluation at step %d is not a result: %s (train.eval_min_scored=%g)",
                        step, result.describe_failure(), min_scored)
            self._say(f"[eval step {step}] NOT A RESULT: {result.describe_failure()}; "
                      f"{len(trajectories)} episodes in {format_seconds(metrics['eval/seconds'])}")
            return result
        self._say(f"[eval step {step}] {result.describe_scores()} over {result.num_tasks} tasks "
                  f"x {k} ({len(trajectories)} episodes, dropped {result.dropped}) in "
                  f"{format_seconds(metrics['eval/seconds'])}")
        return result

    def _check_env_errors(self, step: int, trajectories: list[Trajectory],
                          stats: RolloutStats) -> None:
        """Warn about the env_error episodes of ``step``'s rollout; raise ``RunFailure`` when
        an environment server is dead for good or the env_error rate over the last
        ``train.env_error_window`` rollouts exceeds ``train.max_env_error_rate``. ``stats``:
        the global rollout statistics (the same on every process)."""
        errors = int(stats.statuses.get(STATUS_ENV_ERROR, 0))
        failed = [t for t in trajectories if t.status == STATUS_ENV_ERROR]
        if errors:
            per_env = collections.Counter(t.env for t in failed)
            log.warning("step %d: %d of %d episodes ended with env_error (%s); first error: %s",
                        step + 1, errors, stats.episodes,
                        ", ".join(f"{env} {n}" for env, n in sorted(per_env.items())) or "other "
                        "processes", failed[0].error if failed else "on another process")
        self._env_errors.append((errors, int(stats.episodes)))
        dead = self.supervisor.failures if self.supervisor is not None else []
        if self.multi_process:
            dead = [line for lines in distributed.allgather_objects(dead) for line in lines]
        resume = (f"the same command resumes from the checkpoint of step {self.saved_step}"
                  if self.saved_step else "the same command starts it again")
        if dead:
            raise RunFailure(f"stopped at step {step + 1}: {'; '.join(dead)}; {resume} "
                             f"(workdir {self.workdir})")
        total_errors = sum(e for e, _ in self._env_errors)
        total = sum(n for _, n in self._env_errors)
        max_rate = self.config.train.max_env_error_rate
        if total and total_errors / total > max_rate:
            raise RunFailure(
                f"stopped at step {step + 1}: {total_errors} of {total} episodes of the last "
                f"{len(self._env_errors)} rollout(s) ended with env_error (rate "
                f"{total_errors / total:.2f} > train.max_env_error_rate={max_rate:g}); last "
                f"error: {failed[-1].error if failed else 'on another process'}; {resume} "
                f"(workdir {self.workdir})")
