"""SFT + RL on TextCraft: ``textcraft_grpo_gpu.py`` started from the behaviour-cloned policy of
``launch/sft.py --config experiments/textcraft_sft_gpu.py --workdir runs/issue15/textcraft_sft``
(override with ``--config.model.name=<sft workdir>/model``).
"""

from experiments.textcraft_grpo_gpu import get_config as rl_config


def get_config():
    c = rl_config()
    c.model.name = "runs/issue15/textcraft_sft/model"
    return c
