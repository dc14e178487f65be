"""TextCraft + SmolLM2-135M-Instruct + GRPO + ScalingInter-RL on one GPU: the learning result.

The published schedule (10 -> 20 -> 30 turns) compressed for a ~10-minute budget; the same
learning defaults as ``babyai_grpo_gpu.py`` (packed rows, flat groups skipped, no entropy bonus
or KL term, truncated importance sampling, two optimiser steps per rollout batch).
Evaluation: 128 held-out test tasks x 4 samples, 30 turns, before and after training.
"""

from experiments.babyai_grpo_gpu import get_config as babyai_config


def get_config():
    c = babyai_config()
    c.env.names = "textcraft"
    c.env.server_args = {"textcraft": "--max-sessions 1024"}
    c.horizon.phases = (10, 20, 30)
    c.horizon.steps_per_phase = 15
    c.rollout.max_context = 4096
    c.rollout.max_new_tokens = 32
    c.learner.pack_length = 4096
    c.train.eval_horizon = 30
    return c
