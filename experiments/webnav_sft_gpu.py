"""Behaviour cloning of the MiniWoB++ rule-based expert on one GPU: ``webnav_grpo_gpu.py``'s
model, answer format, engine, packed learner and evaluation, with the ``sft`` loss. Data: the
expert episodes recorded on any machine with Chromium (the GPU host may lack it)::

    python launch/record_experts.py --env miniwob --episodes 400 --workers 4 \
        --config experiments/webnav_sft_gpu.py --out runs/families/experts

(only successful episodes are trained on). The evaluation needs Chromium where it runs
(``benchmarks/chromium_portable.sh``).
"""

from experiments.babyai_sft import sft_learner, sft_section
from experiments.webnav_grpo_gpu import get_config as rl_config


def get_config():
    c = rl_config()
    c.sft = sft_section(data="runs/families/experts", record_horizon=int(c.train.eval_horizon))
    c.sft.batch_size = 32
    c.sft.epochs = 4
    c.sft.max_seconds = 120.0
    c.sft.record_episodes = 400  # launch/record_experts.py's default
    sft_learner(c, learning_rate=2e-5)
    return c
