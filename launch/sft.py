"""Behaviour cloning (SFT) on recorded expert episodes (``agentrl_jax/training/jobs/sft.py``).

    python launch/record_experts.py --env babyai --episodes 2000 --out runs/experts \
        --config experiments/babyai.py:sft
    python launch/sft.py --config experiments/babyai.py:sft --workdir runs/babyai_sft
    python launch/run.py --config experiments/babyai.py:grpo_gpu \
        --config.model.name=runs/babyai_sft/model

The loss is the NLL of the assistant tokens only, through the RL learner (sharded, packed rows,
orbax checkpoints). The same command resumes from the latest checkpoint; a finished run says so
and exits. Outputs: checkpoints/, metrics.jsonl, tensorboard/, model/ (HF directory: what
``--config.model.name=`` starts RL or evaluation from), trajectories_eval.jsonl.gz, summary.json.
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

from agentrl_jax.training.config.command_line import experiment_run_name  # noqa: E402

if TYPE_CHECKING:
    from agentrl_jax.training.config.sections import RunConfig

_CONFIG = config_flags.DEFINE_config_file("config", None, "SFT experiment config file",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "output directory (default runs/<config name>)")


def main(argv: list[str], config: RunConfig | None) -> int:
    """``config``: the typed ``RunConfig`` (checked before anything started)."""
    del argv
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    absl_logging.set_verbosity(absl_logging.WARNING)
    if config is None:
        raise app.UsageError("--config experiments/<family>.py:<sft variant> (with an sft "
                             "section) is required")
    workdir = _WORKDIR.value or os.path.join(
        "runs", experiment_run_name(flags.FLAGS["config"].config_filename))
    from agentrl_jax import compile_cache
    from agentrl_jax.training.jobs.sft import SFTRun, finished_step, sft_problems
    from agentrl_jax.training.preflight.validate import EXIT_BAD_CONFIG

    compile_cache.enable(config.compile_cache)

    done = finished_step(workdir)
    if done is not None:
        print(f"SFT run already finished at step {done} (workdir {os.path.abspath(workdir)}); "
              f"its policy: {os.path.join(workdir, 'model')}", flush=True)
        return 0
    problems = sft_problems(config, workdir)
    if problems:  # a command that cannot work: one line each, before the model loads
        for line in problems:
            print(f"cannot train: {line}", file=sys.stderr, flush=True)
        return EXIT_BAD_CONFIG
    try:
        SFTRun(config, workdir).run()
    except KeyboardInterrupt:
        print(f"interrupted (Ctrl-C); the same command resumes from the latest checkpoint "
              f"(workdir {os.path.abspath(workdir)})", file=sys.stderr, flush=True)
        return 130
    return 0


if __name__ == "__main__":
    from agentrl_jax.training.config.command_line import run_main

    run_main(main)  # --config mistakes: one line each, exit code 2
