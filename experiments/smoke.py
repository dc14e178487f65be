"""Random-model system checks on a CPU: a tiny model (SmolLM2 tokenizer) through the real system.

    python launch/run.py --config experiments/smoke.py                   # smoke

Not learning configs: the models are untrained, so rewards are near zero. Variants:

================== =========================================================================
smoke              the default: a few RL steps on real BabyAI and TextCraft servers
sft                behaviour cloning on BabyAI expert episodes, a few steps
first_trainer_cpu  the first-trainer update check: packed rows, every group trained
================== =========================================================================
"""

from __future__ import annotations

from ml_collections import ConfigDict

from agentrl_jax.training.config.experiment import base_config
from experiments.common import select, sft_learner, sft_section

DEFAULT = "smoke"


def smoke() -> ConfigDict:
    """A tiny random model on real BabyAI and TextCraft servers: a few RL steps on 2 CPU
    cores. It exercises every part of the system: servers, engine, actor pool,
    learner, checkpoints, TensorBoard, trajectory logs, evaluation."""
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


def sft() -> ConfigDict:
    """Behaviour cloning smoke: the tiny random model on BabyAI expert episodes, a few steps and
    a two-task evaluation, on 2 CPU cores::

        python launch/record_experts.py --env babyai --episodes 16 --out /tmp/experts \\
            --config experiments/smoke.py:sft
        python launch/sft.py --config experiments/smoke.py:sft --config.sft.data=/tmp/experts \\
            --workdir /tmp/smoke_sft
    """
    c = smoke()
    c.env.names = "babyai"
    c.sft = sft_section(record_horizon=8)
    c.sft.batch_size = 4
    c.sft.steps = 3
    c.sft.log_every = 1
    sft_learner(c, learning_rate=1e-3)
    c.learner.warmup_steps = 0
    c.learner.micro_batch_size = 2
    c.train.eval_tasks = 2
    c.train.eval_samples = 1
    c.train.eval_horizon = 2
    return c


def first_trainer_cpu() -> ConfigDict:
    """The first-trainer update check: a small random model on BabyAI with packed learner rows
    (one compiled shape) and every group trained, so two trainers in one process see the same
    batches (``benchmarks/speed/rl_step.py --config experiments/smoke.py:first_trainer_cpu --steps 6
    --variants packed,packed``; docs/PERFORMANCE.md, "Our engine beside SGLang"). The untrained
    model earns no reward at this horizon."""
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


VARIANTS = {"smoke": smoke, "sft": sft, "first_trainer_cpu": first_trainer_cpu}


def get_config(variant: str | None = None) -> ConfigDict:
    """The config of ``variant`` (default ``smoke``)."""
    return select(VARIANTS, DEFAULT, variant, __file__)
