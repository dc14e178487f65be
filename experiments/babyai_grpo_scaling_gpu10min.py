"""BabyAI + SmolLM2-135M-Instruct + GRPO + ScalingInter-RL, sized for a 10-minute run on one GPU.

The published schedule (6 -> 13 -> 20 turns, 100 steps per phase) compressed to 8 steps per
phase; training stops after ``train.max_seconds`` and the policy is evaluated on 64 held-out
test tasks (k=4, 20 turns) before and after training. bf16 rollout and learner compute.
Each assistant turn is opened with "Action:" (the 135M model cannot follow a ReAct format).
"""

from agentrl_jax.training.config import base_config


def get_config():
    c = base_config()
    c.env.names = "babyai"
    c.env.server_args = {"babyai": "--max-sessions 1024"}
    c.horizon.phases = (6, 13, 20)
    c.horizon.steps_per_phase = 8
    c.rollout.engine_dtype = "bfloat16"
    c.rollout.max_batch = 128
    c.rollout.max_concurrency = 128
    c.rollout.max_context = 4096
    c.rollout.max_new_tokens = 24
    # SmolLM2-135M does not follow a ReAct format at temperature 1 (0 of 256 base-model episodes
    # produced an "Action:" line); opening each assistant turn with "Action:" lets it act.
    c.agent.prompt_style = "action"
    c.agent.response_prefix = "Action:"
    c.rollout.stop = ()  # as measured in docs/RESULTS.md (base_config ends turns at "\n")
    c.train.total_steps = 1000
    c.train.max_seconds = 330.0
    c.train.tasks_per_step = 32
    c.train.samples_per_task = 8
    c.train.save_every = 1000
    c.train.eval_every = 0
    c.train.eval_tasks = 64
    c.train.eval_samples = 4
    c.train.eval_horizon = 20
    c.learner.learning_rate = 1e-5
    c.learner.dtype = "bfloat16"
    c.learner.micro_batch_size = 32
    return c
