"""Record expert episodes for behaviour cloning (SFT), through the same HTTP protocol, prompts,
chat template and answer format as RL (``agentrl_jax/training/jobs/record_experts.py``).

    python launch/record_experts.py --env babyai --episodes 2000 --out runs/experts \
        --config experiments/babyai.py:sft
    python launch/record_experts.py --env textcraft --episodes 426 --out runs/experts \
        --config experiments/textcraft.py:sft

Writes ``<out>/<env>.jsonl`` (one trajectory per line) and ``<out>/<env>.meta.json``. The
token ids are the config's model tokenizer's; record with the config you fine-tune with. Experts:
babyai (minigrid's BabyAIBot), textcraft (the recipe expert), scienceworld (gold paths),
miniwob (the rule-based expert), deepsearch (the retrieval oracle); ``--expert babyai_macro``
for BabyAI: the bot's solution shortened with macro actions (docs/RESULTS.md, "What limits
BabyAI"), the default of the BabyAI SFT configs (their ``sft.expert``; ``--expert babyai``
records the primitive bot). Nothing is shipped: the data is made by this command.

``--workers N`` records with N processes (the experts are CPU-bound Python; e.g. 16 on a
64-core machine), each killed after ``--timeout`` seconds (the parts that finished are kept).
A progress line every ``--progress-every`` episodes; one expert action is limited to
``--act-timeout`` seconds (BabyAIBot never returns on most UnlockToUnlock levels: such episodes
end as failed). JAX runs on the CPU here (``JAX_PLATFORMS=cpu`` unless set): recording never
uses the accelerator. Exit code 1 when no episode succeeded.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before anything imports jax: no GPU is needed

from absl import app, flags  # noqa: E402
from absl import logging as absl_logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

if TYPE_CHECKING:
    from agentrl_jax.training.config.sections import RunConfig

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config file (the SFT "
                                          "config: its model tokenizer and answer format)")
_ENV = flags.DEFINE_string("env", None, "environment family: babyai | textcraft | "
                           "scienceworld | miniwob | deepsearch")
_EPISODES = flags.DEFINE_integer("episodes", None, "episodes to record (one per task, tasks "
                                 "evenly spaced over the split; default: the config's "
                                 "sft.record_episodes)")
_OUT = flags.DEFINE_string("out", None, "output directory")
_EXPERT = flags.DEFINE_string("expert", None, "the expert by name (default: the config's "
                              "sft.expert, else the environment's own; babyai_macro: BabyAIBot "
                              "shortened with macro actions)")
_SPLIT = flags.DEFINE_string("split", "train", "task split")
_HORIZON = flags.DEFINE_integer("horizon", None, "turn limit (default: the config's "
                                "sft.record_horizon, else train.eval_horizon)")
_OFFSET = flags.DEFINE_integer("offset", 0, "start position in the split (other tasks)")
_WORKERS = flags.DEFINE_integer("workers", 1, "worker processes (each with its own "
                                "environment server)")
_TIMEOUT = flags.DEFINE_float("timeout", 0.0, "with --workers > 1: kill workers still running "
                              "after this many seconds, keep the finished parts (0: no limit)")
_ACT_TIMEOUT = flags.DEFINE_float("act_timeout", 10.0, "wall-clock limit of one expert action "
                                  "(seconds; the episode fails past it; 0: none)")
_PROGRESS_EVERY = flags.DEFINE_integer("progress_every", 100, "a progress line every this many "
                                       "episodes (per worker)")


def main(argv: list[str], config: RunConfig | None) -> int:
    """``config``: the typed ``RunConfig`` of --config (None: the defaults)."""
    del argv
    logging.basicConfig(level=logging.WARNING)
    absl_logging.set_verbosity(absl_logging.WARNING)
    if _ENV.value is None or _OUT.value is None:
        raise app.UsageError("--env and --out are required")
    if config is None:
        from agentrl_jax.training.config.sections import RunConfig
        config = RunConfig()
    horizon = _HORIZON.value or config.sft.record_horizon
    episodes = _EPISODES.value or config.sft.record_episodes
    from agentrl_jax.training.jobs.record_experts import record_experts_parallel

    try:
        meta = record_experts_parallel(config, _ENV.value, episodes, _OUT.value,
                                       workers=_WORKERS.value, split=_SPLIT.value,
                                       horizon=horizon, offset=_OFFSET.value,
                                       progress_every=_PROGRESS_EVERY.value,
                                       act_timeout_s=_ACT_TIMEOUT.value or None,
                                       shard_timeout_s=_TIMEOUT.value or None,
                                       expert=_EXPERT.value)
    except KeyboardInterrupt:
        print("recording interrupted (Ctrl-C); environment servers stopped", file=sys.stderr)
        return 130
    return 0 if meta["successful"] else 1


if __name__ == "__main__":
    from agentrl_jax.training.config.command_line import run_main

    run_main(main)  # --config mistakes: one line each, exit code 2
