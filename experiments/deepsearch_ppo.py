"""Deep search + PPO (critic, GAE) + ScalingInter-RL.
"""

from agentrl_jax.training.config import base_config, use_ppo


def get_config():
    c = base_config()
    c.env.names = "deepsearch"
    c.horizon.phases = (5, 8, 10)
    c.horizon.steps_per_phase = 100
    c.train.eval_horizon = 30
    use_ppo(c)
    return c
