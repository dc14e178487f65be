"""The training loop of a session (``Trainer`` builds it, ``training/rl/trainer.py``).

Each step runs the stages of ``training/rl/stages.py`` in order: rollout (horizon from the
schedule, tasks from the sampler, asynchronous episodes) -> batch (stale, failed and flat
episodes dropped, counted) -> update (``Learner.update``: old / reference logprobs, advantages,
PPO/GRPO updates; then the weight sync to the rollout backend, ``backend.sync_weights``: the
arrays themselves for an engine in this process, an export for servers) -> bookkeeping (metrics
row, history, the step's line); then the periodic evaluation (``Evaluator``) and the checkpoint
(``StopPolicy.save_due``). After a session's first step the heap it made (compiled functions,
the warm engine) is frozen out of the garbage collector's generations (``freeze_heap``). With
``train.max_staleness >= 1`` the next rollout runs during the update (off-policy by at most that
many updates).

SIGTERM (a preempted machine, a job's time limit) during the loop stops it at a safe point: the
rollout in flight is cancelled, an update in progress finishes, the last finished step is
checkpointed (if it was not), and the run ends without its final evaluation
(``stopped = "terminated"``; ``launch/run.py`` prints one line and exits 143); the same command
resumes it. SIGTERM during the opening or the final evaluation cancels that evaluation and
ends the same way (the final step's checkpoint is saved already; the same command evaluates
it again).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import TYPE_CHECKING, Any

from agentrl_common.gc_clock import freeze_heap
from agentrl_jax.agent.actor_pool import ActorPool, TaskRef
from agentrl_jax.training.outputs.progress import ProgressSettings, timed
from agentrl_jax.training.outputs.run_output import RunOutput, SessionEnd, StepRecord
from agentrl_jax.training.rl.failed_steps import FailedSteps, RunFailure
from agentrl_jax.training.rl.plateau import PlateauWatch
from agentrl_jax.training.rl.schedule import HorizonSchedule
from agentrl_jax.training.rl.stages import (RolloutLauncher, RolloutResult, observe_rollout,
                                            record_step, select_batch, step_line)
from agentrl_jax.training.rl.stop_policy import Checkpoints, StopPolicy, cancel
from agentrl_jax.training.rl.task_sampler import TaskSampler
from agentrl_jax.training.rl.trainer_eval import EnvErrorWatch, Evaluator
from agentrl_jax.training.rl.update_stage import LearnerUpdate
from agentrl_jax.training.runtime import distributed, hostmem

if TYPE_CHECKING:
    from agentrl_jax.learner.learner import Learner
    from agentrl_jax.training.config.sections import RunConfig


@dataclasses.dataclass
class RunParts:
    """The collaborators of a run that outlive one session's loop (``Trainer`` owns them)."""

    output: RunOutput
    evaluator: Evaluator
    env_errors: EnvErrorWatch
    stop: StopPolicy
    checkpoints: Checkpoints
    failed_steps: FailedSteps
    schedule: HorizonSchedule
    progress: ProgressSettings


