"""ScienceWorld + PPO (critic, GAE) + ScalingInter-RL.
"""

from agentrl_jax.training.config import base_config, use_ppo


def get_config():
    c = base_config()
    c.env.names = "scienceworld"
    c.horizon.phases = (10, 20, 30)
    c.horizon.steps_per_phase = 100
    c.train.eval_horizon = 30
    c.rollout.max_concurrency = 8  # each ScienceWorld simulator is a ~2 GB JVM
    c.env.server_args = {"scienceworld": "--pool-size 4"}
    use_ppo(c)
    return c
