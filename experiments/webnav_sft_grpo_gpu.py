"""SFT + RL on web navigation (MiniWoB++): ``webnav_grpo_gpu.py`` started from the
behaviour-cloned policy of ``launch/sft.py --config experiments/webnav_sft_gpu.py --workdir
runs/families/webnav_sft`` (override with ``--config.model.name=<sft workdir>/model``). Its
step-0 evaluation is the SFT policy's; the final one is SFT + RL.
"""

from experiments.webnav_grpo_gpu import get_config as rl_config


def get_config():
    c = rl_config()
    c.model.name = "runs/families/webnav_sft/model"
    return c
