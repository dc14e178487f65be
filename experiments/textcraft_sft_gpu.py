"""Behaviour cloning of the TextCraft recipe expert on one GPU, sized for ~7 minutes:
``textcraft_grpo_gpu.py``'s model, answer format, engine, packed learner and evaluation (all
118 held-out goals x 4), with the ``sft`` loss. Data: ``launch/record_experts.py --env
textcraft --config experiments/textcraft_sft_gpu.py`` (one episode per train goal: 426).
"""

from experiments.babyai_sft import sft_learner, sft_section
from experiments.textcraft_grpo_gpu import get_config as rl_config


def get_config():
    c = rl_config()
    c.sft = sft_section(data="runs/issue15/experts", record_horizon=int(c.train.eval_horizon))
    c.sft.record_episodes = 426  # launch/record_experts.py's default
    c.sft.batch_size = 16
    c.sft.epochs = 8
    c.sft.max_seconds = 240.0
    sft_learner(c, learning_rate=2e-5)
    return c
