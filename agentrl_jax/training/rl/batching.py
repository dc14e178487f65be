"""Trajectories -> the learner's ``RolloutBatch`` (``agentrl_jax.learner.batch``).

Rows are right-padded to the longest trajectory (the learner pads further to its length
buckets). Per row: ``tokens [B,T]`` int32, ``loss_mask [B,T]`` (1 on generated ids),
``attention_mask [B,T]`` (1 on real ids), ``rollout_logprobs [B,T]`` (the engine's logprob of
each generated id, aligned with ``tokens``), ``group_id [B]``, ``reward [B]``, and the per-turn
arrays of the turn-level estimators (GiGPO): ``turn_ids [B,T]`` int32 (the turn of every id:
-1 on the prompt and padding, ``k`` on turn ``k``'s generated ids and the observation after
them), ``turn_rewards [B,K]`` and ``turn_anchors [B,K]`` int32 (``K``: the most turns of any
row, rounded up to a multiple of ``TURN_SLOTS``; -1 where a row has no such turn), and
``option_counts [B,T]`` int32 when any id was sampled under a per-turn option limit
(``Trajectory.option_counts``, ``agent.option_limits``; 0: none).

Rows and chunks: a trajectory is one row, except under a history window
(``agent.history_turns``), where its chunks (``Trajectory.chunk_bounds``: each one token
sequence exactly as the engine was given it and extended it) are one row each: every generated
id is then trained in the context it was sampled in, and occurs in exactly one row (a later
chunk repeats earlier turns only as context, loss mask 0). The rows of an episode share its
group id and reward, so a group estimator run over rows would count an episode once per chunk;
instead the episode's advantage is computed here, once per episode (``episode_advantages``:
the learner's estimator on one row per episode), and broadcast on every generated id of its
rows (``RolloutBatch.advantages``; the learner then skips its own estimator). That is exact for
the estimators whose advantage is one number per episode (``AdvantageEstimator.episode_scalar``:
GRPO, Dr.GRPO, RLOO), with the ``token_mean`` loss; the config refuses the others
(``config.sections._history_window_problems``).

Anchor ids: the turns of one group (one task's episodes) that acted from the same environment
state (equal ``Trajectory.turn_states`` digests) get the same id, turns from different states
different ids. Ids are ranks among the group's sorted distinct digests, so they depend only on
which trajectories the group holds, never on the order the actor pool finished them in; the
step groups of the estimator are keyed by (group id, anchor id), so ids may repeat across
groups. A group's step groups are only formed here, once its whole rollout is in the batch.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from agentrl_jax.agent.trajectory import Trajectory
from agentrl_jax.learner.batch import RolloutBatch

#: a training row: (index of its trajectory, start, end) in the trajectory's ``token_ids``
Row = tuple[int, int, int]

#: the turn axis ``K`` is a multiple of this (fewer distinct shapes for the jitted estimator)
TURN_SLOTS = 8


def training_rows(trajectories: Sequence[Trajectory]) -> list[Row]:
    """One row per chunk of each trajectory (one per trajectory without a history window), in
    trajectory order."""
    return [(i, a, b) for i, t in enumerate(trajectories) for a, b in t.chunk_bounds()]


def episode_advantages(trajectories: Sequence[Trajectory], estimator: str,
                       settings: Mapping[str, Any] | None = None) -> np.ndarray:
    """``[E]`` each episode's advantage: estimator ``estimator`` (an ``episode_scalar`` one:
    ``A_e = f(R_e, the group's R)``) over one row per episode, ``rewards [E]``, ``group_ids
    [E]`` and ``loss_mask [E, 1]`` = 1 where the episode generated any id (an episode without
    generated ids is left out of its group's statistics, as the learner's estimator leaves a
    fully masked row). ``settings``: the learner's ``gamma``, ``lam`` and
    ``advantage_kwargs``."""
    from agentrl_jax.algorithms import compute_advantages, get_advantage_estimator

    if not get_advantage_estimator(estimator).episode_scalar:
        raise ValueError(f"advantage estimator {estimator!r} does not give one advantage per "
                         "episode; a windowed episode (several rows) cannot be trained with it")
    if not trajectories:
        return np.zeros((0,), np.float32)
    out = compute_advantages(
        estimator, rewards=np.asarray([t.reward for t in trajectories], np.float32),
        loss_mask=np.asarray([[1.0 if t.num_generated else 0.0] for t in trajectories],
                             np.float32),
        group_ids=np.asarray([t.group_id for t in trajectories], np.int32),
        **dict(settings or {}))
    return np.asarray(out.advantages, np.float32)[:, 0]


def turn_arrays(trajectories: Sequence[Trajectory], length: int,
                rows: Sequence[Row] | None = None) -> dict[str, np.ndarray]:
    """``turn_ids [B, length]``, ``turn_rewards [B, K]``, ``turn_anchors [B, K]`` (see the
    module docstring); ``rows``: the batch's rows (default: one per trajectory, whole)."""
    if rows is None:
        rows = [(i, 0, len(t.token_ids)) for i, t in enumerate(trajectories)]
    b = len(rows)
    most = max((t.num_turns for t in trajectories), default=0)
    k = max(TURN_SLOTS, -(-most // TURN_SLOTS) * TURN_SLOTS)
    turn_ids = np.full((b, length), -1, np.int32)
    rewards = np.zeros((b, k), np.float32)
    anchors = np.full((b, k), -1, np.int32)
    digests: dict[int, list[str]] = {}
    for t in trajectories:
        digests.setdefault(t.group_id, []).extend(t.turn_states[:t.num_turns])
    rank = {g: {d: i for i, d in enumerate(sorted(set(ds)))} for g, ds in digests.items()}
    for row, (i, start, end) in enumerate(rows):
        t = trajectories[i]
        if len(t.turn_ids) == len(t.token_ids):
            turn_ids[row, :end - start] = t.turn_ids[start:end]
        r = t.turn_rewards[:k]
        rewards[row, :len(r)] = r
        states = t.turn_states[:t.num_turns]
        anchors[row, :len(states)] = [rank[t.group_id][d] for d in states]
    return {"turn_ids": turn_ids, "turn_rewards": rewards, "turn_anchors": anchors}


def assemble_batch(trajectories: Sequence[Trajectory], *, pad_id: int,
                   max_length: int | None = None, episode_estimator: str | None = None,
                   advantage_settings: Mapping[str, Any] | None = None) -> RolloutBatch:
    """Stack trajectories into a right-padded ``RolloutBatch``, one row per chunk
    (``training_rows``). Raises on an empty list or on error trajectories (they must be
    dropped before training).

    ``episode_estimator`` (runs with a history window): the batch carries ``advantages``:
    ``episode_advantages(trajectories, episode_estimator, advantage_settings)[e] * loss_mask``
    on every row of episode ``e``. Without it, a trajectory of several chunks is refused (the
    learner's estimator would count its episode once per row). ``pad_id``: ``model.pad_id``
    (no default here: the model section holds it)."""
    if not trajectories:
        raise ValueError("no trajectories to train on")
    bad = [t.status for t in trajectories if not t.ok]
    if bad:
        raise ValueError(f"error trajectories must not be trained on (statuses {bad})")
    rows = training_rows(trajectories)
    if episode_estimator is None and len(rows) > len(trajectories):
        raise ValueError("a windowed trajectory (agent.history_turns) spans several rows; pass "
                         "episode_estimator so that its episode is scored once")
    length = max(end - start for _, start, end in rows)
    if max_length is not None and length > max_length:
        raise ValueError(f"a trajectory has {length} tokens > max_length {max_length}")
    b = len(rows)
    tokens = np.full((b, length), pad_id, np.int32)
    loss_mask = np.zeros((b, length), np.float32)
    attention_mask = np.zeros((b, length), np.int32)
    logprobs = np.zeros((b, length), np.float32)
    option_counts = np.zeros((b, length), np.int32)
    for row, (i, start, end) in enumerate(rows):
        t, n = trajectories[i], end - start
        tokens[row, :n] = t.token_ids[start:end]
        loss_mask[row, :n] = t.loss_mask[start:end]
        attention_mask[row, :n] = 1
        logprobs[row, :n] = t.logprobs[start:end]
        if len(t.option_counts) == len(t.token_ids):  # (absent in older trajectory logs)
            option_counts[row, :n] = t.option_counts[start:end]
    owner = np.asarray([i for i, _, _ in rows], np.int64)
    advantages = None
    if episode_estimator is not None:
        per_episode = episode_advantages(trajectories, episode_estimator, advantage_settings)
        advantages = per_episode[owner][:, None] * loss_mask
    return RolloutBatch(
        tokens=tokens, loss_mask=loss_mask, attention_mask=attention_mask,
        rollout_logprobs=logprobs,
        group_id=np.asarray([trajectories[i].group_id for i in owner], np.int32),
        reward=np.asarray([trajectories[i].reward for i in owner], np.float32),
        advantages=advantages, **turn_arrays(trajectories, length, rows),
        # per-turn option limits (agent.option_limits): the learner scores each generated id
        # under the limit it was sampled with; none sampled under one: no array
        option_counts=option_counts if option_counts.any() else None)


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
