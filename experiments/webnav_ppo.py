"""Web navigation (MiniWoB++) + PPO (critic, GAE) + ScalingInter-RL: the webnav_grpo_scaling experiment with PPO (critic + GAE) instead of GRPO."""

from agentrl_jax.training.config import use_ppo
from experiments.webnav_grpo_scaling import get_config as grpo_scaling_config


def get_config():
    return use_ppo(grpo_scaling_config())
