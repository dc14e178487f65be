"""What a run keeps of its episodes: ``trajectories_<kind>[.process<i>].jsonl[.gz]``.

Evaluations keep every episode. Training keeps ``train.trajectory_share`` of each step's
groups, whole groups (every sample of a task, so that a group's advantages can be read back),
chosen by :func:`kept_groups`: the ``round(share x groups)`` groups (at least one when the share
is above 0) whose hash of ``(step, group id)`` is smallest. The choice depends on nothing the
policy did (not the rewards, not the lengths), so the kept episodes are an unbiased sample, and
it is the same every time the step is logged (a resumed run). Metrics and the summary count
every episode; only the file is thinned.

Files are written through ``agentrl_common.jsonl_files``: with ``train.compress_trajectories``
one gzip member per step (``.jsonl.gz``), flushed, so a killed run leaves every whole step
readable; the resume rewinds the files to the checkpoint (``training/outputs/runlog.py``) and appends.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Iterable, Sequence

from agentrl_common.jsonl_files import append_lines, trajectory_file_name
from agentrl_jax.agent.trajectory import Trajectory


def _rank(step: int, group_id: int) -> bytes:
    return hashlib.blake2b(f"{int(step)}:{int(group_id)}".encode(), digest_size=8).digest()


def kept_groups(step: int, group_ids: Iterable[int], share: float) -> set[int]:
    """The group ids of step ``step`` that the log keeps: all for ``share >= 1``, none for
    ``share <= 0``, else the ``max(1, round(share * n))`` of the ``n`` distinct ids with the
    smallest ``blake2b(f"{step}:{id}")``."""
    groups = sorted(set(int(g) for g in group_ids))
    if share >= 1:
        return set(groups)
    if share <= 0 or not groups:
        return set()
    count = max(1, round(share * len(groups)))
    return set(sorted(groups, key=lambda g: _rank(step, g))[:count])


def kept_trajectories(step: int, trajectories: Sequence[Trajectory], share: float
                      ) -> list[Trajectory]:
    """The episodes of :func:`kept_groups`, in their order."""
    keep = kept_groups(step, (t.group_id for t in trajectories), share)
    return [t for t in trajectories if t.group_id in keep]


class TrajectoryLog:
    """The trajectory files of one process of a run in ``workdir``.

    ``suffix``: ``""`` or ``".process<i>"``; ``train_share``: the share of training groups
    kept; ``compress``: gzip members (``.jsonl.gz``) instead of plain lines."""

    def __init__(self, workdir: str, suffix: str = "", train_share: float = 1.0,
                 compress: bool = True):
        self.workdir, self.suffix = workdir, suffix
        self.train_share, self.compress = float(train_share), bool(compress)

    def path(self, kind: str) -> str:
        """The file of ``kind`` (``train`` / ``eval``)."""
        return os.path.join(self.workdir, trajectory_file_name(kind, self.suffix, self.compress))

    def write(self, step: int, trajectories: Sequence[Trajectory], kind: str) -> int:
        """Append the kept episodes of ``step`` (every one for ``eval``) as one member; returns
        how many were written. ``OSError`` names the file."""
        if kind == "train":
            trajectories = kept_trajectories(step, trajectories, self.train_share)
        path = self.path(kind)
        append_lines(path, [json.dumps(t.to_json(step)).encode() for t in trajectories])
        return len(trajectories)
