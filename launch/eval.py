"""Evaluate an agent on the test split: Avg@k (mean task score), Pass@k (a task passes when
any of its k episodes scores > 0) and the success rate (the environment's completion flag);
``agentrl_jax/training/evaluation/eval_metrics.py`` defines them.

    python launch/eval.py --config experiments/babyai.py     # base model
    python launch/eval.py --config experiments/babyai.py \
        --checkpoint runs/babyai/checkpoints [--step 300] --k 4 --tasks 64

The embedded engine gets a decode slot per episode of the evaluation (``k x tasks`` per
environment, capped by ``rollout.max_batch`` / ``max_concurrency`` and, on CPU, by RAM); the
config's ``train.*`` values do not size it. Progress: a bar on a terminal, a line every
``--config.progress_seconds`` (30) otherwise. Ctrl-C stops cleanly (exit code 130).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402
from absl import logging as absl_logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

if TYPE_CHECKING:
    from agentrl_jax.training.config.sections import RunConfig

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config file")
_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "checkpoint directory (omit: base model)")
_STEP = flags.DEFINE_integer("step", None, "checkpoint step (default: latest)")
_K = flags.DEFINE_integer("k", 4, "samples per task (Avg@k / Pass@k)")
_TASKS = flags.DEFINE_integer("tasks", 64,
                              "test tasks per environment (evenly spaced over the split)")
_HORIZON = flags.DEFINE_integer("horizon", None, "turn limit (default config.train.eval_horizon)")
_SPLIT = flags.DEFINE_string("split", "test", "task split")
_OUTPUT = flags.DEFINE_string("output", None, "write the result JSON (+ trajectories) here")


def main(argv: list[str], config: RunConfig | None) -> int:
    """``config``: the typed ``RunConfig`` (checked before anything started)."""
    del argv
    logging.basicConfig(level=logging.WARNING)
    absl_logging.set_verbosity(absl_logging.WARNING)
    if config is None:
        raise app.UsageError("--config is required")
    from agentrl_jax.training.config.experiment import EXIT_BAD_CONFIG, ConfigError

    try:  # the flags, before any server or model starts
        if _K.value < 1 or _TASKS.value < 1 or (_HORIZON.value is not None and _HORIZON.value < 1):
            raise ConfigError([f"--{name}: must be an integer >= 1 (got {value})"
                               for name, value in (("k", _K.value), ("tasks", _TASKS.value),
                                                   ("horizon", _HORIZON.value))
                               if value is not None and value < 1])
    except ConfigError as error:
        print(error, file=sys.stderr, flush=True)
        return EXIT_BAD_CONFIG
    from agentrl_jax.training.preflight.validate import eval_problems

    problems = eval_problems(config, _CHECKPOINT.value, _STEP.value, _OUTPUT.value)
    if problems:  # a command that cannot work: one line each, before any server or model starts
        for line in problems:
            print(f"cannot evaluate: {line}", file=sys.stderr, flush=True)
        return EXIT_BAD_CONFIG
    from agentrl_jax import compile_cache

    compile_cache.enable(config.compile_cache)
    try:
        from agentrl_jax.training.jobs.evaluate import evaluate_sync

        result = evaluate_sync(config, _CHECKPOINT.value, _STEP.value, k=_K.value,
                               num_tasks=_TASKS.value, horizon=_HORIZON.value,
                               output=_OUTPUT.value, split=_SPLIT.value)
    except KeyboardInterrupt:
        print("evaluation interrupted (Ctrl-C); environment servers and rollout engine stopped",
              file=sys.stderr, flush=True)
        return 130
    if not result.valid:  # errors (dead servers, a failed engine): no success number
        print(f"evaluation is not a result: {result.describe_failure()}", file=sys.stderr,
              flush=True)
        return 3
    print(f"avg@{result.k}={result.avg_at_k:.4f} (mean score) pass@{result.k}="
          f"{result.pass_at_k:.4f} success_rate={result.success_rate:.4f} "
          f"mean_reward={result.mean_reward:.4f} tasks={result.num_tasks} "
          f"dropped={result.dropped}")
    for env, m in result.per_env.items():
        print(f"  {env}: " + " ".join(f"{k}={v:.4f}" for k, v in m.items()))
    return 0


if __name__ == "__main__":
    from agentrl_jax.training.config.command_line import run_main

    run_main(main)  # --config mistakes: one line each, exit code 2
