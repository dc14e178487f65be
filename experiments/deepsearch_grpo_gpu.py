"""Deep search (BM25 over the offline Wikipedia summaries) + SmolLM2-135M-Instruct + GRPO +
ScalingInter-RL on one GPU, sized like ``babyai_grpo_gpu.py`` (~10 minutes with both
evaluations).

The published schedule (5 -> 8 -> 10 turns) compressed for a few minutes of training; the
learning defaults of ``babyai_grpo_gpu.py`` (packed rows, flat groups skipped, no entropy bonus
or KL term, float32 sampler and learner, truncated importance sampling). A turn is
``Action: <search> query </search>`` or ``Action: <answer> text </answer>`` (one line; the
environment reads the first tag). Three passages per search (median 73 words each), so 10
turns fit 4096 tokens. 128 engine slots and episodes in flight (what the measured runs used).
Evaluation: 128 of the 298 held-out questions x 4 samples, 10 turns.
"""

from experiments.babyai_grpo_gpu import get_config as babyai_config


def get_config():
    c = babyai_config()
    c.env.names = "deepsearch"
    c.env.server_args = {"deepsearch": "--max-sessions 1024 --max-steps 30"}
    c.horizon.phases = (5, 8, 10)
    c.horizon.steps_per_phase = 10
    c.rollout.max_batch = 128
    c.rollout.max_concurrency = 128
    c.rollout.max_context = 4096
    c.rollout.max_new_tokens = 64
    c.learner.pack_length = 4096
    c.train.eval_horizon = 10
    return c
