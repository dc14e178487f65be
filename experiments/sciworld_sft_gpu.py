"""Behaviour cloning of ScienceWorld's gold action sequences on one GPU:
``sciworld_grpo_gpu.py``'s model, answer format, engine, packed learner and evaluation, with
the ``sft`` loss. Data: ``launch/record_experts.py --env scienceworld --config
experiments/sciworld_sft_gpu.py`` (``benchmarks/families_gpu.sh`` records it), recorded with
the evaluation horizon (30 turns): a gold path longer than that (about half of the train
variations) is recorded up to the limit, and such an episode, which earned part of the score,
is kept as a demonstration (``sft.only_success`` keeps episodes with a positive reward).
"""

from experiments.babyai_sft import sft_learner, sft_section
from experiments.sciworld_grpo_gpu import get_config as rl_config


def get_config():
    c = rl_config()
    c.sft = sft_section(data="runs/families/experts", record_horizon=int(c.train.eval_horizon))
    c.sft.record_episodes = 320  # launch/record_experts.py's default
    c.sft.batch_size = 16
    c.sft.epochs = 8
    c.sft.max_seconds = 120.0
    sft_learner(c, learning_rate=2e-5)
    return c
