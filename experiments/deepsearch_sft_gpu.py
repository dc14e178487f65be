"""Behaviour cloning of the deep-search retrieval oracle on one GPU: ``deepsearch_grpo_gpu.py``'s
model, answer format, engine, packed learner and evaluation, with the ``sft`` loss. Data:
``launch/record_experts.py --env deepsearch --config experiments/deepsearch_sft_gpu.py``
(``benchmarks/families_gpu.sh`` records it: the oracle searches with the question and answers
with the golden title found in a passage; only successful episodes are trained on).
"""

from experiments.babyai_sft import sft_learner, sft_section
from experiments.deepsearch_grpo_gpu import get_config as rl_config


def get_config():
    c = rl_config()
    c.sft = sft_section(data="runs/families/experts", record_horizon=int(c.train.eval_horizon))
    c.sft.record_episodes = 1000  # launch/record_experts.py's default
    c.sft.batch_size = 32
    c.sft.epochs = 4
    c.sft.max_seconds = 120.0
    sft_learner(c, learning_rate=2e-5)
    return c
