"""Behaviour cloning on BabyAI of minigrid's BabyAIBot shortened with macro actions
(``sft.expert = "babyai_macro"``; ``--expert babyai`` records the primitive bot),
SmolLM2-135M-Instruct (CPU-sized; the one-GPU version is ``babyai_sft_gpu.py``).

    python launch/record_experts.py --env babyai --episodes 2000 --out runs/experts \
        --config experiments/babyai_sft.py
    python launch/sft.py --config experiments/babyai_sft.py --workdir runs/babyai_sft

The answer format, context and evaluation are those of ``babyai_grpo_gpu.py`` (the RL run that
starts from the SFT policy: ``--config.model.name=runs/babyai_sft/model``), so the recorded
token layout is the one RL trains on. The expert is the bot's own solution with every stretch
that a macro action (``go to <object>``) reaches replaced by it; episodes are recorded with the
evaluation horizon (20 turns) and only successful ones are trained on.
"""

from ml_collections import ConfigDict

from agentrl_jax.training.config import base_config
from experiments.babyai_grpo_gpu import get_config as rl_config


def sft_section(data: str = "runs/experts", record_horizon: int = 20) -> ConfigDict:
    """The ``sft`` section (its other keys keep their defaults, training/config_sections.py's
    SFTConfig): expert episodes from ``data`` (a directory of <env>.jsonl from
    launch/record_experts.py, or files), recorded with ``record_horizon`` turns."""
    s = base_config().sft
    s.data = data
    s.record_horizon = record_horizon
    return s


def sft_learner(c: ConfigDict, learning_rate: float = 1e-5) -> ConfigDict:
    """The learner of an RL config turned into the SFT learner (same model, mesh, packing)."""
    c.learner.policy_loss = "sft"
    c.learner.learning_rate = learning_rate
    c.learner.lr_schedule = "warmup_constant"
    c.learner.warmup_steps = 10
    c.learner.kl_coef = 0.0
    c.learner.entropy_coef = 0.0
    c.learner.mini_batches = 1
    c.learner.epochs = 1
    c.learner.tis_cap = None
    c.learner.loss_agg_mode = "token_mean"
    return c


def get_config():
    c = rl_config()
    c.sft = sft_section(record_horizon=int(c.train.eval_horizon))
    c.sft.record_episodes = 2000  # launch/record_experts.py's default
    c.sft.expert = "babyai_macro"
    sft_learner(c)
    # CPU sizes (the GPU config keeps the RL config's engine and packed learner)
    c.learner.attention_impl = None
    c.learner.micro_batch_size = 1
    c.learner.logprob_batch_size = 1
    c.rollout.engine_dtype = ""
    c.rollout.max_batch = 64
    c.rollout.max_concurrency = 64
    c.train.eval_tasks = 32
    return c
