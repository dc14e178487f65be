"""Web navigation (MiniWoB++) + GRPO + ScalingInter-RL (8 -> 12 -> 15 turns, K=80).
"""

from agentrl_jax.training.config import base_config


def get_config():
    c = base_config()
    c.env.names = "miniwob"
    c.horizon.phases = (8, 12, 15)
    c.horizon.steps_per_phase = 80
    c.train.eval_horizon = 15
    c.rollout.max_concurrency = 8  # one headless Chromium per episode
    return c
