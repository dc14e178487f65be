"""BabyAI + PPO (critic, GAE) + ScalingInter-RL.
"""

from agentrl_jax.training.config import base_config, use_ppo


def get_config():
    c = base_config()
    c.env.names = "babyai"
    c.horizon.phases = (6, 13, 20)
    c.horizon.steps_per_phase = 100
    c.train.eval_horizon = 20
    use_ppo(c)
    return c
