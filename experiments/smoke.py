"""Smoke test: a tiny random model (SmolLM2 tokenizer) on real BabyAI and TextCraft servers.

Finishes a few RL steps on 2 CPU cores in about a minute; the model is untrained, so rewards are
near zero. It exercises every part of the system: servers, engine, actor pool, learner,
checkpoints, TensorBoard, trajectory logs, evaluation.
"""

from agentrl_jax.training.config import base_config


def get_config():
    c = base_config()
    c.model.random_init = dict(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                               num_kv_heads=2, head_dim=16)
    c.env.names = "babyai,textcraft"
    c.rollout.max_batch = 16
    c.rollout.max_context = 1024
    c.rollout.max_new_tokens = 24
    c.rollout.max_concurrency = 16
    c.rollout.decode_steps = 8
    c.horizon.phases = (2, 3)
    c.horizon.steps_per_phase = 2
    c.train.total_steps = 3
    c.train.tasks_per_step = 2
    c.train.samples_per_task = 2
    c.train.save_every = 1
    c.train.eval_every = 0
    c.train.eval_before = False
    c.train.eval_tasks = 2
    c.train.eval_samples = 1
    c.train.trajectory_share = 1.0  # 4 episodes a step: every one is logged (and tests count them)
    c.train.eval_horizon = 2
    c.learner.learning_rate = 1e-4
    c.learner.micro_batch_size = 8
    c.learner.min_length_bucket = 512
    return c
