"""Trajectories -> the learner's ``RolloutBatch`` (``agentrl_jax.learner.batch``).

Rows are right-padded to the longest trajectory (the learner pads further to its length
buckets). Per row: ``tokens [B,T]`` int32, ``loss_mask [B,T]`` (1 on generated ids),
``attention_mask [B,T]`` (1 on real ids), ``rollout_logprobs [B,T]`` (the engine's logprob of
each generated id, aligned with ``tokens``), ``group_id [B]``, ``reward [B]``, and the per-turn
arrays of the turn-level estimators (GiGPO): ``turn_ids [B,T]`` int32 (the turn of every id:
-1 on the prompt and padding, ``k`` on turn ``k``'s generated ids and the observation after
them), ``turn_rewards [B,K]`` and ``turn_anchors [B,K]`` int32 (``K``: the most turns of any
row, rounded up to a multiple of ``TURN_SLOTS``; -1 where a row has no such turn).

Anchor ids: the turns of one group (one task's episodes) that acted from the same environment
state (equal ``Trajectory.turn_states`` digests) get the same id, turns from different states
different ids. Ids are ranks among the group's sorted distinct digests, so they depend only on
which trajectories the group holds, never on the order the actor pool finished them in; the
step groups of the estimator are keyed by (group id, anchor id), so ids may repeat across
groups. A group's step groups are only formed here, once its whole rollout is in the batch.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from agentrl_jax.agent.trajectory import Trajectory
from agentrl_jax.learner.batch import RolloutBatch

#: the turn axis ``K`` is a multiple of this (fewer distinct shapes for the jitted estimator)
TURN_SLOTS = 8


def turn_arrays(trajectories: Sequence[Trajectory], length: int
                ) -> dict[str, np.ndarray]:
    """``turn_ids [B, length]``, ``turn_rewards [B, K]``, ``turn_anchors [B, K]`` (see the
    module docstring)."""
    b = len(trajectories)
    most = max((t.num_turns for t in trajectories), default=0)
    k = max(TURN_SLOTS, -(-most // TURN_SLOTS) * TURN_SLOTS)
    turn_ids = np.full((b, length), -1, np.int32)
    rewards = np.zeros((b, k), np.float32)
    anchors = np.full((b, k), -1, np.int32)
    digests: dict[int, list[str]] = {}
    for t in trajectories:
        digests.setdefault(t.group_id, []).extend(t.turn_states[:t.num_turns])
    rank = {g: {d: i for i, d in enumerate(sorted(set(ds)))} for g, ds in digests.items()}
    for i, t in enumerate(trajectories):
        n = len(t.token_ids)
        if len(t.turn_ids) == n:
            turn_ids[i, :n] = t.turn_ids
        r = t.turn_rewards[:k]
        rewards[i, :len(r)] = r
        states = t.turn_states[:t.num_turns]
        anchors[i, :len(states)] = [rank[t.group_id][d] for d in states]
    return {"turn_ids": turn_ids, "turn_rewards": rewards, "turn_anchors": anchors}


def assemble_batch(trajectories: Sequence[Trajectory], pad_id: int = 0,
                   max_length: int | None = None) -> RolloutBatch:
    """Stack trajectories into a right-padded ``RolloutBatch``. Raises on an empty list or on
    error trajectories (they must be dropped before training)."""
    if not trajectories:
        raise ValueError("no trajectories to train on")
    bad = [t.status for t in trajectories if not t.ok]
    if bad:
        raise ValueError(f"error trajectories must not be trained on (statuses {bad})")
    length = max(len(t.token_ids) for t in trajectories)
    if max_length is not None and length > max_length:
        raise ValueError(f"a trajectory has {length} tokens > max_length {max_length}")
    b = len(trajectories)
    tokens = np.full((b, length), pad_id, np.int32)
    loss_mask = np.zeros((b, length), np.float32)
    attention_mask = np.zeros((b, length), np.int32)
    logprobs = np.zeros((b, length), np.float32)
    for i, t in enumerate(trajectories):
        n = len(t.token_ids)
        tokens[i, :n] = t.token_ids
        loss_mask[i, :n] = t.loss_mask
        attention_mask[i, :n] = 1
        logprobs[i, :n] = t.logprobs
    return RolloutBatch(
        tokens=tokens, loss_mask=loss_mask, attention_mask=attention_mask,
        rollout_logprobs=logprobs,
        group_id=np.asarray([t.group_id for t in trajectories], np.int32),
        reward=np.asarray([t.reward for t in trajectories], np.float32),
        **turn_arrays(trajectories, length))


def informative_groups(trajectories: Sequence[Trajectory], min_spread: float = 1e-6,
                       turn_level: bool = False) -> tuple[list[Trajectory], int]:
    """Drop the groups whose rewards are all equal (spread <= ``min_spread``).

    ``turn_level`` (GiGPO): a group with equal episode rewards may still hold step-level
    signal (equal outcomes reached after different numbers of turns have different
    discounted turn returns), so only groups whose every turn reward is 0 count as flat.

    With group-relative advantages (GRPO, RLOO, Dr.GRPO) such a group has advantage 0 on every
    token: it adds nothing to the policy gradient, yet with ``token_mean`` its tokens dilute
    every other token's weight and cost a full forward + backward. In sparse-reward agent tasks
    most early groups are all-failure, so dropping them both sharpens and speeds up the update
    (DAPO's dynamic sampling, without re-sampling). Returns ``(kept, dropped_group_count)``;
    kept trajectories stay in their input order.
    """
    rewards: dict[int, list[float]] = {}
    for t in trajectories:
        rewards.setdefault(t.group_id, []).append(float(t.reward))
    flat = {g for g, r in rewards.items() if max(r) - min(r) <= min_spread}
    if turn_level:
        flat -= {t.group_id for t in trajectories if any(abs(x) > min_spread
                                                         for x in t.turn_rewards)}
    return [t for t in trajectories if t.group_id not in flat], len(flat)
