"""DPO (Rafailov et al. 2023) on pairs from the same rollouts, as per-token weights of the
supervised loss: a second trainer mode that is the RL loop itself (same rollouts, learner,
checkpoints), with ``advantage_estimator="dpo"``, ``policy_loss="sft"`` and
``loss_agg_mode="seq_mean_token_sum"``.

Pairs: within each group (one task's episodes), every successful episode (score > 0, the
evaluation's success) against every failed one. With ``s_i = sum_t m_it (logp_it - ref_it)``
(the sequence log-ratio over the generated tokens) and ``P`` pairs in the batch::

    L_DPO = (1 / P) sum_{(w, l)} -log sigmoid(beta (s_w - s_l))
    dL/dlogp_it = -(beta / P) m_it [ sum_{l: (i, l)} sigmoid(-beta (s_i - s_l))
                                    - sum_{w: (w, i)} sigmoid(-beta (s_w - s_i)) ] = -c_i m_it

The estimator returns ``A_it = N c_i m_it`` (``N``: the batch's non-empty rows), so the ``sft``
loss ``(1/N) sum_i sum_t -A_it logp_it`` (``seq_mean_token_sum``) has exactly the DPO gradient
at the parameters the log-probs were computed with: the first optimiser step of an update is
exact DPO (``mini_batches = epochs = 1`` keeps it so; later steps of one update reuse the
weights, as PPO reuses its advantages). ``logprobs`` must be the current policy's (the learner's
recomputed "old" log-probs; the packed path always recomputes them). Rows in no pair get 0.
``returns`` holds ``-log sigmoid(beta (s_w - s_l))`` averaged over each row's pairs (metrics).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .advantages import (LOGPROB_INPUTS, AdvantageInputs, AdvantageOutput, AdvantageSettings,
                         register_advantage_estimator)
from .masked import as_mask, dense_group_index, outcome_scores

__all__ = ["dpo"]


@register_advantage_estimator("dpo", inputs=("group_ids", "token_rewards") + LOGPROB_INPUTS,
                              options=("beta",), supervised_loss=True,
                              loss_agg_mode="seq_mean_token_sum", min_group_size=2)
def dpo(x: AdvantageInputs, settings: AdvantageSettings, *, beta: float = 0.1) -> AdvantageOutput:
    """Per-token DPO weights (see the module docstring). Trained with the supervised loss
    aggregated by ``seq_mean_token_sum`` (the record says so; config validation reads it)."""
    if x.group_ids is None or x.logprobs is None or x.ref_logprobs is None:
        raise ValueError("the 'dpo' estimator needs group_ids [B], logprobs [B, T] and "
                         "ref_logprobs [B, T] (the learner passes them)")
    rewards, loss_mask, group_ids, token_rewards = x.rewards, x.loss_mask, x.group_ids, x.token_rewards
    logprobs, ref_logprobs = x.logprobs, x.ref_logprobs
    m = as_mask(loss_mask)
    valid = jnp.any(m > 0, axis=-1)
    R = outcome_scores(rewards, m, token_rewards)
    win, lose = valid & (R > 0), valid & ~(R > 0)
    s = jnp.sum(m * (jnp.asarray(logprobs, jnp.float32)
                     - jnp.asarray(ref_logprobs, jnp.float32)), axis=-1)
    g = dense_group_index(group_ids)
    pair = (g[:, None] == g[None, :]) & win[:, None] & lose[None, :]  # [chosen, rejected]
    pairf = pair.astype(jnp.float32)
    n_pairs = jnp.maximum(jnp.sum(pairf), 1.0)
    margin = beta * (s[:, None] - s[None, :])
    w = pairf * jax.nn.sigmoid(-margin)
    coef = beta * (jnp.sum(w, axis=1) - jnp.sum(w, axis=0)) / n_pairs
    n_rows = jnp.sum(valid.astype(jnp.float32))
    adv = (n_rows * coef)[:, None] * m
    loss = pairf * -jax.nn.log_sigmoid(margin)
    in_pairs = jnp.sum(pairf, axis=1) + jnp.sum(pairf, axis=0)
    per_row = (jnp.sum(loss, axis=1) + jnp.sum(loss, axis=0)) / jnp.maximum(in_pairs, 1.0)
    return AdvantageOutput(adv, per_row[:, None] * m)
