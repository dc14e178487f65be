"""Sequence packing: many variable-length trajectories in a few fixed-length rows.

A rollout batch holds ``B`` right-padded rows of very different lengths (a BabyAI batch
averages ~1,000 tokens with a few near 4,096). Padding every row to one power-of-two bucket
wastes most of the compute and compiles a new program whenever the bucket changes. Packing
places the trajectories end to end in rows of one fixed length ``P`` (first-fit decreasing), so
the learner always runs ``[rows, P]`` arrays: one compiled shape per run, little padding.

Inside a packed row, trajectory ``j`` occupies ``[offset_j, offset_j + L_j)``; its tokens carry
``segment_ids = j + 1`` (0 = padding) and ``positions = 0 .. L_j - 1``, so attention (segment
mask + causal) and RoPE see exactly what they would see in an unpacked row. Per-token arrays
keep the learner's alignment convention (``x[t]`` belongs to token ``t``): the log-prob of a
segment's first token would be predicted across the segment boundary, but that token is a
prompt token (loss mask 0) and the learner never uses it.

All functions are host-side NumPy. ``pack_index`` / ``unpack_index`` give the gather indices
that pack and unpack arrays already on the device (``layouts.PackedRows``).
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class PackPlan:
    """Where each source row goes: ``row[i]``, ``offset[i]``, ``length[i]`` (all ``[B]``),
    into ``num_rows`` packed rows of ``pack_length`` tokens."""

    row: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    num_rows: int
    pack_length: int

    @property
    def used_rows(self) -> int:
        """Packed rows holding at least one token (``num_rows`` less the empty rows added to
        reach a multiple of ``row_multiple``)."""
        filled = self.row[self.length > 0]
        return int(np.unique(filled).size)

    @property
    def efficiency(self) -> float:
        """Real tokens / packed slots (1.0 = no padding)."""
        return float(self.length.sum()) / max(self.num_rows * self.pack_length, 1)


def plan_packing(lengths: np.ndarray, pack_length: int, row_multiple: int = 1,
                 scored: np.ndarray | None = None, scored_budget: int | None = None) -> PackPlan:
    """First-fit-decreasing bin packing of ``lengths [B]`` into rows of ``pack_length``.

    ``row_multiple``: the number of rows is rounded up to a multiple of it (empty rows).
    ``scored [B]`` and ``scored_budget``: a second room per row, the scored tokens
    (``scored.row_counts``): a sequence joins a row only where both its tokens and its scored
    tokens fit, so no packed row holds more than ``max(scored_budget, max(scored))`` scored
    tokens (a sequence over the budget gets a row of its own). The scored LM head's capacity
    is then known before the batch is (``learner/ahead.py``). Raises ``ValueError`` for a
    sequence longer than ``pack_length``.
    """
    lengths = np.asarray(lengths, np.int64)
    if lengths.size and lengths.max() > pack_length:
        raise ValueError(f"a trajectory of {int(lengths.max())} tokens does not fit the pack "
                         f"length {pack_length}; raise learner.pack_length (>= the rollout's "
                         "max_context)")
    budgeted = scored is not None and scored_budget is not None
    counts = (np.asarray(scored, np.int64) if budgeted else np.zeros_like(lengths))
    if counts.shape != lengths.shape:
        raise ValueError(f"scored counts {counts.shape} do not match lengths {lengths.shape}")
    budget = int(scored_budget) if budgeted else 0
    order = np.argsort(-lengths, kind="stable")
    free: list[int] = []  # remaining room per packed row
    free_scored: list[int] = []  # remaining scored-token room per packed row (budgeted)
    row = np.zeros(lengths.shape, np.int64)
    offset = np.zeros(lengths.shape, np.int64)
    for i in order:
        n, s = int(lengths[i]), int(counts[i])
        for r, room in enumerate(free):
            if room >= n and (not budgeted or free_scored[r] >= s):
                break
        else:
            r = len(free)
            free.append(pack_length)
            free_scored.append(budget)
        row[i], offset[i] = r, pack_length - free[r]
        free[r] -= n
        free_scored[r] -= s
    num_rows = max(len(free), 1)
    num_rows = -(-num_rows // row_multiple) * row_multiple
    return PackPlan(row=row, offset=offset, length=lengths, num_rows=num_rows,
                    pack_length=pack_length)


def pack(plan: PackPlan, x: np.ndarray, fill: float = 0) -> np.ndarray:
    """``x [B, T, ...]`` (right-padded rows) -> ``[num_rows, pack_length, ...]``."""
    x = np.asarray(x)
    out = np.full((plan.num_rows, plan.pack_length, *x.shape[2:]), fill, x.dtype)
    for i, (r, o, n) in enumerate(zip(plan.row, plan.offset, plan.length)):
        out[r, o:o + n] = x[i, :n]
    return out


def unpack(plan: PackPlan, y: np.ndarray, width: int, fill: float = 0) -> np.ndarray:
    """The inverse of :func:`pack`: ``[num_rows, pack_length, ...]`` -> ``[B, width, ...]``."""
    y = np.asarray(y)
    out = np.full((plan.row.size, width, *y.shape[2:]), fill, y.dtype)
    for i, (r, o, n) in enumerate(zip(plan.row, plan.offset, plan.length)):
        out[i, :n] = y[r, o:o + n]
    return out


def segment_layout(plan: PackPlan) -> tuple[np.ndarray, np.ndarray]:
    """``(segment_ids, positions)``, both ``[num_rows, pack_length]`` int32: segment ``i + 1``
    for source row ``i`` (0 on padding), positions restarting at 0 in every segment."""
    seg = np.zeros((plan.num_rows, plan.pack_length), np.int32)
    pos = np.zeros((plan.num_rows, plan.pack_length), np.int32)
    for i, (r, o, n) in enumerate(zip(plan.row, plan.offset, plan.length)):
        seg[r, o:o + n] = i + 1
        pos[r, o:o + n] = np.arange(n)
    return seg, pos


def pack_index(plan: PackPlan, rows: np.ndarray, width: int) -> np.ndarray:
    """``[num_rows, pack_length]`` int32 indices into a flattened ``[B_all, width]`` array
    (``b * width + t``; -1 on padding) such that gathering them packs source rows ``rows``
    (``plan`` was made for ``lengths[rows]``): ``pack(plan, x[rows]) ==
    where(idx >= 0, x.reshape(-1)[idx], 0)``."""
    idx = np.full((plan.num_rows, plan.pack_length), -1, np.int64)
    for i, (r, o, n) in enumerate(zip(plan.row, plan.offset, plan.length)):
        idx[r, o:o + n] = int(rows[i]) * width + np.arange(n)
    return idx.astype(np.int32)


def unpack_index(plan: PackPlan, width: int) -> np.ndarray:
    """``[B, width]`` int32 indices into the flattened ``[num_rows, pack_length]`` packed
    array (-1 past each row's length): gathering them is :func:`unpack`."""
    idx = np.full((plan.row.size, width), -1, np.int64)
    for i, (r, o, n) in enumerate(zip(plan.row, plan.offset, plan.length)):
        idx[i, :n] = int(r) * plan.pack_length + o + np.arange(n)
    return idx.astype(np.int32)


__all__ = ["PackPlan", "plan_packing", "pack", "unpack", "segment_layout", "pack_index",
           "unpack_index"]
