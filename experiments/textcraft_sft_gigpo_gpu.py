"""SFT + GiGPO on TextCraft: ``textcraft_sft_grpo_gpu.py`` (the behaviour-cloned policy, same
budget, seeds, schedule and learner) with the GiGPO estimator (anchor states: the inventory).
From the base model TextCraft gives RL no signal (0/472 successes: every group is flat), so the
GiGPO - GRPO comparison on TextCraft starts from the SFT policy (``benchmarks/issue15_gpu.sh``);
override the policy with ``--config.model.name=<sft>/model``.
"""

from experiments.babyai_gigpo_gpu import use_gigpo
from experiments.textcraft_sft_grpo_gpu import get_config as sft_grpo_config


def get_config():
    return use_gigpo(sft_grpo_config())
