"""BabyAI + SmolLM2-135M-Instruct + GiGPO on one GPU: ``babyai_grpo_gpu.py`` (same budget,
seeds, schedule and learner) with the GiGPO estimator (docs/ALGORITHMS.md): episode groups
plus anchor-state step groups (BabyAI reports its state: minigrid's hash + what the agent
carries), per-turn discount 0.95 (the paper's), omega 1, std normalisation at both levels.
"""

from ml_collections import ConfigDict

from experiments.babyai_grpo_gpu import get_config as grpo_config


def use_gigpo(c: ConfigDict, gamma: float = 0.95, omega: float = 1.0,
              norm_std: bool = True) -> ConfigDict:
    c.learner.advantage_estimator = "gigpo"
    c.learner.gamma = gamma
    c.learner.advantage_kwargs = ConfigDict({"omega": omega, "norm_std": norm_std})
    return c


def get_config():
    return use_gigpo(grpo_config())
