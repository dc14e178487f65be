"""BabyAI + SmolLM2-135M-Instruct + GRPO + ScalingInter-RL (6 -> 13 -> 20 turns, K=100).

The README's main job.
"""

from agentrl_jax.training.config import base_config


def get_config():
    c = base_config()
    c.env.names = "babyai"
    c.horizon.phases = (6, 13, 20)
    c.horizon.steps_per_phase = 100
    c.train.eval_horizon = 20
    return c
