"""TextCraft + GRPO + ScalingInter-RL (10 -> 20 -> 30 turns, K=100).
"""

from agentrl_jax.training.config import base_config


def get_config():
    c = base_config()
    c.env.names = "textcraft"
    c.horizon.phases = (10, 20, 30)
    c.horizon.steps_per_phase = 100
    c.train.eval_horizon = 30
    return c
