"""SFT + GiGPO on BabyAI: ``babyai_sft_grpo_gpu.py`` (the behaviour-cloned policy, same budget,
seeds, schedule and learner) with the GiGPO estimator of ``babyai_gigpo_gpu.py``. Started next
to the GRPO run from the same SFT policy, it gives GiGPO - GRPO from SFT
(``benchmarks/issue15_gpu.sh``); override the policy with ``--config.model.name=<sft>/model``.
"""

from experiments.babyai_gigpo_gpu import use_gigpo
from experiments.babyai_sft_grpo_gpu import get_config as sft_grpo_config


def get_config():
    return use_gigpo(sft_grpo_config())
