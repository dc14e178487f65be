"""BabyAI + GRPO with a fixed 20-turn horizon (the ScalingInter baseline).
"""

from agentrl_jax.training.config import base_config, use_fixed_horizon


def get_config():
    c = base_config()
    c.env.names = "babyai"
    use_fixed_horizon(c, 20)
    c.train.eval_horizon = 20
    return c
