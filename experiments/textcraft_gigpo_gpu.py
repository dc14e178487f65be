"""TextCraft + SmolLM2-135M-Instruct + GiGPO on one GPU: ``textcraft_grpo_gpu.py`` with the
GiGPO estimator (TextCraft reports its state: the inventory). See ``babyai_gigpo_gpu.py``.
"""

from experiments.babyai_gigpo_gpu import use_gigpo
from experiments.textcraft_grpo_gpu import get_config as grpo_config


def get_config():
    return use_gigpo(grpo_config())
