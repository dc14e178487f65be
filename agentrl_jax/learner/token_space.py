"""The packed layout's token space: one ``[rows, pack_length]`` shape a run keeps.

With packed rows (``layouts.PackedRows``) the model only ever sees ``[n, pack_length]`` rows,
but the update's small programs work on the *token space*, the batch padded to ``[B, T]``:
the gathers that pack and unpack rows (``layouts._gather_flat``, ``_unpack_into``), the
derive program (KL, advantages, importance weights), the shuffle, the zeros the log-prob pass
unpacks into. Each compiles once per ``[B, T]``. Before, ``B`` was the batch's row count up to
a power of two and ``T`` its length up to a length bucket, so a batch that crossed a bucket
(72 episodes after 56: 128 rows after 64; the longest episode under 1,024 tokens after one
over) compiled seven programs in the middle of a run (the slow steps' timings:
docs/PERFORMANCE.md; the mechanism: docs/LEARNER.md, "One token space a run").

Now ``T`` is always ``pack_length`` (no trajectory is longer) and ``B`` is a kept row count,
a power of two that only grows: :meth:`PackedTokenRows.reserve` (the trainer reserves the
most episodes a step can hand over, ``tasks_per_step * samples_per_task``, before the first
update) and :meth:`PackedTokenRows.for_rows` (a larger batch grows it: one compile, then
never again). Padding rows are zero-length with fresh group ids: they pack into nothing and
the mini-batches split only the batch's own rows (``PackedRows.optimiser_steps``), so the
model does no extra work; only the small element-wise programs run over the padded rows.
"""

from __future__ import annotations

from agentrl_jax.learner.config import LearnerConfig


def power_of_two_rows(rows: int) -> int:
    """The smallest power of two ``>= max(rows, 1)``."""
    return 1 << max(int(rows) - 1, 0).bit_length()


class PackedTokenRows:
    """A learner's token-space row count for packed updates: the largest
    :func:`power_of_two_rows` it has handed out or reserved (it only grows), starting at 1."""

    def __init__(self) -> None:
        self.value = 1

    def reserve(self, rows: int) -> None:
        """Grow the kept count to hold ``rows`` rows (the most a run's batches can have), so
        no update compiles the token-space programs for a larger count."""
        if int(rows) < 0:
            raise ValueError(f"cannot reserve {rows} token-space rows (must be >= 0)")
        self.value = max(self.value, power_of_two_rows(rows))

    def for_rows(self, rows: int) -> int:
        """The token-space row count for a batch of ``rows`` rows (grows the kept count where
        the batch is larger)."""
        self.reserve(rows)
        return self.value


def packed_token_space(rows: int, length: int, config: LearnerConfig,
                       kept: PackedTokenRows | None = None) -> tuple[int, int]:
    """``(B, T)``: the packed layout's token space for a ``[rows, length]`` batch. ``T`` is
    ``pack_length`` (or ``length`` where the batch is wider: its tokens still fit, since
    ``packing.plan_packing`` refuses a longer trajectory); ``B`` is ``rows`` up to a power of
    two, at least ``kept``'s count (which grows to it)."""
    b = kept.for_rows(rows) if kept is not None else power_of_two_rows(rows)
    return b, max(int(length), int(config.pack_length))


def logprob_call_rows(logprob_batch_size: int, micro_batch_size: int) -> tuple[int, int]:
    """``(full, tail)``: the row counts of the packed log-prob pass's two call shapes. The
    pass runs calls of ``full = logprob_batch_size`` rows while that many rows are left, then
    calls of ``tail = micro_batch_size`` rows (a row count the train step already holds in
    memory, forward and backward) for the rest, so the pack plan is rounded up to a multiple
    of ``tail``, not ``full``: 17 filled rows run as 16 + 4 rows instead of 32. Both shapes are
    compiled ahead (``ahead.py``). ``tail == full`` (one shape, the plan rounded to ``full``)
    where ``micro_batch_size`` is not a smaller divisor of ``logprob_batch_size``."""
    full, micro = int(logprob_batch_size), int(micro_batch_size)
    return full, (micro if micro < full and full % micro == 0 else full)


def call_sizes(num_rows: int, full: int, tail: int) -> list[int]:
    """The calls over ``num_rows`` packed rows (a multiple of ``tail``): ``full`` rows at a
    time while that many are left, then ``tail`` rows at a time, e.g. ``(28, 16, 4) ->
    [16, 4, 4, 4]``."""
    if num_rows % tail:
        raise ValueError(f"{num_rows} packed rows are not a multiple of the tail call's {tail}")
    n_full = num_rows // full
    return [full] * n_full + [tail] * ((num_rows - n_full * full) // tail)


__all__ = ["PackedTokenRows", "call_sizes", "logprob_call_rows", "packed_token_space",
           "power_of_two_rows"]
