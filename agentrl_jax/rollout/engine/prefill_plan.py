"""Which prompt tokens one prefill call takes: the rows of a ``[rows, chunk]`` call, as pieces.

A piece is ``(seq, start, n)``: ``n`` prompt tokens of ``seq`` from position ``start`` in one
row of the call (the row's other positions are padding). Two planners over the prefill queue
(sequences with ``cursor``, the next position to prefill, and ``prompt_len``; a sequence
prefills positions ``cursor .. prompt_len - 2``, the last prompt token is fed by its first
decode step):

* :func:`plan_chunked` -- one row per sequence: the chunk bucket whose ``rows x chunk`` call
  prefills the most tokens (each of the first ``rows`` queued sequences gives its next
  ``min(chunk, left)`` tokens). Each row is a copy of its slot's KV (gathered, attended, written
  back), so a sequence can have only one row in a call.
* :func:`plan_packed` -- rows of ``piece`` tokens, a sequence taking as many consecutive rows as
  it has tokens left (until the largest row bucket is full), then the smallest row bucket that
  holds them. For attention that reads each row where it is in the cache
  (``flash_in_cache``): every row's keys are written before any row attends, so a sequence's
  later rows see its earlier rows' keys. Padding is then at most ``piece - 1`` tokens a
  sequence plus the rows of the bucket left empty.

:func:`build_rows` turns the pieces into the call's ``[rows, chunk]`` token / position arrays,
held with the rows' slot ids in one int32 array (:class:`PrefillRows`): the call takes one host
array, and each host array a jitted call transfers lets a busy thread take the GIL once more:
one write per *run* (the consecutive pieces of one sequence that fill their rows end to end,
which are one contiguous span of the flattened arrays), not one per row. It runs on the engine
thread, which shares the GIL with the event loop: it avoids the NumPy calls that release the GIL
(``np.zeros`` / ``np.full`` / ``np.arange`` of a call's arrays, copies of more than
:data:`GIL_SAFE` elements), because each release lets a busy thread take the GIL for up to the
switch interval (5 ms) before the engine thread gets it back (benchmarks/contenders/scheduler_host.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Protocol, Sequence

import numpy as np


class Queued(Protocol):
    cursor: int
    prompt_len: int


Piece = tuple[Any, int, int]


def tokens_left(seq: Queued) -> int:
    """Prompt tokens ``seq`` still has to prefill."""
    return seq.prompt_len - 1 - seq.cursor


def plan_chunked(queue: Sequence[Queued], chunk_rows: Sequence[tuple[int, int]]
                 ) -> tuple[int, int, list[Piece]]:
    """``(chunk, rows, pieces)`` for the ``(chunk, rows)`` bucket that prefills the most tokens
    (the first such bucket on ties), one piece per sequence of ``queue[:rows]``."""
    best = None
    for chunk, rows in chunk_rows:
        work = sum(min(chunk, tokens_left(s)) for s in queue[:rows])
        if best is None or work > best[0]:
            best = (work, chunk, rows)
    _, chunk, rows = best
    return chunk, rows, [(s, s.cursor, min(chunk, tokens_left(s))) for s in queue[:rows]]


def plan_packed(queue: Sequence[Queued], piece: int, row_buckets: Sequence[int]
                ) -> tuple[int, int, list[Piece]]:
    """``(piece, rows, pieces)``: queued sequences in order, each cut into consecutive pieces
    of at most ``piece`` tokens, until ``max(row_buckets)`` rows are taken; ``rows`` is the
    smallest bucket that holds them."""
    max_rows = max(row_buckets)
    pieces: list[Piece] = []
    for seq in queue:
        start, left = seq.cursor, tokens_left(seq)
        while left > 0 and len(pieces) < max_rows:
            n = min(piece, left)
            pieces.append((seq, start, n))
            start, left = start + n, left - n
        if len(pieces) >= max_rows:
            break
    rows = min(b for b in row_buckets if b >= len(pieces))
    return piece, rows, pieces


#: the most elements one NumPy copy / fill on the engine thread touches: NumPy releases the GIL
#: around loops of more than 500 elements (``NPY_BEGIN_THREADS_THRESHOLDED``)
GIL_SAFE = 256

_templates: dict[tuple[int, int, int, int], np.ndarray] = {}
_positions = np.zeros((0,), np.int32)


def positions_upto(stop: int) -> np.ndarray:
    """``arange(stop)`` as int32 ``[>= stop]`` (a cached array: slice it, never write it)."""
    global _positions
    if len(_positions) < stop:
        _positions = np.arange(max(stop, 2 * len(_positions)), dtype=np.int32)
    return _positions


def copy_blocks(dst: np.ndarray, src: np.ndarray | int) -> None:
    """``dst[:len(src)] = src`` (1-D; an ``int`` src fills all of ``dst``) in blocks of at most
    :data:`GIL_SAFE` elements, so NumPy keeps the GIL."""
    n = len(dst) if isinstance(src, int) else len(src)
    if n <= GIL_SAFE:
        dst[:n] = src
        return
    for i in range(0, n, GIL_SAFE):
        dst[i:min(i + GIL_SAFE, n)] = src if isinstance(src, int) else src[i:i + GIL_SAFE]


@dataclasses.dataclass(frozen=True)
class PrefillRows:
    """A prefill call's host input, one int32 array ``packed`` ``[2 * rows * chunk + rows]``:
    the tokens ``[rows, chunk]``, then the positions ``[rows, chunk]``, then the rows' slot ids
    ``[rows]`` (:func:`split_rows`). The properties are views into ``packed``: writing them
    writes the call's input."""

    packed: np.ndarray
    chunk: int

    @property
    def rows(self) -> int:
        return len(self.packed) // (2 * self.chunk + 1)

    @property
    def tokens(self) -> np.ndarray:
        return split_rows(self.packed, self.chunk)[1]

    @property
    def positions(self) -> np.ndarray:
        return split_rows(self.packed, self.chunk)[2]

    @property
    def slot_ids(self) -> np.ndarray:
        return split_rows(self.packed, self.chunk)[0]


