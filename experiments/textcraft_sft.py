"""Behaviour cloning of the TextCraft recipe expert, SmolLM2-135M-Instruct (CPU-sized; the
one-GPU version is ``textcraft_sft_gpu.py``).

    python launch/record_experts.py --env textcraft --episodes 426 --out runs/experts \
        --config experiments/textcraft_sft.py
    python launch/sft.py --config experiments/textcraft_sft.py --workdir runs/textcraft_sft

The answer format, context and evaluation are those of ``textcraft_grpo_gpu.py``. The train
split has 426 goals (one expert episode each; the expert solves all but one in 30 turns).
"""

from experiments.babyai_sft import sft_learner, sft_section
from experiments.textcraft_grpo_gpu import get_config as rl_config


def get_config():
    c = rl_config()
    c.sft = sft_section(record_horizon=int(c.train.eval_horizon))
    c.sft.record_episodes = 426  # launch/record_experts.py's default
    c.sft.epochs = 3
    sft_learner(c)
    c.learner.attention_impl = None
    c.learner.micro_batch_size = 1
    c.learner.logprob_batch_size = 1
    c.rollout.engine_dtype = ""
    c.rollout.max_batch = 64
    c.rollout.max_concurrency = 64
    c.train.eval_tasks = 32
    return c
