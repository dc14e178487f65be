"""Evaluations during a run and the environment-error stop (``Trainer``'s collaborators,
``training/rl/trainer.py``).

:class:`Evaluator` owns the held-out evaluations of a run: when (``train.eval_before``, every
``train.eval_every`` steps, ``train.eval_after``), what (``train.eval_samples`` episodes of
each evaluation task at ``train.eval_horizon`` turns) and how they are recorded (the
``eval`` trajectory log, ``eval/*`` metrics, one terminal line, ``evals``).
:class:`EnvErrorWatch` owns the environment-error rate over the last rollouts and stops a run
whose environment servers fail.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import TYPE_CHECKING, Sequence

from agentrl_jax.agent.actor_pool import ActorPool, RolloutStats, TaskRef
from agentrl_jax.agent.trajectory import STATUS_ENV_ERROR, Trajectory
from agentrl_jax.training.runtime import distributed
from agentrl_jax.training.evaluation.held_out import EvalResult, evaluate, score_trajectories
from agentrl_jax.training.rl.failed_steps import RunFailure
from agentrl_jax.training.rl.stop_policy import StopPolicy
from agentrl_jax.training.outputs.progress import (EpisodeProgress, ProgressSettings,
                                                   format_seconds)
from agentrl_jax.training.outputs.run_output import RunOutput

if TYPE_CHECKING:
    from agentrl_common.processes import ServerSupervisor
    from agentrl_jax.learner.learner import Learner
    from agentrl_jax.training.config.sections import RunConfig

log = logging.getLogger(__name__)


class Evaluator:
    """The held-out evaluations of a run; ``evals``: ``(step, result)`` in the order run."""

    def __init__(self, config: RunConfig, output: RunOutput, progress: ProgressSettings,
                 eval_again: bool = False):
        self.config = config
        self.output = output
        self.progress = progress
        self.eval_again = eval_again  # a finished run evaluates its final policy again
        self.evals: list[tuple[int, EvalResult]] = []
        self.terminated_eval: int | None = None  # the step of an evaluation SIGTERM cut short

    def due_before(self, start_step: int, tasks: Sequence[TaskRef]) -> bool:
        """The opening evaluation runs: a new run (step 0) with ``train.eval_before``."""
        return bool(self.config.train.eval_before and start_step == 0 and tasks)

    def due_after_step(self, step: int, tasks: Sequence[TaskRef]) -> bool:
        """Step ``step`` (1-based, just trained) is evaluated: every ``train.eval_every``."""
        every = self.config.train.eval_every
        return bool(every and step % every == 0 and tasks)

    def due_at_end(self, last_step: int, tasks: Sequence[TaskRef]) -> bool:
        """The final evaluation runs (``train.eval_after`` or ``--eval_again``) unless the
        last step was evaluated already."""
        return bool((self.config.train.eval_after or self.eval_again) and tasks
                    and not (self.evals and self.evals[-1][0] == last_step))

    def final_result(self, last_step: int) -> EvalResult | None:
        """The evaluation of ``last_step`` if it was the last one run, else None."""
        if self.evals and self.evals[-1][0] == last_step:
            return self.evals[-1][1]
        return None

    async def evaluate_unless_terminated(self, stop: StopPolicy, pool: ActorPool,
                                         tasks: list[TaskRef], step: int,
                                         learner: Learner) -> bool:
        """:meth:`evaluate` as a task that SIGTERM cancels; False when it did
        (``terminated_eval`` then names the step of the evaluation cut short)."""
        if await stop.cancellable(self.evaluate(pool, tasks, step, learner)):
            return True
        self.terminated_eval = step
        return False

    async def evaluate(self, pool: ActorPool, tasks: list[TaskRef], step: int,
                       learner: Learner) -> EvalResult:
        """Evaluate the policy of ``step`` on ``tasks`` (this process's share of them), log
        its episodes and metrics, print its line and record it in ``evals``."""
        t0 = time.monotonic()
        config, say = self.config, self.output.say
        k = int(config.train.eval_samples)
        min_scored = config.train.eval_min_scored
        lo, hi = distributed.share(len(tasks))  # this process's tasks (all of them: one process)
        async with EpisodeProgress((hi - lo) * k, f"eval at step {step}", self.progress.mode,
                                   self.progress.seconds, say,
                                   counter=self.progress.turn_counter) as progress:
            result, trajectories = await evaluate(pool, tasks[lo:hi], k=k,
                                                  horizon=int(config.train.eval_horizon),
                                                  policy_version=step,
                                                  seed=distributed.sampling_seed(config.seed),
                                                  progress=progress, min_scored=min_scored)
        if self.output.multi_process:
            for t in trajectories:
                t.group_id += lo
            result = score_trajectories(distributed.global_records(trajectories), k, min_scored)
        self.output.log_trajectories(step, trajectories, "eval")
        metrics = result.as_metrics()
        metrics["eval/seconds"] = time.monotonic() - t0
        if learner.writer is not None:
            learner.writer.write(step, metrics)
        self.evals.append((step, result))
        if not result.valid:
            log.warning("evaluation at step %d is not a result: %s (train.eval_min_scored=%g)",
                        step, result.describe_failure(), min_scored)
            say(f"[eval step {step}] NOT A RESULT: {result.describe_failure()}; "
                f"{len(trajectories)} episodes in {format_seconds(metrics['eval/seconds'])}")
            return result
        say(f"[eval step {step}] {result.describe_scores()} over {result.num_tasks} tasks "
            f"x {k} ({len(trajectories)} episodes, dropped {result.dropped}) in "
            f"{format_seconds(metrics['eval/seconds'])}")
        return result


class EnvErrorWatch:
    """The env_error episodes of the last ``train.env_error_window`` rollouts and the
    environment servers' supervisor (``supervisor.failures``: servers dead for good)."""

    def __init__(self, config: RunConfig, workdir: str, multi_process: bool = False):
        self.max_rate = config.train.max_env_error_rate
        self.workdir = workdir
        self.multi_process = multi_process
        # restarts the environment servers started here (None: none was)
        self.supervisor: ServerSupervisor | None = None
        # (env_error episodes, episodes) of the last train.env_error_window rollouts
        self.window: collections.deque[tuple[int, int]] = collections.deque(
            maxlen=config.train.env_error_window)

    def check(self, step: int, trajectories: list[Trajectory], stats: RolloutStats,
              resume_hint: str) -> None:
        """Warn about the env_error episodes of ``step``'s rollout (0-based); raise
        ``RunFailure`` when an environment server is dead for good or the env_error rate over
        the last ``train.env_error_window`` rollouts exceeds ``train.max_env_error_rate``.
        ``stats``: the global rollout statistics (the same on every process); ``resume_hint``:
        how the same command goes on (``Checkpoints.resume_hint``)."""
        errors = int(stats.statuses.get(STATUS_ENV_ERROR, 0))
        failed = [t for t in trajectories if t.status == STATUS_ENV_ERROR]
        if errors:
            per_env = collections.Counter(t.env for t in failed)
            log.warning("step %d: %d of %d episodes ended with env_error (%s); first error: %s",
                        step + 1, errors, stats.episodes,
                        ", ".join(f"{env} {n}" for env, n in sorted(per_env.items())) or "other "
                        "processes", failed[0].error if failed else "on another process")
        self.window.append((errors, int(stats.episodes)))
        dead = self.supervisor.failures if self.supervisor is not None else []
        if self.multi_process:
            dead = [line for lines in distributed.allgather_objects(dead) for line in lines]
        if dead:
            raise RunFailure(f"stopped at step {step + 1}: {'; '.join(dead)}; {resume_hint} "
                             f"(workdir {self.workdir})")
        total_errors = sum(e for e, _ in self.window)
        total = sum(n for _, n in self.window)
        if total and total_errors / total > self.max_rate:
            raise RunFailure(
                f"stopped at step {step + 1}: {total_errors} of {total} episodes of the last "
                f"{len(self.window)} rollout(s) ended with env_error (rate "
                f"{total_errors / total:.2f} > train.max_env_error_rate={self.max_rate:g}); "
                f"last error: {failed[-1].error if failed else 'on another process'}; "
                f"{resume_hint} (workdir {self.workdir})")
