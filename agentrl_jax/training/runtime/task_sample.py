"""Which tasks of a split an evaluation plays: a deterministic sample spread over the split's
task groups.

A split lists task ids in its catalog's order, and catalogs interleave their groups: BabyAI's
ids run level by level within each seed (``BabyAI-GoTo-v0/seed=1000000``, then the next level
at the same seed), MiniWoB's task by task within each seed. An evenly spaced sample of such a
list aliases: 100 of BabyAI's 4,800 test ids at stride 48 are 2 of its 96 levels, 128 are 64
levels. ``stratified_sample`` samples per group instead.

A task's group is its id up to the last ``/`` (``BabyAI-GoTo-v0``, ``boil``, ``click-button``);
an id without ``/`` (TextCraft's goals, deep search's questions) is a group of its own, so for
those families the sample is the evenly spaced one.
"""

from __future__ import annotations

from typing import Callable, Sequence

#: the sample kinds ``train.eval_sample`` names: ``stratified`` (``stratified_sample``) or
#: ``spaced`` (``spaced_sample``: the evenly spaced ids, what evaluations read before 2026-12-02)
SAMPLES = ("stratified", "spaced")


def task_group(task_id: str) -> str:
    """``"BabyAI-GoTo-v0/seed=7"`` -> ``"BabyAI-GoTo-v0"``; an id without ``/`` is its own group."""
    return task_id.rpartition("/")[0] or task_id


def spaced_sample(ids: Sequence[str], limit: int) -> list[str]:
    """``limit`` ids at evenly spaced positions ``floor(i * n / limit)``, ``i < limit`` (all of
    them, in order, when ``limit >= n``)."""
    n = len(ids)
    if limit >= n:
        return list(ids)
    return [ids[(i * n) // limit] for i in range(limit)]


def group_quotas(sizes: Sequence[int], limit: int) -> list[int]:
    """How many ids each of ``G`` groups of ``sizes`` gives to a sample of ``limit`` (< total):
    equal shares, a group smaller than its share giving all it has and the rest shared among
    the others (water-filling); the last ``r < active groups`` ids go one each to evenly spaced
    groups among those with ids left. ``limit < G``: one id each from ``limit`` evenly spaced
    groups."""
    g = len(sizes)
    quotas = [0] * g
    remaining = limit
    while remaining > 0:
        active = [i for i in range(g) if quotas[i] < sizes[i]]
        share = remaining // len(active)
        if share == 0:  # fewer ids left than groups with room: spread them
            for j in range(remaining):
                quotas[active[(j * len(active)) // remaining]] += 1
            break
        for i in active:
            add = min(share, sizes[i] - quotas[i])
            quotas[i] += add
            remaining -= add
    return quotas


def stratified_sample(ids: Sequence[str], limit: int,
                      group: Callable[[str], str] = task_group) -> list[str]:
    """``limit`` of ``ids`` spread over their groups (``group``, in first-appearance order):
    each group's share from :func:`group_quotas`, taken at evenly spaced positions within the
    group (:func:`spaced_sample`); returned in the split's order. All ids, in order, when
    ``limit >= len(ids)``. Deterministic: the same ids every time."""
    if limit >= len(ids):
        return list(ids)
    members: dict[str, list[int]] = {}
    for position, task_id in enumerate(ids):
        members.setdefault(group(task_id), []).append(position)
    groups = list(members.values())
    quotas = group_quotas([len(m) for m in groups], limit)
    picked = [p for m, k in zip(groups, quotas) for p in spaced_sample(m, k)]
    return [ids[p] for p in sorted(picked)]


def sample_tasks(ids: Sequence[str], limit: int, kind: str = "stratified") -> list[str]:
    """``limit`` of ``ids`` by the sample ``kind`` (one of :data:`SAMPLES`)."""
    if kind == "stratified":
        return stratified_sample(ids, limit)
    if kind == "spaced":
        return spaced_sample(ids, limit)
    raise ValueError(f"unknown task sample {kind!r}; one of {SAMPLES}")
