"""Pure RL math for agentrl-jax: advantage estimators, policy / value / entropy
losses, KL estimators. Everything is a pure, jit-able JAX function over
``[batch, time]`` arrays; see ``docs/ALGORITHMS.md`` for the formulas.
"""

from .advantages import (
    ADVANTAGE_ESTIMATORS,
    LOGPROB_INPUTS,
    TURN_INPUTS,
    AdvantageOutput,
    compute_advantages,
    get_advantage_estimator,
    is_logprob_level,
    is_turn_level,
    register_advantage_estimator,
)
from .gae import GAE_METHODS, gae_advantages_raw  # registers "gae"
from . import outcome  # noqa: F401  (registers grpo, dr_grpo, rloo, reinforce_pp(_baseline))
from .gigpo import anchor_group_ids, gigpo, turn_returns  # registers "gigpo"
from .dpo import dpo  # registers "dpo"
from .kl import (
    KL_ESTIMATORS,
    get_kl_estimator,
    kl_estimate,
    kl_k1,
    kl_k2,
    kl_k3,
    kl_loss,
    kl_penalized_token_rewards,
)
from .losses import (
    LOSS_AGGREGATIONS,
    POLICY_LOSSES,
    actor_loss,
    aggregate_loss,
    aggregation_weights,
    entropy_from_logits,
    entropy_from_logits_chunked,
    get_policy_loss,
    is_supervised,
    log_probs_and_entropy,
    log_probs_from_logits,
    ppo_policy_loss,
    sft_policy_loss,
    value_loss,
)
from .masked import (
    GroupStats,
    effective_token_rewards,
    group_stats,
    last_generated_index,
    masked_mean,
    masked_var,
    masked_whiten,
    outcome_scores,
    place_outcome_reward,
)
from .scan import masked_discounted_suffix_sum, reverse_linear_recurrence

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "GAE_METHODS",
    "AdvantageOutput",
    "compute_advantages",
    "gae_advantages_raw",
    "get_advantage_estimator",
    "register_advantage_estimator",
    "TURN_INPUTS",
    "is_turn_level",
    "LOGPROB_INPUTS",
    "is_logprob_level",
    "dpo",
    "anchor_group_ids",
    "gigpo",
    "turn_returns",
    "KL_ESTIMATORS",
    "get_kl_estimator",
    "kl_estimate",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "kl_loss",
    "kl_penalized_token_rewards",
    "LOSS_AGGREGATIONS",
    "POLICY_LOSSES",
    "actor_loss",
    "aggregate_loss",
    "aggregation_weights",
    "entropy_from_logits",
    "entropy_from_logits_chunked",
    "get_policy_loss",
    "is_supervised",
    "sft_policy_loss",
    "log_probs_and_entropy",
    "log_probs_from_logits",
    "ppo_policy_loss",
    "value_loss",
    "GroupStats",
    "effective_token_rewards",
    "group_stats",
    "last_generated_index",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "outcome_scores",
    "place_outcome_reward",
    "masked_discounted_suffix_sum",
    "reverse_linear_recurrence",
]
