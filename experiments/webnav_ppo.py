"""Web navigation (MiniWoB++) + PPO (critic, GAE) + ScalingInter-RL.
"""

from agentrl_jax.training.config import base_config, use_ppo


def get_config():
    c = base_config()
    c.env.names = "miniwob"
    c.horizon.phases = (8, 12, 15)
    c.horizon.steps_per_phase = 80
    c.train.eval_horizon = 15
    c.rollout.max_concurrency = 8  # one headless Chromium per episode
    use_ppo(c)
    return c
