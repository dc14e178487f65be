"""Trajectories -> the learner's batch (the contract of ``agentrl_jax.learner``).

Rows are right-padded to the longest trajectory (the learner pads further to its length
buckets). Per row: ``tokens [B,T]`` int32, ``loss_mask [B,T]`` (1 on generated ids),
``attention_mask [B,T]`` (1 on real ids), ``rollout_logprobs [B,T]`` (the engine's logprob of
each generated id, aligned with ``tokens``), ``group_id [B]``, ``reward [B]``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from agentrl_jax.agent.trajectory import Trajectory


def assemble_batch(trajectories: Sequence[Trajectory], pad_id: int = 0,
                   max_length: int | None = None) -> dict[str, np.ndarray]:
    """Stack trajectories into padded arrays. Raises on an empty list or on error trajectories
    (they must be dropped before training)."""
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
    return {
        "tokens": tokens,
        "loss_mask": loss_mask,
        "attention_mask": attention_mask,
        "rollout_logprobs": logprobs,
        "group_id": np.asarray([t.group_id for t in trajectories], np.int32),
        "reward": np.asarray([t.reward for t in trajectories], np.float32),
    }


def informative_groups(trajectories: Sequence[Trajectory], min_spread: float = 1e-6
                       ) -> tuple[list[Trajectory], int]:
    """Drop the groups whose rewards are all equal (spread <= ``min_spread``).

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
    return [t for t in trajectories if t.group_id not in flat], len(flat)
