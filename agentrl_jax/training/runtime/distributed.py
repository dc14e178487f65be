"""What the trainer needs to run as one of several JAX processes (one per host).

A multi-process run behaves like one big run: every process draws the same global task list
(the sampler is seeded and its cursor is checkpointed), takes a contiguous block of its *groups*
(``share``; all samples of a task stay on one process), runs them on its own actor pool,
environment servers and rollout engine, and renumbers its groups with their global index
(globally unique group ids for a process-local ``Learner.update``). Numbers that
summarise a rollout or an evaluation are computed from every process's per-episode records
(``allgather_objects``), with the same formulas as one process uses, so process 0 logs the
global values. With one process every function here is the identity or a no-op.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import numpy as np

from agentrl_jax.agent.actor_pool import RolloutStats, summarize
from agentrl_jax.agent.trajectory import Trajectory
from agentrl_jax.learner.batch import RolloutBatch
from agentrl_jax.sharding.placement import agree_max, allgather_objects, local_replica


def process_index() -> int:
    return jax.process_index()


def process_count() -> int:
    return jax.process_count()


def share(n: int, index: int | None = None, count: int | None = None) -> tuple[int, int]:
    """``[lo, hi)``: process ``index``'s contiguous block of ``n`` items (block sizes differ
    by at most one; a process may get none when ``n < count``)."""
    index = process_index() if index is None else index
    count = process_count() if count is None else count
    return index * n // count, (index + 1) * n // count


def sampling_seed(seed: int) -> int:
    """Per-process base seed for the actor pool (``seed`` itself with one process): episodes of
    different processes with the same local group index get different sampling seeds."""
    return int(seed) * process_count() + process_index()


def agree_any(flag: bool) -> bool:
    """True on every process if ``flag`` is true on any (e.g. a per-process time budget)."""
    return bool(agree_max(int(bool(flag))))


def _record(t: Trajectory) -> list:
    return [t.env, t.task_id, t.group_id, t.sample_index, t.status, float(t.reward),
            float(t.shaping), bool(t.success), int(t.num_turns), int(t.num_generated)]


def global_records(trajectories: Sequence[Trajectory]) -> list[Trajectory]:
    """Light copies (no tokens) of every process's trajectories, in process order: the fields
    that rollout statistics and Avg@k / Pass@k use. A collective with several processes."""
    out = []
    for records in allgather_objects([_record(t) for t in trajectories]):
        for (env, task, group, sample, status, reward, shaping, success, turns,
             generated) in records:
            t = Trajectory(env=env, task_id=task, group_id=group, sample_index=sample,
                           status=status, reward=reward, shaping=shaping, success=success,
                           num_turns=turns)
            t.loss_mask = [1] * generated  # num_generated
            out.append(t)
    return out


def global_rollout_stats(trajectories: Sequence[Trajectory], local: RolloutStats
                         ) -> RolloutStats:
    """``summarize`` over every process's trajectories (``local`` itself with one process);
    ``wall_s`` is the slowest process's."""
    if process_count() == 1:
        return local
    walls = allgather_objects(float(local.wall_s))
    return summarize(global_records(trajectories), float(np.max(walls)))


def empty_batch(advantages: bool = False) -> RolloutBatch:
    """A zero-row batch for a process-local ``Learner.update`` on a process whose share
    produced no trainable trajectory (the others still need it in the collectives);
    ``advantages``: with an (empty) ``advantages`` array, as the other processes' batches
    have under a history window."""
    batch = RolloutBatch.empty()
    if advantages:
        batch = dataclasses.replace(batch, advantages=np.zeros(batch.tokens.shape, np.float32))
    return batch


def local_policy(learner: Any) -> Any:
    """The learner's current policy (a ``CausalLM``) with every parameter's full value on this
    process's first local device (a collective), for this host's embedded engine or export."""
    from flax import nnx
    return nnx.merge(learner.graphdef, local_replica(learner.params))


def barrier(name: str) -> None:
    if process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(name)


__all__ = ["share", "sampling_seed", "agree_any", "global_records", "global_rollout_stats",
           "empty_batch", "local_policy", "local_replica", "allgather_objects", "barrier",
           "process_index", "process_count"]
