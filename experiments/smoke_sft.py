"""Smoke test of behaviour cloning: a tiny random model (SmolLM2 tokenizer) on BabyAI expert
episodes, a few steps and a two-task evaluation; about a minute on 2 CPU cores.

    python launch/record_experts.py --env babyai --episodes 16 --out /tmp/experts \
        --config experiments/smoke_sft.py
    python launch/sft.py --config experiments/smoke_sft.py --config.sft.data=/tmp/experts \
        --workdir /tmp/smoke_sft
"""

from experiments.babyai_sft import sft_learner, sft_section
from experiments.smoke import get_config as smoke_config


def get_config():
    c = smoke_config()
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
