"""Web navigation (MiniWoB++) + SmolLM2-135M-Instruct + GRPO + ScalingInter-RL on one GPU,
sized like ``babyai_grpo_gpu.py`` (its learning defaults: packed rows, flat groups skipped, no
entropy bonus or KL term, float32 sampler and learner, truncated importance sampling).

Each episode drives its own headless Chromium (~1 GB and a CPU core while it renders), so the
machine's CPUs, not the GPU, bound the episodes in flight: 24 here for a 16-core, 128 GB host.
A machine without Chromium gets it from ``benchmarks/chromium_portable.sh`` (``unpack``, then
``source benchmarks/chromium_portable.sh env PREFIX`` before the run). The published schedule
(8 -> 12 -> 15 turns) compressed for a few minutes of training. Evaluation: 128 held-out test
episodes (evenly spaced over the tasks' test seeds) x 4 samples, 15 turns.
"""

from experiments.babyai_grpo_gpu import get_config as babyai_config


def get_config():
    c = babyai_config()
    c.env.names = "miniwob"
    c.env.server_args = {"miniwob": "--max-sessions 64 --max-steps 15"}
    c.env.timeout = 300.0  # a browser's start can take seconds when many start together
    c.horizon.phases = (8, 12, 15)
    c.horizon.steps_per_phase = 8
    c.rollout.max_batch = 32
    c.rollout.max_concurrency = 24
    c.rollout.max_context = 6144
    c.rollout.max_new_tokens = 32
    c.learner.pack_length = 6144
    c.train.tasks_per_step = 12
    c.train.samples_per_task = 8
    c.train.eval_horizon = 15
    return c
