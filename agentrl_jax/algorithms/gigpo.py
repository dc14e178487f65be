"""GiGPO (group-in-group policy optimisation, Feng et al., arXiv 2505.10978): episode-level
group advantages as GRPO, plus step-level advantages within *anchor-state* groups.

Inputs (``B`` trajectories, ``T`` tokens, ``K`` turn slots)::

    rewards [B]            outcome score R_i (the episode return)
    loss_mask [B, T]       1 on generated tokens
    group_ids [B]          episodes of the same task share an id (any integers)
    turn_ids [B, T]        the turn index k of every token (generated tokens of turn k carry k)
    turn_rewards [B, K]    r_{i,k}: the environment reward of turn k
    turn_anchors [B, K]    the anchor state of turn k (the environment state the turn acted
                           from) as an integer id, < 0 where the episode has no turn k
    token_rewards [B, T]   optional extra per-token rewards (generated tokens only); added to
                           the outcome score and, summed per turn, to the turn rewards

The paper's equations, with ``F(x) = std(x)`` (unbiased) when ``norm_std`` else ``F = 1``::

    episode:  A^E_i   = (R_i - mean_{j in g(i)} R_j) / (F_{g(i)}(R) + eps)
    return:   G_{i,k} = sum_{k' >= k} gamma^(k' - k) r_{i,k'}          (discounted, per turn)
    step:     A^S_{i,k} = (G_{i,k} - mean_{(j,l) in s(i,k)} G_{j,l}) / (F_{s(i,k)}(G) + eps)
              s(i,k) = {(j, l): g(j) = g(i), anchor_{j,l} = anchor_{i,k}}  (the step group)
    combined: A_{i,k} = A^E_i + omega * A^S_{i,k}

and every generated token of turn ``k`` of episode ``i`` gets ``A_{i,k}`` (observation,
prompt and padding tokens 0). A step group is keyed by (group id, anchor id): turns of
different tasks never share one, whatever their anchors. As for ``grpo``, a group with fewer
than two members (an episode group of one, an anchor state that occurs once) contributes 0:
such turns get ``A^E_i`` only. Zero-variance groups give 0. Fully masked rows (padding) take
no part in any statistic and get 0.

``returns`` holds the discounted turn return ``G_{i,k}`` on the tokens of turn ``k`` (for
metrics; GiGPO has no value targets).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .advantages import (TURN_INPUTS, AdvantageInputs, AdvantageOutput, AdvantageSettings,
                         register_advantage_estimator)
from .masked import as_mask, dense_group_index, group_stats, outcome_scores
from .scan import reverse_linear_recurrence

Array = jax.Array

__all__ = ["gigpo", "anchor_group_ids", "turn_returns"]


def anchor_group_ids(group_ids: Array, anchors: Array, valid: Array) -> Array:
    """Dense step-group ids ``[B, K]`` in ``[0, B*K)``: equal iff (group id, anchor) are equal.

    Exact for any integer ids (a lexicographic sort, no hashing); entries with ``valid`` False
    are sorted behind every valid one and never share a segment with a valid entry.
    """
    B, K = anchors.shape
    g = jnp.broadcast_to(dense_group_index(group_ids)[:, None], (B, K)).reshape(-1)
    a = jnp.asarray(anchors, jnp.int32).reshape(-1)
    inv = (~jnp.asarray(valid, bool)).reshape(-1).astype(jnp.int32)
    order = jnp.lexsort((a, g, inv))  # the last key is the primary one
    gs, as_, vs = g[order], a[order], inv[order]
    new = jnp.concatenate([jnp.ones((1,), bool),
                           (gs[1:] != gs[:-1]) | (as_[1:] != as_[:-1]) | (vs[1:] != vs[:-1])])
    seg_sorted = jnp.cumsum(new.astype(jnp.int32)) - 1
    return jnp.zeros((B * K,), jnp.int32).at[order].set(seg_sorted).reshape(B, K)


def turn_returns(turn_rewards: Array, gamma: float) -> Array:
    """``G [B, K]`` with ``G_k = r_k + gamma * G_{k+1}`` (``G_K = 0``)."""
    r = jnp.asarray(turn_rewards, jnp.float32)
    return reverse_linear_recurrence(jnp.full_like(r, gamma), r, method="scan")


def _segment_stats(x: Array, seg: Array, w: Array, n_seg: int) -> tuple[Array, Array, Array]:
    """Per-entry (mean, unbiased std, count) of the weighted segments of flat ``x``."""
    n = jax.ops.segment_sum(w, seg, num_segments=n_seg)
    mean = (jax.ops.segment_sum(w * x, seg, num_segments=n_seg) / jnp.maximum(n, 1.0))[seg]
    d2 = jax.ops.segment_sum(w * jnp.square(x - mean), seg, num_segments=n_seg)
    var = jnp.where(n > 1, d2 / jnp.maximum(n - 1.0, 1.0), 0.0)
    return mean, jnp.sqrt(var)[seg], n[seg]


@register_advantage_estimator("gigpo", inputs=("group_ids", "token_rewards") + TURN_INPUTS,
                              options=("omega", "norm_std"))
def gigpo(x: AdvantageInputs, settings: AdvantageSettings, *, omega: float = 1.0,
          norm_std: bool = True) -> AdvantageOutput:
    """GiGPO advantages (see the module docstring): ``A = A^E + omega * A^S`` on the
    generated tokens of each turn. ``gamma`` discounts per turn; ``norm_std`` divides both
    levels by their group's std (``False``: mean-centred only, ``F = 1``)."""
    if x.group_ids is None:
        raise ValueError("the 'gigpo' estimator needs group_ids [B]")
    if x.turn_ids is None or x.turn_anchors is None:
        raise ValueError("the 'gigpo' estimator needs turn_ids [B, T] and turn_anchors [B, K] "
                         "(training.rl.batching.assemble_batch builds them from trajectories)")
    rewards, loss_mask, group_ids, token_rewards = x.rewards, x.loss_mask, x.group_ids, x.token_rewards
    turn_ids, turn_rewards, turn_anchors = x.turn_ids, x.turn_rewards, x.turn_anchors
    gamma, eps = settings.gamma, settings.eps
    m = as_mask(loss_mask)
    B, T = m.shape
    anchors = jnp.asarray(turn_anchors, jnp.int32)
    K = anchors.shape[1]
    valid = jnp.any(m > 0, axis=-1)

    # --- episode level (GRPO on the outcome score)
    R = outcome_scores(rewards, m, token_rewards)
    st = group_stats(R, group_ids, valid)
    ep_num = R - st.mean
    ep = ep_num / (st.std + eps) if norm_std else ep_num
    ep = jnp.where(valid & (st.count >= 2), ep, 0.0)

    # --- turn rewards and discounted returns
    has_turn = (anchors >= 0) & valid[:, None]  # [B, K]
    tid = jnp.asarray(turn_ids, jnp.int32)
    in_range = (tid >= 0) & (tid < K)
    flat = jnp.arange(B, dtype=jnp.int32)[:, None] * K + jnp.clip(tid, 0, K - 1)  # [B, T]
    if turn_rewards is None:  # the outcome on the last turn
        last = jnp.max(jnp.where(has_turn, jnp.arange(K)[None, :], -1), axis=1)
        r = jnp.where(jnp.arange(K)[None, :] == last[:, None], R[:, None], 0.0)
    else:
        r = jnp.asarray(turn_rewards, jnp.float32)
        if token_rewards is not None:
            extra = jnp.where(in_range, m * jnp.asarray(token_rewards, jnp.float32), 0.0)
            r = r + jax.ops.segment_sum(extra.reshape(-1), flat.reshape(-1),
                                        num_segments=B * K).reshape(B, K)
    r = jnp.where(has_turn, r, 0.0)
    G = turn_returns(r, gamma)

    # --- step level (anchor-state groups within each episode group)
    seg = anchor_group_ids(group_ids, anchors, has_turn).reshape(-1)
    w = has_turn.reshape(-1).astype(jnp.float32)
    mean, std, count = _segment_stats(G.reshape(-1), seg, w, B * K)
    st_num = G.reshape(-1) - mean
    step = st_num / (std + eps) if norm_std else st_num
    step = jnp.where((w > 0) & (count >= 2), step, 0.0).reshape(B, K)

    # --- per token: each turn's generated tokens carry that turn's advantage
    a_turn = ep[:, None] + omega * step  # [B, K]
    per_tok = jnp.take_along_axis(a_turn, jnp.clip(tid, 0, K - 1), axis=1)
    adv = jnp.where(in_range, per_tok, ep[:, None]) * m
    ret = jnp.where(in_range, jnp.take_along_axis(G, jnp.clip(tid, 0, K - 1), axis=1), 0.0) * m
    return AdvantageOutput(adv, ret)