def split_rows(packed: Any, chunk: int) -> tuple[Any, Any, Any]:
    """``(slot_ids [R], tokens [R, chunk], positions [R, chunk])`` of a :class:`PrefillRows`
    array ``packed`` ``[R * (2 * chunk + 1)]``: views of a NumPy array, slices of a traced one
    (the compiled prefill unpacks its input with this)."""
    rows = packed.shape[0] // (2 * chunk + 1)
    n = rows * chunk
    return (packed[2 * n:], packed[:n].reshape(rows, chunk),
            packed[n:2 * n].reshape(rows, chunk))


def pack_rows(slot_ids: np.ndarray, tokens: np.ndarray, positions: np.ndarray) -> PrefillRows:
    """Separate ``slot_ids [R]``, ``tokens [R, T]`` and ``positions [R, T]`` as one
    :class:`PrefillRows` (a new array; the engine writes its rows in place instead)."""
    return PrefillRows(np.concatenate([np.asarray(tokens, np.int32).reshape(-1),
                                       np.asarray(positions, np.int32).reshape(-1),
                                       np.asarray(slot_ids, np.int32).reshape(-1)]),
                       int(np.shape(tokens)[1]))


def blank_rows(rows: int, chunk: int, pad_slot: int, pad_position: int) -> PrefillRows:
    """All padding: slot ``pad_slot``, token 0, position ``pad_position``; a copy of a cached
    template (a contiguous copy keeps the GIL; ``np.full`` does not)."""
    key = (rows, chunk, pad_slot, pad_position)
    if key not in _templates:
        n = rows * chunk
        packed = np.zeros((2 * n + rows,), np.int32)
        packed[n:2 * n], packed[2 * n:] = pad_position, pad_slot
        _templates[key] = packed
    return PrefillRows(_templates[key].copy(), chunk)


def runs(pieces: Sequence[Piece], chunk: int) -> list[tuple[Any, int, int, int, int]]:
    """The pieces as runs ``(seq, row, start, n, num_rows)``: piece ``i`` joins the run before it
    when it continues it (the same sequence, ``start`` where that run ends) and that run's rows
    are full (its ``n`` is ``num_rows * chunk``), so a run's ``n`` tokens are the flat positions
    ``row * chunk .. row * chunk + n - 1`` of the call's ``[rows, chunk]`` arrays."""
    out: list[tuple[Any, int, int, int, int]] = []
    cur, row0, start0, total, num = None, 0, 0, 0, 0
    for r, (seq, start, n) in enumerate(pieces):
        if seq is cur and start0 + total == start and total == num * chunk:
            total += n
            num += 1
            continue
        if num:
            out.append((cur, row0, start0, total, num))
        cur, row0, start0, total, num = seq, r, start, n, 1
    if num:
        out.append((cur, row0, start0, total, num))
    return out


Writer = Callable[[Any, int, int, np.ndarray, np.ndarray], bool]


def build_rows(pieces: Sequence[Piece], rows: int, chunk: int, pad_slot: int,
               pad_position: int, write: Writer, alive: Callable[[Any], bool],
               slot_of: Callable[[Any], int]) -> tuple[PrefillRows, list[int]]:
    """A prefill call's input for ``pieces`` (one per row, ``len(pieces) <= rows``):
    ``(PrefillRows: slot_ids [rows], tokens [rows, chunk], positions [rows, chunk], counts
    [len(pieces)])``; padding rows and positions hold slot ``pad_slot``, token 0, position
    ``pad_position``. ``write(seq, start, n, tokens, positions)`` writes a run's ``n`` tokens
    from ``start`` into the 1-D views ``tokens[:n]`` / ``positions[:n]`` and returns whether it
    succeeded; it is called once a run of a sequence that is ``alive`` (a sequence whose write
    fails is not). A run's rows are used (slot ``slot_of(seq)``, ``counts`` its pieces' ``n``)
    only when its write succeeded and its sequence is still alive after every write; other
    rows are padding with count 0."""
    out = blank_rows(rows, chunk, pad_slot, pad_position)
    slot_ids, tokens, positions = split_rows(out.packed, chunk)
    flat_tok, flat_pos = tokens.reshape(-1), positions.reshape(-1)  # views
    written = []
    for seq, row, start, n, num in runs(pieces, chunk):
        lo, hi = row * chunk, (row + num) * chunk
        if alive(seq):  # (a sequence that failed before writes nothing)
            ok = write(seq, start, n, flat_tok[lo:hi], flat_pos[lo:hi])
            written.append((seq, row, num, ok))
    counts = [0] * len(pieces)
    for seq, row, num, ok in written:
        if ok and alive(seq):
            slot_ids[row:row + num] = slot_of(seq)
            for r in range(row, row + num):
                counts[r] = pieces[r][2]
        else:  # its write failed, or its request failed later: what it wrote is padding again
            lo, hi = row * chunk, (row + num) * chunk
            copy_blocks(flat_tok[lo:hi], 0)
            copy_blocks(flat_pos[lo:hi], pad_position)
    return out, counts


__all__ = ["GIL_SAFE", "Piece", "PrefillRows", "blank_rows", "build_rows", "copy_blocks",
           "pack_rows", "plan_chunked", "plan_packed", "positions_upto", "runs", "split_rows",
           "tokens_left"]
