"""SFT + RL on BabyAI: ``babyai_grpo_gpu.py`` started from the behaviour-cloned policy that
``launch/sft.py --config experiments/babyai_sft_gpu.py --workdir runs/issue15/babyai_sft``
exported (override with ``--config.model.name=<sft workdir>/model``). Its step-0 evaluation is
the SFT policy's; the final one is SFT + RL.
"""

from experiments.babyai_grpo_gpu import get_config as rl_config


def get_config():
    c = rl_config()
    c.model.name = "runs/issue15/babyai_sft/model"
    return c
