"""TextCraft + PPO (critic, GAE) + ScalingInter-RL.
"""

from agentrl_jax.training.config import base_config, use_ppo


def get_config():
    c = base_config()
    c.env.names = "textcraft"
    c.horizon.phases = (10, 20, 30)
    c.horizon.steps_per_phase = 100
    c.train.eval_horizon = 30
    use_ppo(c)
    return c