class TrainingLoop:
    """The steps and evaluations of one session over components already set up: ``learner``,
    the rollout ``update`` stage (learner + backend), the actor ``pool``, the task ``sampler``
    (at the resumed cursor) and the evaluation tasks."""

    def __init__(self, cfg: RunConfig, parts: RunParts, learner: Learner,
                 update: LearnerUpdate, pool: ActorPool, sampler: TaskSampler,
                 eval_tasks: list[TaskRef], start_step: int):
        self.cfg, self.parts = cfg, parts
        self.learner, self.update, self.pool, self.sampler = learner, update, pool, sampler
        self.eval_tasks, self.start_step = eval_tasks, start_step
        self.batch_settings = update.settings
        self.plateau = PlateauWatch.from_summary(cfg.train, parts.output.workdir)

    async def run(self) -> dict[str, Any]:
        """The session's steps and evaluations, with SIGTERM caught from the opening evaluation
        to the end of the final one (module docstring); returns the summary."""
        stop = self.parts.stop
        stop.catch_sigterm(True)
        try:
            return await self._session()
        finally:
            stop.catch_sigterm(False)  # from here a SIGTERM ends the process at once

    async def _session(self) -> dict[str, Any]:
        parts, learner, pool, eval_tasks = self.parts, self.learner, self.pool, self.eval_tasks
        stop, evaluator, start_step = parts.stop, parts.evaluator, self.start_step
        total = stop.total_steps
        if evaluator.due_before(start_step, eval_tasks):
            if not await evaluator.evaluate_unless_terminated(stop, pool, eval_tasks, 0,
                                                              learner):
                total = start_step  # SIGTERM during the opening evaluation: no step
        stop.start_clock()
        if stop.budget_spent_before(start_step, total):
            total = start_step
        launcher = RolloutLauncher(self.cfg, pool, self.sampler, parts.schedule, stop,
                                   parts.progress, parts.output.say, total,
                                   weights_version=start_step)
        last_step = await self._steps(launcher, total)
        # the clock of train.max_seconds stops here: the final evaluation is not training
        stop.stop_clock()
        checkpoints = parts.checkpoints
        if stop.terminate_requested:
            stop.stopped = "terminated"
            if last_step > start_step and checkpoints.saved_step != last_step:
                checkpoints.save(learner, last_step, launcher.cursor_before(last_step),
                                 stop.train_seconds(), sampler=launcher.state_before(last_step))
        writes_pending = checkpoints.saved_this_session
        if not stop.terminate_requested and evaluator.due_at_end(last_step, eval_tasks):
            import jax

            if writes_pending and jax.default_backend() == "cpu":
                # in host RAM the write's buffers would add to the evaluation's memory
                with timed(parts.output.say, "finishing checkpoint writes"):
                    learner.wait()
                writes_pending = False
            hostmem.release_freed_memory()
            if not await evaluator.evaluate_unless_terminated(stop, pool, eval_tasks,
                                                              last_step, learner):
                stop.stopped = "terminated"  # the checkpoint of last_step is saved already
        if writes_pending:
            with timed(parts.output.say, "finishing checkpoint writes"):
                learner.wait()
        summary = parts.output.summary(
            SessionEnd(start_step, last_step, stop.stopped, evaluator.evals,
                       stop.train_seconds()),
            final_horizon=parts.schedule.horizon(max(last_step - 1, 0)))
        final = evaluator.final_result(last_step)
        if final is not None and not final.valid:
            raise RunFailure(f"the evaluation at step {last_step} is not a result: "
                             f"{final.describe_failure()}; the same command evaluates it "
                             f"again (workdir {parts.output.workdir})")
        return summary

    async def _steps(self, launcher: RolloutLauncher, total: int) -> int:
        """Steps ``start_step .. total - 1`` (0-based); returns the last step done (1-based)."""
        parts, stop, evaluator = self.parts, self.parts.stop, self.parts.evaluator
        overlap = self.batch_settings.max_staleness >= 1
        start_step = last_step = self.start_step
        for evaluated, result in evaluator.evals:  # the opening evaluation: the curve's start
            self.plateau.observe(evaluated, result)
        pending = launcher.launch(start_step) if start_step < total else None
        for step in range(start_step, total):
            t0 = time.monotonic()
            plateau: str | None = None  # why the held-out curve is flat (stop_on_plateau)
            try:
                rollout: RolloutResult = await pending
            except asyncio.CancelledError:
                if not stop.terminate_requested:
                    raise
                pending = None  # SIGTERM cancelled this rollout: step `step` is not done
                break
            pending = None
            # Overlap: the next rollout runs (with the current weights) while this update trains.
            if overlap and step + 1 < total:
                pending = launcher.launch(step + 1)
            record = await self._train_step(rollout, t0)
            launcher.weights_version = step + 1  # the weights changed, or did not: version s+1
            self._book(record, total)
            if step == start_step:
                # the session's first step compiled the update and warmed the engine; what it
                # made lives as long as the run: out of the collector's reach from here, so a
                # full collection in a later update scans only what that update made
                freeze_heap()
            if evaluator.due_after_step(step + 1, self.eval_tasks):
                if pending is not None:  # evaluate the new weights without a rollout in flight
                    await cancel(pending)
                    pending = None
                    launcher.rewind(step + 1)
                result = await evaluator.evaluate(self.pool, self.eval_tasks, step + 1,
                                                  self.learner)
                self.plateau.observe(step + 1, result)
                flat = step + 1 < total and self.plateau.stops(stop.train_seconds())
                if parts.output.multi_process:  # the clocks differ a little: stop together
                    flat = distributed.agree_any(flat)
                if flat:
                    plateau = self.plateau.describe()
            out_of_time = stop.out_of_time()
            if stop.save_due(step + 1, out_of_time, plateau is not None):
                parts.checkpoints.save(self.learner, step + 1, launcher.cursor_before(step + 1),
                                       stop.train_seconds(),
                                       sampler=launcher.state_before(step + 1))
            last_step = step + 1
            if stop.stop_after(step + 1, out_of_time, plateau):
                break
            if pending is None and step + 1 < total:
                pending = launcher.launch(step + 1)
        if pending is not None:
            await cancel(pending)
        return last_step

    async def _train_step(self, rollout: RolloutResult, t0: float) -> StepRecord:
        """Batch and update stages of one rollout; the failure checks between them."""
        parts = self.parts
        step = rollout.step
        # numbered as everything else: the update these episodes are for (1-based), as the
        # terminal's [step k/n], metrics.jsonl, the checkpoints and the evaluations
        parts.output.log_trajectories(step + 1, rollout.trajectories, "train")
        batch = select_batch(rollout, self.batch_settings, parts.schedule,
                             parts.output.multi_process)
        # train.task_sampling = learnability: the levels' success estimates (before the next
        # draw, or, with an overlapping rollout, the one after it)
        observe_rollout(self.sampler, rollout, parts.output.multi_process)
        resume_hint = parts.checkpoints.resume_hint()
        parts.env_errors.check(step, rollout.trajectories, batch.stats, resume_hint)
        failed = parts.failed_steps.record(batch.usable, batch.stats.statuses,
                                           rollout.trajectories)
        if failed:  # the same cause (e.g. sampling parameters the backend rejects) again
            raise RunFailure(f"stopped at step {step + 1}: {failed}; once that is fixed, "
                             f"{resume_hint} (workdir {parts.output.workdir})")
        update = await self.update.run(batch, parts.stop, parts.checkpoints,
                                       parts.output.workdir)
        return record_step(batch, update.metrics, time.monotonic() - t0)

    def _book(self, record: StepRecord, total: int) -> None:
        """The bookkeeping stage: the metrics row, the history, the step's line."""
        if self.learner.writer is not None:
            self.learner.writer.write(record.step, record.metrics)
        self.parts.output.history.append(record)
        self.parts.output.say(step_line(record, total))
        self.parts.stop.step_done = record.step
