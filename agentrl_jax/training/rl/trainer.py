"""The RL trainer: sets a run up, runs it, records how it ended.

``Trainer`` converts the config ONCE (to the typed ``RunConfig``) and is composed of
collaborators that own their state: ``output`` (``RunOutput``, training/outputs/run_output.py:
config.json, logs, step history, summary, printed lines), ``evaluator`` (``Evaluator``,
training/rl/trainer_eval.py: the held-out evaluations, when, what, how recorded),
``env_errors`` (``EnvErrorWatch``: the environment-error stop), ``stop`` (``StopPolicy``,
training/rl/stop_policy.py: time budget, SIGTERM, non-finite stop, the last step done),
``checkpoints`` (``Checkpoints``: the last checkpoint and its saves), ``failed_steps``
(training/rl/failed_steps.py) and ``schedule`` (the horizons). The loop itself
(training/rl/loop.py) runs the typed stages of training/rl/stages.py and
training/rl/update_stage.py; ``training/runtime/policy.py`` loads the policy and the learner.
Resuming restores params, optimizer, step and task cursor; the horizon is a pure function of
the step, so it resumes exactly.

Several JAX processes (``launch/run.py --distributed``, one per host) run as one big run
(``training/runtime/distributed.py``): every process draws the same global task list, rolls out a
contiguous block of its groups on its own environment servers and engine, and passes its share
to ``Learner.update(..., process_local=True)`` with globally unique group ids; the updated
parameters are gathered onto each host's devices for its embedded engine; rollout and
evaluation numbers are aggregated over processes. Process 0 alone writes config.json,
metrics (TensorBoard / metrics.jsonl), summary.json and prints progress; every process writes
its own trajectories to ``trajectories_<kind>.process<i>.jsonl`` (one process:
``trajectories_<kind>.jsonl``); all processes take part in orbax checkpoints.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from typing import TYPE_CHECKING, Any

from agentrl_jax import compile_notice
from agentrl_jax.agent.actor_pool import ActorPool, TaskRef
from agentrl_jax.training.runtime import distributed, services
from agentrl_jax.training.outputs import runlog, storage
from agentrl_jax.training.config.experiment import ConfigSource, model_label, to_run_config
from agentrl_jax.training.evaluation.held_out import EvalResult
from agentrl_jax.training.rl.failed_steps import FailedSteps, RunFailure
from agentrl_jax.training.rl.loop import RunParts, TrainingLoop
from agentrl_jax.training.rl.plateau import PlateauWatch
from agentrl_jax.training.rl.stages import BatchSettings
from agentrl_jax.training.rl.stop_policy import Checkpoints, StopPolicy
from agentrl_jax.training.rl.update_stage import LearnerUpdate
from agentrl_jax.training.runtime.policy import (LearnerWeights, checkpoint_steps,
                                                 engine_policy, load_learner)
from agentrl_jax.training.outputs.progress import (BAR, LINES, OFF, ProgressSettings,
                                                   TurnCounter, timed)
from agentrl_jax.training.outputs.run_output import (RunOutput, SessionEnd, StepRecord,
                                                     interrupted_message, terminated_message)
from agentrl_jax.training.rl.schedule import HorizonSchedule, scored_tokens_bound
from agentrl_jax.training.outputs.summary import read_summary
from agentrl_jax.training.rl.task_sampler import TaskSampler, make_task_sampler
from agentrl_jax.training.rl.trainer_eval import EnvErrorWatch, Evaluator

if TYPE_CHECKING:
    from agentrl_jax.learner.ahead import AheadCompile
    from agentrl_jax.learner.learner import Learner
    from agentrl_jax.rollout.contract import RolloutBackend

log = logging.getLogger(__name__)


class Trainer:
    """Owns the collaborators of a run (module docstring); ``run()`` trains and returns a
    summary dict."""

    def __init__(self, config: ConfigSource, workdir: str, progress: bool = True,
                 eval_again: bool = False):
        """``progress=False``: no per-episode progress (bars or lines); ``eval_again``: a run
        that already finished evaluates its final policy again (see :meth:`finished_step`)."""
        config = self.config = to_run_config(config)  # the one conversion of the run
        self.workdir = os.path.abspath(workdir)
        self.process_index = distributed.process_index()
        self.process_count = distributed.process_count()
        self.multi_process = self.process_count > 1
        self.is_main = self.process_index == 0
        show_bar = self.is_main and (progress and sys.stderr.isatty() or config.progress)
        # per-episode progress of rollouts and evaluations: a bar on a terminal, else lines
        self.progress = ProgressSettings(
            BAR if show_bar else LINES if self.is_main and progress else OFF,
            config.progress_seconds)
        self.eval_again = eval_again
        self.start_step: int | None = None  # the step this session started (or resumed) at
        self.learner: Learner | None = None
        self.backend: RolloutBackend | None = None
        self._ahead_compile: AheadCompile | None = None  # on accelerators (learner/ahead.py)
        os.makedirs(self.workdir, exist_ok=True)
        self.output = RunOutput(config, self.workdir, self.process_index, self.process_count,
                                eval_again)
        self.evaluator = Evaluator(config, self.output, self.progress, eval_again)
        self.env_errors = EnvErrorWatch(config, self.workdir, self.multi_process)
        self.stop = StopPolicy(config.train, self.output.say, self.multi_process)
        self.checkpoints = Checkpoints(self.output.say)
        self.failed_steps = FailedSteps(config.train.max_failed_steps)
        self.schedule = HorizonSchedule.from_config(config.horizon)

    # ------------------------------------------------------------------ how the session stands
    @property
    def stopped(self) -> str:
        """Why training ended: ``total_steps | time_budget | terminated``."""
        return self.stop.stopped

    @property
    def step_done(self) -> int:
        """The last training step finished in this process."""
        return self.stop.step_done

    @property
    def saved_step(self) -> int | None:
        """The last checkpoint step saved or restored (None: none)."""
        return self.checkpoints.saved_step

    @property
    def evals(self) -> list[tuple[int, EvalResult]]:
        """The evaluations of this session: ``(step, result)``."""
        return self.evaluator.evals

    @property
    def history(self) -> list[StepRecord]:
        """The steps this session trained."""
        return self.output.history

    def interrupted_message(self) -> str:
        """The line printed when Ctrl-C stops the run."""
        return interrupted_message(self.step_done, int(self.config.train.total_steps),
                                   self.checkpoints.resume_hint(), self.workdir)

    def terminated_message(self) -> str:
        """The line printed when SIGTERM stopped the run (``training/rl/loop.py``)."""
        return terminated_message(self.step_done, int(self.config.train.total_steps),
                                  self.saved_step, self.evaluator.terminated_eval,
                                  self.checkpoints.resume_hint(), self.workdir)

    def finished_step(self) -> int | None:
        """The final step if this workdir holds a finished run of this config, else None.

        Finished: ``summary.json`` says the run ended with its final evaluation done, at step
        >= ``train.total_steps``, with its time budget spent (``train_seconds`` >=
        ``train.max_seconds``: the budget counts every session of the run; a larger
        ``train.max_seconds`` trains on) or with a held-out curve that is flat by this
        config's ``train.stop_on_plateau`` rule (its evaluations in ``summary.json``; a larger
        patience, or 0, trains on), and that step's checkpoint exists. With several processes,
        process 0's answer (it alone writes the summary) holds for all.
        """
        summary = read_summary(self.workdir)
        step = summary.get("finished_step")
        train = self.config.train
        max_seconds = float(train.max_seconds)
        trained = summary.get("train_seconds")
        budget_spent = bool(max_seconds) and isinstance(trained, (int, float)) and (
            trained >= max_seconds)
        flat = isinstance(trained, (int, float)) and PlateauWatch.of_config(
            train, summary.get("evals")).stops(trained)
        finished = (isinstance(step, int)
                    and (step >= int(train.total_steps) or budget_spent or flat)
                    and step in checkpoint_steps(os.path.join(self.workdir, "checkpoints")))
        answer = step if finished else None
        if self.multi_process:
            answer = distributed.allgather_objects([answer])[0][0]
        return answer

    def run(self) -> dict[str, Any]:
        """Train (resuming from the workdir's checkpoint) and return the summary.

        However the session ends, ``summary.json`` gets its record (``training/outputs/summary.py``).
        A failed checkpoint save or a refused write (a full disk) is raised as one line, a
        :class:`~agentrl_jax.training.outputs.storage.StorageFailure`, after the servers stopped and
        the partial checkpoint was removed; orbax's tracebacks of it are kept out of the log.
        """
        quiet = storage.quiet_storage_errors()
        try:
            return asyncio.run(self._run())
        except BaseException as error:
            failure = self._storage_failure(error)
            start = self.start_step if self.start_step is not None else 0
            problem = self.output.record_session(failure or error, SessionEnd(
                start, max(self.step_done, start), self.stopped, self.evals))
            if failure is not None:  # on a full disk the summary may be refused too
                raise (storage.StorageFailure(f"{failure}; {problem}") if problem
                       else failure) from None
            if problem:
                log.warning("%s", problem)
            raise
        finally:
            storage.unquiet(quiet)

    async def _task_lists(self, clients: dict[str, Any]) -> tuple[list[TaskRef], list[TaskRef]]:
        """(train tasks, evaluation tasks) from the environment servers; a server that cannot
        be reached or answers badly, or a task filter that keeps nothing, is a
        :class:`RunFailure` (one line) before the rollout backend starts."""
        from environments.core.client import EnvConnectionError, EnvServerError

        cfg = self.config
        filters = services.task_filters(cfg)
        try:
            train = await services.task_refs(clients, "train", filters=filters)
            evaluation = await services.task_refs(clients, cfg.train.eval_split,
                                                  int(cfg.train.eval_tasks), filters=filters,
                                                  sample=cfg.train.eval_sample)
        except (EnvConnectionError, EnvServerError, ValueError) as error:
            timeout = ("" if isinstance(error, ValueError)  # a task filter that keeps nothing
                       else f" (env.timeout={cfg.env.timeout:g} s)")
            raise RunFailure(f"cannot list the tasks of the environment servers: {error}"
                             f"{timeout}; nothing was trained (workdir {self.workdir})") from None
        return train, evaluation

    def _start_backend(self, policy: Any, tokenizer: Any, model_path: str | None) -> Any:
        """The rollout backend of the config (``services.make_backend``); an engine whose KV
        cache cannot fit its device's free memory is a :class:`RunFailure` (one line, before
        any step) instead of a traceback."""
        from agentrl_jax.rollout.engine.kv_memory import KVCacheDoesNotFit

        try:
            return services.make_backend(self.config, policy, tokenizer, model_path)
        except KVCacheDoesNotFit as error:
            raise RunFailure(f"cannot start the rollout engine: {error}; nothing was trained "
                             f"(workdir {self.workdir})") from None

    def _storage_failure(self, error: BaseException) -> storage.StorageFailure | None:
        """``error`` as a one-line ``StorageFailure`` when it is a failed checkpoint save or a
        refused write; the partial checkpoint it left is removed first."""
        if isinstance(error, storage.StorageFailure):
            return error
        if not isinstance(error, Exception):
            return None
        checkpoints = os.path.join(self.workdir, "checkpoints")
        message = storage.failure_message(
            error, step_done=max(self.step_done, self.start_step or 0),
            total=int(self.config.train.total_steps),
            last_checkpoint=max(checkpoint_steps(checkpoints), default=None),
            workdir=self.workdir)
        if message is None:
            return None
        if self.is_main and self.learner is not None and self.learner.checkpointer is not None:
            self.learner.checkpointer.remove_partial()  # (the learner closed: no write runs)
        return storage.StorageFailure(message)

    async def _run(self) -> dict[str, Any]:
        compile_notice.set_announcer(self.output.say)  # every later compile gets a line
        try:
            return await self._run_announced()
        finally:
            compile_notice.set_announcer(None)

    async def _run_announced(self) -> dict[str, Any]:
        import jax

        from agentrl_jax.learner.ahead import AheadCompile
        from agentrl_jax.learner.metrics import MetricsWriter

        cfg, say = self.config, self.output.say
        self.output.write_config()
        with contextlib.ExitStack() as stack:
            async with contextlib.AsyncExitStack() as astack:
                with timed(say, f"starting environment servers {services.env_names(cfg)}"):
                    urls, self.env_errors.supervisor = services.start_supervised_env_services(
                        cfg, stack, on_event=lambda line: log.warning("%s", line), say=say)
                say(services.describe_urls(urls))
                clients = services.make_env_clients(urls, cfg, astack)
                # the first update's large programs compile on a background thread from the
                # model's config, beside the model load, the engine's start-up, the step-0
                # evaluation and the first rollout (on CPU they would take the cores those need)
                compile_ahead = (cfg.train.compile_ahead and not self.multi_process
                                 and jax.default_backend() != "cpu")
                if compile_ahead:
                    self._ahead_compile = self._compile_before_load(say)
                # the actor worker processes start up beside the model load, not in step 1
                worker_group = services.spawn_actor_workers(cfg)
                if worker_group is not None:
                    stack.callback(worker_group.close)
                with timed(say, "loading model "
                           + model_label(cfg.model.name, cfg.model.random_init)):
                    learner, model, tokenizer, model_path = load_learner(
                        cfg, checkpoint_dir=os.path.join(self.workdir, "checkpoints"),
                        max_to_keep=cfg.train.keep_checkpoints,
                        multi_process=self.multi_process)
                stack.callback(learner.close)
                self.learner = learner
                resumed = None
                if learner.checkpointer.latest_step() is not None:
                    with timed(say, "restoring the latest checkpoint"):
                        resumed = learner.restore_latest()
                start_step = int(resumed["step"]) if resumed else 0
                self.checkpoints.restored(start_step)
                self.start_step = start_step
                # the logs hold each step once: rows the steps after the checkpoint wrote before
                # a kill are dropped (they are logged again); then the metrics writer opens
                self.output.rewind_logs(start_step)
                if self.is_main:  # the only process that writes metrics
                    learner.writer = MetricsWriter(
                        os.path.join(self.workdir, "tensorboard"),
                        os.path.join(self.workdir, runlog.METRICS_FILE),
                        purge_step=start_step + 1 if start_step else None)
                cursor = int(resumed.get("cursor", 0)) if resumed else 0
                self.stop.trained_seconds_before = float(resumed.get("train_seconds", 0.0)
                                                         if resumed else 0.0)
                if self.multi_process:  # every process must resume at the same step and tasks
                    seen = distributed.allgather_objects([start_step, cursor])
                    if any(s != seen[0] for s in seen):
                        raise RuntimeError(f"processes resumed at different (step, task cursor): "
                                           f"{seen}; is the checkpoint directory shared?")
                if resumed:
                    say(f"resumed at step {start_step}")
                if not resumed:
                    policy = model
                elif self.multi_process:  # this host's full copy of the sharded parameters
                    policy = distributed.local_policy(learner)
                else:
                    policy = engine_policy(learner,
                                           overlap=cfg.train.max_staleness >= 1)
                # the scored LM head's capacity (learner/scored.py): the most scored tokens one
                # trajectory can hold, so the pack plans stay within the programs compiled ahead
                learner.scored_capacity.reserve(
                    scored_tokens_bound(self.schedule, cfg.rollout.max_new_tokens))
                # the packed update's token-space rows (learner/token_space.py): the most
                # episodes a step hands over, so no update compiles its small programs again
                learner.token_rows.reserve(cfg.train.tasks_per_step * cfg.train.samples_per_task)
                if compile_ahead:  # those of the loaded learner (the description may be wrong)
                    self._ahead_compile = (self._ahead_compile.for_loaded(learner)
                                           if self._ahead_compile is not None
                                           else AheadCompile(learner, say, option_counts=(
                                               cfg.agent.option_limits)))
                with timed(say, f"starting rollout backend {cfg.rollout.backend}"):
                    backend = self._start_backend(policy, tokenizer, model_path)
                astack.push_async_callback(services.close_backend, backend)
                say(services.describe_backend(backend))
                if resumed and backend.external_servers:
                    # SGLang servers outlive the trainer: they still serve whatever was synced
                    # last (possibly a step after the checkpoint, or the base model); engine
                    # servers were just started from the restored policy
                    with timed(say, f"loading the step-{start_step} weights into the "
                                    "rollout servers"):
                        await backend.sync_weights(
                            LearnerWeights(learner, multi_process=self.multi_process,
                                           is_main=self.is_main), start_step)
                astack.push_async_callback(self.stop.cancel_in_flight)  # runs first (LIFO)
                self.backend = backend
                self.progress.turn_counter = TurnCounter(backend)
                pool = services.make_actor_pool(cfg, self.progress.turn_counter, clients,
                                                tokenizer, model.cfg.eos_token_ids,
                                                worker_group=worker_group)
                train_tasks, eval_tasks = await self._task_lists(clients)
                # train.task_sampling; at the checkpoint's cursor (and, for learnability, its
                # levels' draws and success estimates)
                sampler = make_task_sampler(train_tasks, int(cfg.seed), cfg.train.task_sampling,
                                            {**(resumed or {}), "cursor": cursor},
                                            rate=cfg.train.learnability_ema,
                                            eps=cfg.train.learnability_eps)
                # the loaded weights: the engine's until the first weight sync, then unused (the
                # learner holds its own copies); kept by these names they would stay in memory
                del model, policy
                loop = self.train(learner, backend, pool, sampler, eval_tasks, start_step)
                if self.multi_process:  # a failed save surfaces at the next one, everywhere
                    return await loop
                # a failed background save stops the run at once (storage.watched)
                return await storage.watched(loop, learner.checkpointer.check)

    def _compile_before_load(self, say: Any) -> AheadCompile | None:
        """The first update's compile started from the learner the config describes
        (``policy.abstract_learner``), before its weights load; ``None`` where it cannot be
        described (logged; the compile then starts from the loaded learner)."""
        from agentrl_jax.learner.ahead import AheadCompile
        from agentrl_jax.training.runtime.policy import abstract_learner

        try:
            described = abstract_learner(self.config)
        except Exception as e:  # noqa: BLE001 - the model load reports what is wrong
            log.warning("compile ahead: no learner described before the model load (%r)", e)
            return None
        described.scored_capacity.reserve(
            scored_tokens_bound(self.schedule, self.config.rollout.max_new_tokens))
        return AheadCompile(described, say, option_counts=self.config.agent.option_limits,
                            beside="the model load, the engine's start-up and the first rollout")

    async def train(self, learner: Learner, backend: RolloutBackend, pool: ActorPool,
                    sampler: TaskSampler, eval_tasks: list[TaskRef],
                    start_step: int) -> dict[str, Any]:
        """The steps and evaluations of this session over components already set up (the
        set-up of :meth:`run` builds them; tests pass fakes): the training loop
        (``training/rl/loop.py``) from ``start_step``; returns the summary."""
        update = LearnerUpdate(learner, backend, self.output.say,
                               settings=BatchSettings.from_config(self.config),
                               release_kv=self.config.rollout.release_kv_during_update,
                               multi_process=self.multi_process, is_main=self.is_main,
                               ahead=self._ahead_compile)
        self._ahead_compile = None  # the update stage owns it now
        parts = RunParts(output=self.output, evaluator=self.evaluator,
                         env_errors=self.env_errors, stop=self.stop,
                         checkpoints=self.checkpoints, failed_steps=self.failed_steps,
                         schedule=self.schedule, progress=self.progress)
        return await TrainingLoop(self.config, parts, learner, update, pool, sampler,
                                  eval_tasks, start_step).run()
