"""BabyAI + SmolLM2-135M-Instruct with DPO on pairs from the same rollouts (algorithms/dpo.py):
``babyai_grpo_gpu.py``'s rollouts, budget and evaluation; each task's successful episodes
against its failed ones, beta 0.1, through the supervised loss (one optimiser step per
rollout batch, so each step is exact DPO at the sampling parameters). Not part of
``benchmarks/issue15_gpu.sh``; run it like the other GPU configs.
"""

from ml_collections import ConfigDict

from experiments.babyai_grpo_gpu import get_config as grpo_config


def get_config():
    c = grpo_config()
    c.learner.advantage_estimator = "dpo"
    c.learner.advantage_kwargs = ConfigDict({"beta": 0.1})
    c.learner.policy_loss = "sft"
    c.learner.loss_agg_mode = "seq_mean_token_sum"
    c.learner.mini_batches = 1
    c.learner.tis_cap = None
    return c
