"""The main job: train an LLM agent with multi-turn RL.

    python launch/run.py --config experiments/babyai.py --workdir runs/babyai
    python launch/run.py --config experiments/babyai.py:grpo_scaling    # a named variant
    python launch/run.py --config experiments/smoke.py --config.train.total_steps=2

An experiment file holds one family's variants (``experiments/common.py``); ``FILE:VARIANT``
picks one, ``FILE`` alone its default, and an unknown name is refused with the file's list.

The config is checked first (``training/config/command_line.py``: the file and every --config.* override
names a real key with a value of its type; ``training/preflight/validate.py``: every key, the model
source, the workdir, a step's batch against this host's memory); a bad one exits with code 2,
one line per problem, before anything starts. With no URLs in the config it starts the environment servers
and the embedded rollout engine on loopback and stops them on exit. Ctrl-C stops the run
cleanly (one line, exit code 130); SIGTERM (a preempted machine, a job's time limit) stops it
after checkpointing its last finished step (one line, exit code 143). Re-running with the same --workdir resumes from the latest checkpoint; a run that already
finished says so and exits, after writing its report if a kill left it unwritten (--eval_again
evaluates its final policy again). One run per workdir: a second one is refused (exit code 5).
A full disk (or another refused write) stops the run with one line (exit code 4). On several
hosts (TPU pod, GPU cluster) pass --distributed.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING, Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402
from absl import logging as absl_logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from agentrl_jax.training.config.command_line import experiment_run_name  # noqa: E402

if TYPE_CHECKING:
    from ml_collections import ConfigDict

    from agentrl_jax.training.config.sections import RunConfig

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config file",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "output directory (default runs/<config name>)")
_DISTRIBUTED = flags.DEFINE_bool("distributed", False,
                                 "call jax.distributed.initialize() (multi-host runs)")
_EVAL_AGAIN = flags.DEFINE_bool("eval_again", False,
                                "a finished run: evaluate its final policy again (appends to its "
                                "eval logs) instead of exiting")

#: exit code of a run stopped by Ctrl-C (128 + SIGINT), as shells report it
EXIT_INTERRUPTED = 130
#: exit code of a run stopped by SIGTERM after checkpointing its last step (128 + SIGTERM)
EXIT_TERMINATED = 143
#: exit code of a run refused because another run holds its workdir
EXIT_WORKDIR_BUSY = 5


def main(argv: list[str], config: RunConfig | None) -> int:
    """``config``: the typed ``RunConfig``, checked with the model source, the workdir and this
    host's memory (:func:`check`) before anything started."""
    del argv
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    absl_logging.set_verbosity(absl_logging.WARNING)  # orbax logs every save at INFO
    if config is None:
        raise app.UsageError("--config experiments/<name>.py is required")
    from agentrl_jax import compile_cache

    compile_cache.enable(config.compile_cache)  # a run started again loads what this compiles
    try:
        return _train(config)
    except KeyboardInterrupt:  # before the trainer existed (start-up)
        print("interrupted (Ctrl-C) during start-up", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED


def check(config: ConfigDict) -> RunConfig:
    """The whole config, the model source and the workdir (``training/preflight/validate.py``): the
    typed ``RunConfig``, or ``ConfigError`` with one line per problem."""
    from agentrl_jax.training.preflight.validate import check_run

    return check_run(config, _workdir(), processes=_processes())


def _workdir() -> str:
    """--workdir, or runs/<config file name>[_<variant>]."""
    return _WORKDIR.value or os.path.join(
        "runs", experiment_run_name(flags.FLAGS["config"].config_filename))


def _processes() -> int:
    """JAX processes that will share each step (``$JAX_NUM_PROCESSES`` with --distributed,
    where the launcher sets it; else 1: the validation then assumes one host holds it all)."""
    count = os.environ.get("JAX_NUM_PROCESSES", "") if _DISTRIBUTED.value else ""
    return int(count) if count.isdigit() and int(count) >= 1 else 1


def _train(config: RunConfig) -> int:
    """Train ``config`` in the workdir (or say that its run already finished)."""
    if _DISTRIBUTED.value:
        import jax

        # The coordinator comes from JAX_COORDINATOR_ADDRESS or cluster auto-detection (SLURM,
        # TPU VMs); JAX_NUM_PROCESSES / JAX_PROCESS_ID are read here for other launchers.
        counts = {arg: int(os.environ[var]) for arg, var in (("num_processes", "JAX_NUM_PROCESSES"),
                                                             ("process_id", "JAX_PROCESS_ID"))
                  if os.environ.get(var)}
        jax.distributed.initialize(**counts)
    workdir = _workdir()
    from agentrl_jax.training.outputs.storage import quiet_storage_errors

    # for the whole job: orbax's and tensorstore's threads may still report a failed save's
    # other writes after the trainer returned (the one-line failure says it all)
    quiet_storage_errors()
    lock, code = _lock_workdir(workdir)
    if code is not None:
        return code
    try:
        return _train_locked(config, workdir)
    finally:
        if lock is not None:
            lock.release()


def _lock_workdir(workdir: str) -> tuple[Any, int | None]:
    """(the workdir's lock, None), or (None, exit code) when this run must not start: another
    run holds the workdir (one line, :data:`EXIT_WORKDIR_BUSY`) or its lock file cannot be
    made (:data:`EXIT_BAD_CONFIG`). Only the main process takes the lock; every process gets
    the same answer. A lock left by a run that died is taken over, said in one line, and that
    run's session is recorded in ``summary.json`` as ``killed``."""
    from agentrl_jax.training.outputs.summary import append_session
    from agentrl_jax.training.preflight.validate import EXIT_BAD_CONFIG
    from agentrl_jax.training.outputs.workdir_lock import WorkdirBusy, WorkdirLock, WorkdirLockError

    is_main = True
    if _DISTRIBUTED.value:
        import jax

        is_main = jax.process_index() == 0
    lock, code = None, None
    if is_main:
        try:
            lock = WorkdirLock(workdir).acquire()
        except WorkdirLockError as error:
            print(error, file=sys.stderr, flush=True)
            code = EXIT_WORKDIR_BUSY if isinstance(error, WorkdirBusy) else EXIT_BAD_CONFIG
    if _DISTRIBUTED.value:
        from agentrl_jax.sharding.placement import allgather_objects

        code = allgather_objects(code)[0]
    if lock is not None and lock.stale:
        print(lock.stale_message(), flush=True)
        record = {"stopped": "killed", "error": "ended without releasing the workdir lock "
                  "(killed, crashed or its host lost)",
                  **{f"lock_{k}": v for k, v in lock.stale.items() if k != "command"}}
        problem = append_session(lock.workdir, record)
        if problem:
            print(problem, file=sys.stderr, flush=True)
    return lock, code


def _train_locked(config: RunConfig, workdir: str) -> int:
    from agentrl_jax.training.rl.trainer import Trainer

    trainer = Trainer(config, workdir, eval_again=_EVAL_AGAIN.value)
    finished = trainer.finished_step()
    if finished is not None and not _EVAL_AGAIN.value:
        if trainer.is_main:
            print(f"run already finished at step {finished} (workdir {trainer.workdir}); "
                  "pass --eval_again to evaluate it again, or a larger "
                  "--config.train.total_steps / --config.train.max_seconds to train on",
                  flush=True)
            _complete_report(trainer.workdir)
        return 0
    from agentrl_jax.training.outputs.storage import EXIT_STORAGE_FAILED, StorageFailure
    from agentrl_jax.training.rl.failed_steps import EXIT_RUN_FAILED, RunFailure

    try:
        trainer.run()
        if trainer.stopped == "terminated":
            if trainer.is_main:
                print(trainer.terminated_message(), file=sys.stderr, flush=True)
            return EXIT_TERMINATED
    except KeyboardInterrupt:
        if trainer.is_main:
            print(trainer.interrupted_message(), file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    except RunFailure as failure:  # dead environment servers, env errors, no valid result
        if trainer.is_main:
            print(f"run failed: {failure}", file=sys.stderr, flush=True)
        return EXIT_RUN_FAILED
    except StorageFailure as failure:  # a full disk, a failed checkpoint save
        if trainer.is_main:
            print(f"run failed: {failure}", file=sys.stderr, flush=True)
        return EXIT_STORAGE_FAILED
    if trainer.is_main:  # report.md + PNG curves in the workdir (never fails the run)
        from agentrl_jax.training.outputs.report import write_report_safely

        write_report_safely(trainer.workdir)
    return 0


def _complete_report(workdir: str) -> None:
    """Write the report of a finished run whose ``report.md`` or ``report_curves.png`` is
    missing (a kill after the summary was written, before the report)."""
    from agentrl_jax.training.outputs.report import CURVES_FILE, REPORT_FILE, write_report_safely

    if all(os.path.exists(os.path.join(workdir, name)) for name in (REPORT_FILE, CURVES_FILE)):
        return
    write_report_safely(workdir, say=lambda line: print(line, flush=True))


if __name__ == "__main__":
    from agentrl_jax.training.config.command_line import run_main

    run_main(main, check=check)  # --config mistakes: one line each, exit code 2
