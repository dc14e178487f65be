"""ScienceWorld + SmolLM2-135M-Instruct + GRPO + ScalingInter-RL on one GPU, sized like
``babyai_grpo_gpu.py`` (~10 minutes with both evaluations).

The published schedule (10 -> 20 -> 30 turns) compressed for a few minutes of training, with
the learning defaults of ``babyai_grpo_gpu.py`` (packed rows, flat groups skipped, no entropy
bonus or KL term, float32 sampler and learner, truncated importance sampling). The reward is
the simulator's score gain / 100 (an episode's rewards sum to its final score / 100), so
partial progress is rewarded; ``success`` is a score of 100.

Simulators: each is a JVM (~2 GB), borrowed per episode from a pool; four server processes of 16
JVMs each, and at most 64 episodes in flight (a pool's waiting borrowers are bounded: more
episodes than simulators would fail); a 64-core machine runs two such jobs side by side.
Evaluation: 128 of the 1,819 held-out test variations (evenly spaced: 26 of the 30 task types)
x 4 samples, 30 turns (its duration: docs/RESULTS.md).
"""

from experiments.babyai_grpo_gpu import get_config as babyai_config


def get_config():
    c = babyai_config()
    c.env.names = "scienceworld"
    c.env.server_args = {"scienceworld": "--pool-size 16 --max-sessions 1024 --max-steps 100"}
    c.env.replicas = 4
    c.horizon.phases = (10, 20, 30)
    c.horizon.steps_per_phase = 4
    c.rollout.max_concurrency = 64
    c.rollout.max_batch = 64
    c.rollout.max_context = 6144
    c.rollout.max_new_tokens = 32
    c.learner.pack_length = 6144
    c.train.tasks_per_step = 16
    c.train.samples_per_task = 8
    c.train.eval_horizon = 30
    return c
