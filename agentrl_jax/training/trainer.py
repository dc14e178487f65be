"""The RL trainer loop.

Each step: horizon from the schedule -> tasks from the sampler -> asynchronous rollout ->
batch assembly (error trajectories dropped) -> learner update (old / reference logprobs,
advantages, PPO/GRPO updates) -> weight sync to the rollout backend (in place when colocated,
through a safetensors export for SGLang) -> logs (TensorBoard, metrics JSONL, trajectory JSONL)
-> periodic evaluation -> checkpoint. Resuming restores params, optimizer, step and task cursor;
the horizon is a pure function of the step, so it resumes exactly.

Several JAX processes (``launch/run.py --distributed``, one per host) run as one big run
(``training/distributed.py``): every process draws the same global task list, rolls out a
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
import collections
import contextlib
import dataclasses
import json
import logging
import os
import sys
import time
from typing import Any

import numpy as np

from agentrl_jax import compile_notice
from agentrl_jax.agent.actor_pool import ActorPool, RolloutStats, TaskRef
from agentrl_jax.agent.trajectory import STATUS_ENV_ERROR, Trajectory
from agentrl_jax.algorithms.advantages import is_turn_level
from agentrl_jax.training import distributed, hostmem, runlog, services, storage
from agentrl_jax.training.batching import assemble_batch, informative_groups
from agentrl_jax.training.config import model_label
from agentrl_jax.training.evaluation import EvalResult, evaluate, score_trajectories
from agentrl_jax.training.failed_steps import FailedSteps
from agentrl_jax.training.progress import (BAR, LINES, OFF, EpisodeProgress, TurnCounter,
                                           format_seconds, timed)
from agentrl_jax.training.schedule import HorizonSchedule
from agentrl_jax.training.summary import (SUMMARY_FILE, append_session,  # noqa: F401
                                          merge_summary, outcome, read_summary,
                                          write_json_atomic)
from agentrl_jax.training.task_sampler import TaskSampler

log = logging.getLogger(__name__)


def load_policy(config: Any, mesh: Any = None):
    """(model, tokenizer, path) from ``config.model``: a pretrained checkpoint, or a random
    model of ``config.model.random_init`` shape that uses the named checkpoint's tokenizer.

    ``mesh``: create every parameter directly in the learner's sharding over this mesh
    (``agentrl_jax.sharding.rules.DEFAULT_RULES``), random or loaded, so that no device ever
    holds the whole model (the Learner built on the same mesh adopts the arrays as they are).
    ``None``: whole on the default device."""
    from agentrl_jax.models.pretrained import load_pretrained, resolve_model_path
    from agentrl_jax.models.tokenizer import load_tokenizer

    mc = config.model
    random_init = mc.get("random_init")
    if random_init:
        from agentrl_jax.models.config import ModelConfig
        from agentrl_jax.models.llama import init_model

        path = resolve_model_path(mc.name)
        tokenizer = load_tokenizer(path)
        # the tokenizer's vocabulary unless the shape names its own (a larger one: ids past
        # the tokenizer decode to nothing, as for a benchmark of a bigger model's shape)
        shape = {"vocab_size": len(tokenizer), **dict(random_init)}
        cfg = ModelConfig(eos_token_id=tokenizer.eos_token_id,
                          pad_token_id=tokenizer.pad_token_id,
                          bos_token_id=tokenizer.bos_token_id, dtype=mc.get("dtype", "float32"),
                          **shape)
        return init_model(cfg, seed=int(config.seed), mesh=mesh), tokenizer, None
    shard = None
    if mesh is not None:
        from agentrl_jax.sharding.rules import sharding_fn
        shard = sharding_fn(mesh)
    pretrained = load_pretrained(mc.name, sharding_fn=shard, dtype=mc.get("dtype", "float32"))
    return pretrained.model, pretrained.tokenizer, pretrained.path


def load_learner(config: Any, checkpoint_dir: str | None = None, max_to_keep: int = 3,
                 multi_process: bool = False) -> tuple[Any, Any, Any, str | None]:
    """(learner, model, tokenizer, model_path): the policy of ``config.model`` and the
    ``Learner`` over it, as the trainer builds them.

    In one process the policy is created (random) or loaded (pretrained) directly in the
    learner's parameter shardings over ``config.learner.mesh``, and the learner adopts those
    arrays (``copy_model=False``): no device holds the whole float32 model at any time, and
    there is one copy of the parameters, not two. ``model`` then shares the learner's
    arrays; it is the embedded engine's first weights (which the engine casts to its dtype and
    places on its own devices), so it must not be used after the first update, which donates
    them. With ``train.max_staleness >= 1`` a rollout runs during the first update: the learner
    copies the parameters then (``copy_model=True``) so that ``model`` stays valid for the
    engine. With several processes the policy is loaded whole on each process (its engine
    takes it from there) and the learner copies it into its global sharding, as before.
    """
    from agentrl_jax.learner.learner import Learner
    from agentrl_jax.sharding.mesh import mesh_from_config

    settings = services.learner_settings(config)
    mesh = None if multi_process else mesh_from_config(settings.get("mesh"))
    model, tokenizer, model_path = load_policy(config, mesh=mesh)
    overlap = int(config.train.get("max_staleness", 0)) >= 1
    learner = Learner(model, settings, mesh=mesh, checkpoint_dir=checkpoint_dir,
                      max_to_keep=max_to_keep, copy_model=mesh is None or overlap)
    return learner, model, tokenizer, model_path


def checkpoint_steps(checkpoint_dir: str) -> list[int]:
    """Steps of the finished checkpoints in ``checkpoint_dir`` (orbax names each by its step;
    unfinished ones carry a temporary suffix), without starting orbax."""
    try:
        names = os.listdir(checkpoint_dir)
    except OSError:
        return []
    return sorted(int(n) for n in names if n.isdigit()
                  and os.path.isdir(os.path.join(checkpoint_dir, n)))


class RunFailure(RuntimeError):
    """The run cannot go on or its result does not count: an environment server died and could
    not be restarted (``env.max_restarts``), too many episodes ended with ``env_error``
    (``train.max_env_error_rate`` over ``train.env_error_window`` steps), too many steps in a
    row had no episode to train on (``train.max_failed_steps``, ``training/failed_steps.py``),
    or the final evaluation scored too few of its tasks (``train.eval_min_scored``).
    ``launch/run.py`` prints the message and exits with :data:`EXIT_RUN_FAILED`."""


#: exit code of ``launch/run.py`` for a :class:`RunFailure`
EXIT_RUN_FAILED = 3


def engine_policy(learner: Any, overlap: bool) -> Any:
    """The restored policy for a new embedded engine (a resumed run).

    ``learner.policy_model()`` holds the learner's own parameter arrays, and an engine built
    from it keeps them as they are (same shardings: no copy). The learner's update donates
    those buffers, so with ``overlap`` (``train.max_staleness >= 1``: a rollout decodes while
    the first update runs) the engine's weights would be deleted under it ("Array has been
    deleted", every episode an engine_error; tests/test_resume_donation.py). Then the engine
    gets a copy; otherwise (the update never runs during a rollout, and the weight sync
    replaces the engine's weights before the next one) the arrays themselves.
    """
    policy = learner.policy_model()
    if not overlap:
        return policy
    import jax
    import jax.numpy as jnp
    from flax import nnx

    return nnx.merge(learner.graphdef, jax.tree.map(jnp.copy, learner.params))


def fresh_trajectories(trajectories: list[Trajectory], step: int,
                       max_staleness: int) -> list[Trajectory]:
    """The trajectories that update ``step`` may train on: every turn generated by weights at
    most ``max_staleness`` updates old, i.e. ``step - oldest turn's version <= max_staleness``
    (weights can change mid-episode; the oldest turn decides, not the start version)."""
    return [t for t in trajectories if step - t.oldest_version <= max_staleness]


@dataclasses.dataclass
class StepRecord:
    step: int
    horizon: int
    rollout: RolloutStats
    metrics: dict[str, float]
    seconds: float


class Trainer:
    """Owns every component of a run; ``run()`` trains and returns a summary dict."""

    def __init__(self, config: Any, workdir: str, progress: bool = True,
                 eval_again: bool = False):
        """``progress=False``: no per-episode progress (bars or lines); ``eval_again``: a run
        that already finished evaluates its final policy again (see :meth:`finished_step`)."""
        self.config = config
        self.workdir = os.path.abspath(workdir)
        self.process_index = distributed.process_index()
        self.process_count = distributed.process_count()
        self.multi_process = self.process_count > 1
        self.is_main = self.process_index == 0
        self.show_progress = self.is_main and (progress and sys.stderr.isatty()
                                               or bool(config.get("progress")))
        # per-episode progress of rollouts and evaluations: a bar on a terminal, else lines
        self.progress_mode = (BAR if self.show_progress else LINES if self.is_main and progress
                              else OFF)
        self.progress_seconds = float(config.get("progress_seconds", 30.0))
        self.eval_again = eval_again
        self.step_done = 0  # the last training step finished in this process
        self.saved_step: int | None = None  # the last checkpoint step saved or restored
        self.start_step: int | None = None  # the step this session started (or resumed) at
        self._update_compiled = False
        self._rollouts: set[asyncio.Future] = set()
        self.turn_counter: TurnCounter | None = None  # between the actor pool and the backend
        self.saved_this_session = False
        self.stopped = "total_steps"  # why training ended: total_steps | time_budget
        self._started = time.time()
        self.learner: Any = None
        self.backend: Any = None
        self.supervisor: Any = None  # restarts the environment servers started here
        # (env_error episodes, episodes) of the last train.env_error_window rollouts
        self._env_errors: collections.deque[tuple[int, int]] = collections.deque(
            maxlen=int(config.train.get("env_error_window", 10)))
        self.failed_steps = FailedSteps(int(config.train.max_failed_steps))
        os.makedirs(self.workdir, exist_ok=True)
        self.schedule = HorizonSchedule.from_config(dict(config.horizon))
        self.history: list[StepRecord] = []
        self.evals: list[tuple[int, EvalResult]] = []

    # ----------------------------------------------------------------------------- set-up
    def _write_config(self) -> None:
        """``config.json`` of the workdir, without secrets (``rollout.api_key``)."""
        if not self.is_main:
            return
        config = self.config
        if config.get("rollout", {}).get("api_key"):
            config = config.copy_and_resolve_references()
            with config.unlocked():
                config.rollout.api_key = "<redacted>"
        with open(os.path.join(self.workdir, "config.json"), "w") as f:
            f.write(config.to_json_best_effort(indent=2))

    def _log_trajectories(self, step: int, trajectories: list[Trajectory], kind: str) -> None:
        suffix = f".process{self.process_index}" if self.multi_process else ""
        path = os.path.join(self.workdir, f"trajectories_{kind}{suffix}.jsonl")
        try:
            with open(path, "a") as f:
                for t in trajectories:
                    f.write(json.dumps(t.to_json(step)) + "\n")
        except OSError as error:  # a failed write of an open file names no file
            if error.filename:
                raise
            raise storage.with_path(error, path) from error

    def _rewind_logs(self, step: int) -> None:
        """Rewind this process's per-step logs to checkpoint ``step`` (``training/runlog.py``);
        the evaluation of ``step`` is dropped too when this session runs it again (the opening
        evaluation of a run at step 0, the final one of a run killed during it)."""
        train = self.config.train
        evaluates = int(train.get("eval_tasks", 0)) > 0
        redo_eval = evaluates and (
            step == 0 and bool(train.get("eval_before", False))
            or step >= int(train.total_steps) and bool(train.get("eval_after", False))
            and not self.eval_again)
        suffix = f".process{self.process_index}" if self.multi_process else ""
        dropped = runlog.rewind_run_logs(self.workdir, step, redo_eval, metrics=self.is_main,
                                         trajectory_suffix=suffix)
        if dropped:
            self._say(f"logs rewound to step {step}: dropped "
                      + ", ".join(f"{n} rows of {name}" for name, n in dropped.items())
                      + " (written after that checkpoint; those steps run again)")

    # ----------------------------------------------------------------------------- run
    def finished_step(self) -> int | None:
        """The final step if this workdir holds a finished run of this config, else None.

        Finished: ``summary.json`` says the run ended at step >= ``train.total_steps`` with its
        final evaluation done, and that step's checkpoint exists. (A run stopped by its time
        budget is not finished: started again, it trains on.) With several processes, process
        0's answer (it alone writes the summary) holds for all.
        """
        summary = read_summary(self.workdir)
        step = summary.get("finished_step")
        finished = (isinstance(step, int) and step >= int(self.config.train.total_steps)
                    and step in checkpoint_steps(os.path.join(self.workdir, "checkpoints")))
        answer = step if finished else None
        if self.multi_process:
            answer = distributed.allgather_objects([answer])[0][0]
        return answer

    def run(self) -> dict[str, Any]:
        """Train (resuming from the workdir's checkpoint) and return the summary.

        However the session ends, ``summary.json`` gets its record (``training/summary.py``).
        A failed checkpoint save or a refused write (a full disk) is raised as one line, a
        :class:`~agentrl_jax.training.storage.StorageFailure`, after the servers stopped and
        the partial checkpoint was removed; orbax's tracebacks of it are kept out of the log.
        """
        quiet = storage.quiet_storage_errors()
        try:
            return asyncio.run(self._run())
        except BaseException as error:
            failure = self._storage_failure(error)
            problem = self._record_session(failure or error)
            if failure is not None:  # on a full disk the summary may be refused too
                raise (storage.StorageFailure(f"{failure}; {problem}") if problem
                       else failure) from None
            if problem:
                log.warning("%s", problem)
            raise
        finally:
            storage.unquiet(quiet)

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

    async def _run(self) -> dict[str, Any]:
        compile_notice.set_announcer(self._say)  # every later compile gets a line
        try:
            return await self._run_announced()
        finally:
            compile_notice.set_announcer(None)

    async def _run_announced(self) -> dict[str, Any]:
        from agentrl_jax.learner.metrics import MetricsWriter

        cfg = self.config
        self._write_config()
        with contextlib.ExitStack() as stack:
            async with contextlib.AsyncExitStack() as astack:
                with timed(self._say, f"starting environment servers {services.env_names(cfg)}"):
                    urls, self.supervisor = services.start_supervised_env_services(
                        cfg, stack, on_event=lambda line: log.warning("%s", line))
                self._say(services.describe_urls(urls))
                clients = services.make_env_clients(urls, cfg, astack)
                with timed(self._say, "loading model "
                           + model_label(cfg.model.name, cfg.model.get("random_init"))):
                    learner, model, tokenizer, model_path = load_learner(
                        cfg, checkpoint_dir=os.path.join(self.workdir, "checkpoints"),
                        max_to_keep=int(cfg.train.get("keep_checkpoints", 3)),
                        multi_process=self.multi_process)
                stack.callback(learner.close)
                self.learner = learner
                resumed = None
                if learner.checkpointer.latest_step() is not None:
                    with timed(self._say, "restoring the latest checkpoint"):
                        resumed = learner.restore_latest()
                start_step = int(resumed["step"]) if resumed else 0
                self.saved_step = start_step or None
                self.start_step = start_step
                # the logs hold each step once: rows the steps after the checkpoint wrote before
                # a kill are dropped (they are logged again); then the metrics writer opens
                self._rewind_logs(start_step)
                if self.is_main:  # the only process that writes metrics
                    learner.writer = MetricsWriter(
                        os.path.join(self.workdir, "tensorboard"),
                        os.path.join(self.workdir, runlog.METRICS_FILE),
                        purge_step=start_step + 1 if start_step else None)
                cursor = int(resumed.get("cursor", 0)) if resumed else 0
                if self.multi_process:  # every process must resume at the same step and tasks
                    seen = distributed.allgather_objects([start_step, cursor])
                    if any(s != seen[0] for s in seen):
                        raise RuntimeError(f"processes resumed at different (step, task cursor): "
                                           f"{seen}; is the checkpoint directory shared?")
                if resumed:
                    self._say(f"resumed at step {start_step}")
                if not resumed:
                    policy = model
                elif self.multi_process:  # this host's full copy of the sharded parameters
                    policy = distributed.local_policy(learner)
                else:
                    policy = engine_policy(learner,
                                           overlap=int(cfg.train.get("max_staleness", 0)) >= 1)
                with timed(self._say, f"starting rollout backend {cfg.rollout.backend}"):
                    backend = services.make_backend(cfg, policy, tokenizer, model_path)
                astack.push_async_callback(services.close_backend, backend)
                self._say(services.describe_backend(backend))
                if resumed and cfg.rollout.backend == "sglang":
                    # SGLang servers outlive the trainer: they still serve whatever was synced
                    # last (possibly a step after the checkpoint, or the base model); engine
                    # servers were just started from the restored policy
                    with timed(self._say, f"loading the step-{start_step} weights into the "
                                          "rollout servers"):
                        await self._sync_weights(backend, learner, start_step)
                astack.push_async_callback(self._cancel_rollouts)  # runs first (LIFO)
                self.backend = backend
                self.turn_counter = TurnCounter(backend)
                pool = services.make_actor_pool(cfg, self.turn_counter, clients, tokenizer,
                                                model.cfg.eos_token_ids)
                filters = services.task_filters(cfg)
                train_tasks = await services.task_refs(clients, "train", filters=filters)
                eval_tasks = await services.task_refs(clients, "test", int(cfg.train.eval_tasks),
                                                      filters=filters)
                sampler = TaskSampler(train_tasks, seed=int(cfg.seed), cursor=cursor)
                # the loaded weights: the engine's until the first weight sync, then unused (the
                # learner holds its own copies); kept by these names they would stay in memory
                del model, policy
                loop = self._loop(learner, backend, pool, sampler, eval_tasks, start_step)
                if self.multi_process:  # a failed save surfaces at the next one, everywhere
                    return await loop
                # a failed background save stops the run at once (storage.watched)
                return await storage.watched(loop, learner.checkpointer.check)

    async def _evaluate(self, pool: ActorPool, tasks: list[TaskRef], step: int,
                        learner: Any) -> EvalResult:
        t0 = time.monotonic()
        k = int(self.config.train.eval_samples)
        min_scored = float(self.config.train.get("eval_min_scored", 0.9))
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
        self._say(f"[eval step {step}] avg@{result.k}={result.avg_at_k:.3f} "
                  f"pass@{result.k}={result.pass_at_k:.3f} over {result.num_tasks} tasks "
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
        max_rate = float(self.config.train.get("max_env_error_rate", 0.5))
        if total and total_errors / total > max_rate:
            raise RunFailure(
                f"stopped at step {step + 1}: {total_errors} of {total} episodes of the last "
                f"{len(self._env_errors)} rollout(s) ended with env_error (rate "
                f"{total_errors / total:.2f} > train.max_env_error_rate={max_rate:g}); last "
                f"error: {failed[-1].error if failed else 'on another process'}; {resume} "
                f"(workdir {self.workdir})")

    @staticmethod
    async def _cancel(task: asyncio.Future) -> None:
        """Cancel an in-flight rollout and wait until its episodes have closed their envs."""
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def _sync_weights(self, backend: Any, learner: Any, step: int,
                            copy: bool = False) -> None:
        """Push the learner's weights to the rollout backend. Colocated (embedded) engines get
        the arrays themselves (no copy), unless a rollout runs during the next update
        (``copy``): the update donates its parameter buffers, so the engine needs its own."""
        if self.multi_process:
            # Every host needs the full parameters on its own devices: gathered on device (a
            # collective on every process), fresh buffers that the next update cannot donate.
            if self.config.rollout.backend == "embedded":
                await backend.update_weights(distributed.local_replica(learner.params),
                                             version=str(step))
            else:
                # External SGLang servers load one export, written and announced by process 0;
                # engine servers belong to their process: each process updates its own.
                policy = distributed.local_policy(learner)
                if self.is_main or self.config.rollout.backend == "engine_servers":
                    await backend.update_weights(policy, version=str(step))
                distributed.barrier(f"sync_weights:{step}")
            return
        if self.config.rollout.backend == "embedded":
            params = learner.params
            if copy:
                import jax
                import jax.numpy as jnp
                params = jax.tree.map(jnp.copy, params)
            await backend.update_weights(params, version=str(step))
        else:
            await backend.update_weights(learner.policy_model(), version=str(step))

    async def _loop(self, learner: Any, backend: Any, pool: ActorPool, sampler: TaskSampler,
                    eval_tasks: list[TaskRef], start_step: int) -> dict[str, Any]:
        cfg = self.config
        total = int(cfg.train.total_steps)
        eval_every = int(cfg.train.get("eval_every", 0))
        save_every = int(cfg.train.get("save_every", 1))
        if cfg.train.get("eval_before", False) and start_step == 0 and eval_tasks:
            await self._evaluate(pool, eval_tasks, 0, learner)
        max_seconds = float(cfg.train.get("max_seconds", 0) or 0)
        max_staleness = int(cfg.train.get("max_staleness", 0))
        samples = int(cfg.train.samples_per_task)
        loop_start = time.monotonic()
        last_step = start_step
        cursor_at: dict[int, int] = {}  # task cursor before step's tasks were drawn (resume)
        weights_version = start_step  # the learner update the engine's weights come from

        def launch(step: int) -> asyncio.Task:
            horizon = self.schedule.horizon(step)
            cursor_at[step] = sampler.cursor
            tasks = sampler.next(int(cfg.train.tasks_per_step))  # the same on every process
            lo, hi = distributed.share(len(tasks))  # this process's groups
            tasks = tasks[lo:hi]
            desc = f"step {step + 1}/{total} rollout (horizon {horizon})"

            async def rollout():
                async with EpisodeProgress(len(tasks) * samples, desc, self.progress_mode,
                                           self.progress_seconds, self._say,
                                           counter=self.turn_counter) as progress:
                    trajectories, stats = await pool.collect(
                        tasks, samples, horizon, policy_version=weights_version,
                        seed=distributed.sampling_seed(int(cfg.seed) + step),
                        progress=progress, version_fn=lambda: weights_version)
                for t in trajectories:  # the global group index: unique over processes
                    t.group_id += lo
                return horizon, trajectories, stats

            task = asyncio.ensure_future(rollout())
            self._rollouts.add(task)
            task.add_done_callback(self._rollouts.discard)
            return task

        pending = launch(start_step) if start_step < total else None
        for step in range(start_step, total):
            t0 = time.monotonic()
            horizon, trajectories, stats = await pending
            pending = None
            # Overlap: the next rollout runs (with the current weights) while this update trains.
            if max_staleness >= 1 and step + 1 < total:
                pending = launch(step + 1)
            # numbered as everything else: the update these episodes are for (1-based), as the
            # terminal's [step k/n], metrics.jsonl, the checkpoints and the evaluations
            self._log_trajectories(step + 1, trajectories, "train")
            fresh = fresh_trajectories(trajectories, step, max_staleness)
            ok = [t for t in fresh if t.ok]
            usable = len(ok)  # before flat groups are skipped (those are no failure)
            flat_groups = 0
            if cfg.train.get("skip_flat_groups", False):  # all-equal rewards: advantage 0
                ok, flat_groups = informative_groups(
                    ok, turn_level=is_turn_level(cfg.learner.advantage_estimator))
            stale, trainable = len(trajectories) - len(fresh), len(ok)
            mixed = sum(t.mixed_versions for t in trajectories)  # turns of several versions
            if self.multi_process:  # global numbers (collectives, the same order everywhere)
                counts = np.sum(distributed.allgather_objects([stale, trainable, mixed, usable]),
                                axis=0)
                stale, trainable, mixed, usable = (int(n) for n in counts)
                stats = distributed.global_rollout_stats(trajectories, stats)
            metrics: dict[str, float] = {"train/horizon": float(horizon),
                                         "train/phase": float(self.schedule.phase(step)),
                                         "rollout/stale_dropped": float(stale),
                                         "rollout/mixed_version_episodes": float(mixed),
                                         "rollout/flat_groups_skipped": float(flat_groups)}
            metrics.update(stats.as_metrics())
            self._check_env_errors(step, trajectories, stats)
            failed = self.failed_steps.record(usable, stats.statuses, trajectories)
            if failed:  # the same cause (e.g. sampling parameters the backend rejects) again
                resume = (f"once that is fixed, the same command resumes from the checkpoint "
                          f"of step {self.saved_step}" if self.saved_step else
                          "once that is fixed, the same command starts it again")
                raise RunFailure(f"stopped at step {step + 1}: {failed}; {resume} "
                                 f"(workdir {self.workdir})")
            if trainable:
                if cfg.rollout.get("release_kv_during_update", False) and max_staleness == 0:
                    try:  # no rollout runs until the sync
                        freed = await backend.release_kv_cache()
                    except RuntimeError as e:  # a request still running (e.g. not yet aborted)
                        log.warning("step %d: KV cache kept for the update: %s", step + 1, e)
                        freed = 0
                    metrics["rollout/kv_released_gib"] = freed / 2 ** 30
                if self.multi_process:  # this process's rows (none: an empty share)
                    batch = (assemble_batch(ok, pad_id=int(cfg.model.get("pad_id", 0))) if ok
                             else distributed.empty_batch())
                    update = await self._update(learner, batch, True)
                else:
                    batch = assemble_batch(ok, pad_id=int(cfg.model.get("pad_id", 0)))
                    update = await self._update(learner, batch, False)
                metrics.update(update)
                t_sync = time.monotonic()
                await self._sync_weights(backend, learner, step + 1,
                                         copy=max_staleness >= 1)
                metrics["perf/weight_sync_s"] = time.monotonic() - t_sync
                if "rollout/kv_released_gib" in metrics:  # before the next rollout
                    await backend.resume_kv_cache()
                weights_version = step + 1
                hostmem.release_freed_memory()  # the update's temporaries
            else:
                log.warning("step %d: no trajectory to train on (%s, %d flat groups); no update",
                            step + 1, stats.statuses, flat_groups)
                learner.update_step += 1  # the step still counts, so the schedule moves on
                # the weights did not change: they are version step + 1 as well (without this,
                # every later rollout would be stamped one version behind and dropped as stale)
                weights_version = step + 1
            metrics["train/step_seconds"] = time.monotonic() - t0
            if learner.writer is not None:
                learner.writer.write(step + 1, metrics)
            self.history.append(StepRecord(step + 1, horizon, stats, metrics,
                                           metrics["train/step_seconds"]))
            self._say(f"[step {step + 1}/{total}] horizon={horizon} "
                      f"reward={stats.mean_reward:.3f} success={stats.success_rate:.2f} "
                      f"turns={stats.mean_turns:.1f} tokens={stats.generated_tokens} "
                      f"dropped={stats.dropped} "
                      f"pg_loss={metrics.get('actor/pg_loss', float('nan')):.4f} "
                      f"({metrics['train/step_seconds']:.1f} s)")
            self.step_done = step + 1
            if eval_every and (step + 1) % eval_every == 0 and eval_tasks:
                if pending is not None:  # evaluate the new weights without a rollout in flight
                    await self._cancel(pending)
                    pending = None
                    sampler.cursor = cursor_at[step + 1]
                await self._evaluate(pool, eval_tasks, step + 1, learner)
            out_of_time = bool(max_seconds) and time.monotonic() - loop_start > max_seconds
            if self.multi_process:  # stop together
                out_of_time = distributed.agree_any(out_of_time)
            if (step + 1) % save_every == 0 or step + 1 == total or out_of_time:
                cursor = cursor_at.get(step + 1, sampler.cursor)
                self._save(learner, step + 1, cursor)
            last_step = step + 1
            if out_of_time:
                self._say(f"time budget of {max_seconds:.0f} s reached after step {step + 1}; "
                          "stopping")
                self.stopped = "time_budget"
                break
            if pending is None and step + 1 < total:
                pending = launch(step + 1)
        if pending is not None:
            await self._cancel(pending)
        writes_pending = self.saved_this_session
        if ((cfg.train.get("eval_after", False) or self.eval_again) and eval_tasks
                and not (self.evals and self.evals[-1][0] == last_step)):
            import jax

            if writes_pending and jax.default_backend() == "cpu":
                # in host RAM the write's buffers would add to the evaluation's memory
                with timed(self._say, "finishing checkpoint writes"):
                    learner.wait()
                writes_pending = False
            hostmem.release_freed_memory()
            await self._evaluate(pool, eval_tasks, last_step, learner)
        if writes_pending:
            with timed(self._say, "finishing checkpoint writes"):
                learner.wait()
        summary = self._summary(start_step, last_step)
        final = self.evals[-1] if self.evals else None
        if final is not None and final[0] == last_step and not final[1].valid:
            raise RunFailure(f"the evaluation at step {last_step} is not a result: "
                             f"{final[1].describe_failure()}; the same command evaluates it "
                             f"again (workdir {self.workdir})")
        return summary

    async def _update(self, learner: Any, batch: Any, process_local: bool) -> dict[str, float]:
        """``learner.update`` in a worker thread; the first one of this process compiles the
        train step (minutes for a large model on CPU), which is announced as a whole; a later
        compile (a new length bucket) is announced by ``compile_notice``."""
        call = (lambda: learner.update(batch, False, True)) if process_local else \
            (lambda: learner.update(batch, False))
        if self._update_compiled:
            return await asyncio.to_thread(call)
        # this phase's compiles are not announced one by one: the line below says them
        with timed(self._say, "compiling the train step (first update)"):
            update = await asyncio.to_thread(compile_notice.quietly, call)
        self._update_compiled = True
        return update

    def _save(self, learner: Any, step: int, cursor: int) -> None:
        """Checkpoint ``step`` (the write finishes in the background)."""
        with timed(self._say, f"saving checkpoint step {step}"):
            learner.save({"step": step, "cursor": cursor}, step=step, force=True)
        self.saved_step = step
        self.saved_this_session = True

    async def _cancel_rollouts(self) -> None:
        """Cancel rollouts still in flight (an interrupted run) before the engine and the env
        clients close under them."""
        for task in list(self._rollouts):
            await self._cancel(task)

    # ----------------------------------------------------------------------------- output
    def _session_record(self, start_step: int, total: int) -> dict[str, Any]:
        """What this invocation did (one entry of the summary's ``sessions``)."""
        record: dict[str, Any] = {
            "start_step": start_step, "final_step": total, "steps": len(self.history),
            "stopped": self.stopped if self.history or total > start_step else "evaluate_only",
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
        # finished: trained to total_steps with the final evaluation (if any) done; started
        # again, such a run says so and exits (launch/run.py, Trainer.finished_step)
        final_eval = self.evals[-1][1] if self.evals and self.evals[-1][0] == total else None
        if final_eval is not None and not final_eval.valid:
            summary["final_eval_invalid"] = final_eval.describe_failure()
        elif total >= int(self.config.train.total_steps):
            summary["finished_step"] = total
        if self.is_main:  # merged with what earlier sessions of this workdir wrote
            invalid = "final_eval_invalid" in summary
            summary = merge_summary(read_summary(self.workdir), summary)
            if not invalid:  # an earlier session's invalid final evaluation was redone
                summary.pop("final_eval_invalid", None)
            write_json_atomic(os.path.join(self.workdir, SUMMARY_FILE), summary)
        lines = [f"run finished: steps {start_step}->{total}, final horizon "
                 f"{summary['final_horizon']}"]
        if self.history:
            lines.append(f"  train reward: first step {summary['first_reward']:.3f}, last step "
                         f"{summary['last_reward']:.3f}; {summary['mean_step_seconds']:.1f} s/step")
        for step, r in self.evals:
            lines.append(f"  eval @ step {step}: avg@{r.k}={r.avg_at_k:.3f} "
                         f"pass@{r.k}={r.pass_at_k:.3f} ({r.num_tasks} tasks)" if r.valid else
                         f"  eval @ step {step}: not a result: {r.describe_failure()}")
        lines.append(f"  outputs: {self.workdir} (checkpoints/, tensorboard/, metrics.jsonl, "
                     "trajectories_*.jsonl, summary.json)")
        self._say("\n".join(lines))
        return summary

    def _say(self, message: str, end: str = "\n") -> None:
        if self.is_main:
            print(message, end=end, flush=True)
        else:
            log.info("[process %d] %s", self.process_index, message)
