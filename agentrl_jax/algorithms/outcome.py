"""Outcome-based advantage estimators: one score per trajectory, baselined within its group
of samples of the same task (GRPO, Dr.GRPO, RLOO) or over the batch (REINFORCE++ and its
group-baseline variant). Batch contract: :mod:`agentrl_jax.algorithms.advantages`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .advantages import (ADVANTAGE_ESTIMATORS, AdvantageInputs, AdvantageOutput, AdvantageSettings,
                         register_advantage_estimator)
from .masked import as_mask, effective_token_rewards, group_stats, masked_whiten, outcome_scores
from .scan import masked_discounted_suffix_sum

Array = jax.Array

__all__ = ["grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"]


def _require_groups(group_ids, name: str):
    if group_ids is None:
        raise ValueError(f"the {name!r} estimator needs group_ids [B]")


def _outcome_setup(rewards, loss_mask, token_rewards, group_ids):
    m = as_mask(loss_mask)
    valid = jnp.any(m > 0, axis=-1)
    R = outcome_scores(rewards, m, token_rewards)
    st = group_stats(R, group_ids, valid)
    return m, valid, R, st


@register_advantage_estimator("grpo", inputs=("group_ids", "token_rewards"),
                              episode_scalar=True, min_group_size=2)
def grpo(x: AdvantageInputs, settings: AdvantageSettings) -> AdvantageOutput:
    """GRPO: ``A_i = (R_i - mean_g) / (std_g + eps)`` broadcast on generated tokens.

    ``R_i = rewards_i + sum_t m_t token_rewards_t``; group stats over the valid
    (not fully masked) samples of the group, ``std`` unbiased (ddof=1) as verl's
    ``torch.std`` and Tunix's ``std(ddof=1)``. Groups of one give ``A = 0``
    (verl instead uses mean 0 / std 1, i.e. ``A = R``); zero-variance groups give 0.
    """
    _require_groups(x.group_ids, "grpo")
    m, valid, R, st = _outcome_setup(x.rewards, x.loss_mask, x.token_rewards, x.group_ids)
    a = jnp.where(valid & (st.count >= 2), (R - st.mean) / (st.std + settings.eps), 0.0)
    adv = a[:, None] * m
    return AdvantageOutput(adv, adv)


@register_advantage_estimator("dr_grpo", inputs=("group_ids", "token_rewards"),
                              episode_scalar=True, min_group_size=2)
def dr_grpo(x: AdvantageInputs, settings: AdvantageSettings) -> AdvantageOutput:
    """Dr.GRPO: ``A_i = R_i - mean_g`` (no std division; pair it with the
    ``seq_mean_token_sum_norm`` loss aggregation). verl: ``grpo`` with
    ``norm_adv_by_std_in_grpo=False``; Tunix: ``std_scale=False``."""
    _require_groups(x.group_ids, "dr_grpo")
    m, valid, R, st = _outcome_setup(x.rewards, x.loss_mask, x.token_rewards, x.group_ids)
    a = jnp.where(valid & (st.count >= 2), R - st.mean, 0.0)
    adv = a[:, None] * m
    return AdvantageOutput(adv, adv)


@register_advantage_estimator("rloo", inputs=("group_ids", "token_rewards"),
                              episode_scalar=True, min_group_size=2)
def rloo(x: AdvantageInputs, settings: AdvantageSettings) -> AdvantageOutput:
    """RLOO: ``A_i = R_i - mean_{j != i} R_j = n/(n-1) * (R_i - mean_g)``; groups of
    one give 0 (verl leaves ``R_i`` there)."""
    _require_groups(x.group_ids, "rloo")
    m, valid, R, st = _outcome_setup(x.rewards, x.loss_mask, x.token_rewards, x.group_ids)
    n = st.count
    a = jnp.where(valid & (n >= 2), n / jnp.maximum(n - 1.0, 1.0) * (R - st.mean), 0.0)
    adv = a[:, None] * m
    return AdvantageOutput(adv, adv)


@register_advantage_estimator("reinforce_pp", inputs=("token_rewards",))
def reinforce_pp(x: AdvantageInputs, settings: AdvantageSettings) -> AdvantageOutput:
    """REINFORCE++: discounted return-to-go over generated tokens, whitened over the
    whole batch's masked tokens.

    ``G_t = r_t + gamma * G_{t+1}`` on generated tokens, ``G_t = G_{t+1}`` on mask-0
    tokens (observations pass the return through; verl's single-turn version resets
    it to 0 after the response, which in multi-turn would cut credit at every
    observation span). ``returns = G * m``; ``advantages = whiten(G over m) * m``.
    """
    m = as_mask(x.loss_mask)
    r = effective_token_rewards(x.rewards, m, x.token_rewards)
    if settings.method in ("auto", "pallas"):
        meth = "scan" if jax.default_backend() == "cpu" else "blocked"
    else:
        meth = settings.method
    G = masked_discounted_suffix_sum(r, m, settings.gamma, method=meth, chunk=settings.chunk) * m
    adv = masked_whiten(G, m) * m if settings.whiten else G
    return AdvantageOutput(adv, G)


@register_advantage_estimator("reinforce_pp_baseline", inputs=("group_ids", "token_rewards"),
                              min_group_size=2)
def reinforce_pp_baseline(x: AdvantageInputs, settings: AdvantageSettings) -> AdvantageOutput:
    """REINFORCE++-baseline: ``s_i = R_i - mean_g`` broadcast on generated tokens,
    then whitened over the batch's masked tokens (verl
    ``reinforce_plus_plus_baseline``; no discounting). Groups of one give ``s = 0``."""
    _require_groups(x.group_ids, "reinforce_pp_baseline")
    m, valid, R, st = _outcome_setup(x.rewards, x.loss_mask, x.token_rewards, x.group_ids)
    s = jnp.where(valid, R - st.mean, 0.0)
    adv = masked_whiten(s[:, None] * m, m) * m
    return AdvantageOutput(adv, adv)


# verl-style aliases
for _alias, _target in (
    ("reinforce_plus_plus", "reinforce_pp"),
    ("reinforce_plus_plus_baseline", "reinforce_pp_baseline"),
    ("drgrpo", "dr_grpo"),
):
    ADVANTAGE_ESTIMATORS.register(_alias, ADVANTAGE_ESTIMATORS.get(_target))
del _alias, _target
