"""Deep search (BM25 over offline Wikipedia) + GRPO + ScalingInter-RL (5 -> 8 -> 10, K=100).
"""

from agentrl_jax.training.config import base_config


def get_config():
    c = base_config()
    c.env.names = "deepsearch"
    c.horizon.phases = (5, 8, 10)
    c.horizon.steps_per_phase = 100
    c.train.eval_horizon = 30
    c.rollout.max_new_tokens = 64  # "<search> query </search>" / "<answer> ... </answer>"
    return c
