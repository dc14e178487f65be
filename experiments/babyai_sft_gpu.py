"""Behaviour cloning of the BabyAI macro expert on one GPU, sized for ~7 minutes:
``babyai_grpo_gpu.py``'s model, answer format, engine, packed learner and evaluation (128
held-out tasks x 4), with the ``sft`` loss. Data: ``launch/record_experts.py --env babyai
--config experiments/babyai_sft_gpu.py`` records ``sft.expert``, BabyAIBot's solutions
shortened with macro actions (``babyai_macro``; docs/RESULTS.md, "BabyAI: behaviour cloning on
a macro-action expert"). ``benchmarks/issue15_gpu.sh`` (the results table's SFT rows) records
the primitive BabyAIBot with ``--expert babyai``.
"""

from experiments.babyai_grpo_gpu import get_config as rl_config
from experiments.babyai_sft import sft_learner, sft_section


def get_config():
    c = rl_config()
    c.sft = sft_section(data="runs/issue15/experts", record_horizon=int(c.train.eval_horizon))
    c.sft.record_episodes = 2000  # launch/record_experts.py's default
    c.sft.batch_size = 32
    c.sft.epochs = 4
    c.sft.max_seconds = 240.0
    c.sft.expert = "babyai_macro"
    sft_learner(c, learning_rate=2e-5)
    return c
