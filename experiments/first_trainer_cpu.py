"""The first-trainer update check on a CPU: a small random model on BabyAI with packed learner
rows (one compiled shape) and every group trained, so two trainers in one process see the same
batches (`benchmarks/rl_step.py --config experiments/first_trainer_cpu.py --steps 6 --variants
packed,packed`; docs/PERFORMANCE.md, "Our engine beside SGLang"). Not a learning config: the
untrained model earns no reward at this horizon.
"""

from agentrl_jax.training.config import base_config


def get_config():
    c = base_config()
    c.model.random_init = dict(hidden_size=128, intermediate_size=256, num_layers=4, num_heads=4,
                               num_kv_heads=2, head_dim=32)
    c.env.names = "babyai"
    c.rollout.max_batch = 16
    c.rollout.max_context = 1024
    c.rollout.max_new_tokens = 24
    c.rollout.max_concurrency = 16
    c.rollout.decode_steps = 8
    c.horizon.phases = (3,)
    c.horizon.steps_per_phase = 100
    c.train.tasks_per_step = 4
    c.train.samples_per_task = 4
    c.train.skip_flat_groups = False
    c.learner.learning_rate = 1e-4
    c.learner.pack_length = 1024
    c.learner.micro_batch_size = 2
    c.learner.logprob_batch_size = 4
    return c
