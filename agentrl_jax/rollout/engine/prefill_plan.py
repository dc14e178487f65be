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
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence


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


__all__ = ["Piece", "plan_chunked", "plan_packed", "tokens_left"]
