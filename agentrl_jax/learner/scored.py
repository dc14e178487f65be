"""The LM head only where a token is scored: log-probs (and entropies) at the loss-mask positions.

The update needs a token's log-prob only where ``loss_mask != 0`` (the generated tokens: ~1% of
an agent trajectory, whose prompts and observations dominate), but the full path
(``logprobs.logprobs_from_hidden``) runs the ``V``-way head and its log-softmax at every
position. Here the transformer still runs everywhere (``hidden [R, T, D]``), then per row::

    idx[r, :]  = the token positions t >= 1 with loss_mask[r, t] != 0, in order,
                 padded with T (an empty slot) to a static capacity C        [R, C]
    h_sel      = hidden[r, idx - 1]      (position t - 1 predicts token t)   [R, C, D]
    lp, ent    = head + log-softmax of h_sel at targets tokens[r, idx]       [R, C]
    out[r, idx] = lp  (empty slots dropped), 0 elsewhere                     [R, T]

so the head costs ``R x C`` positions instead of ``R x T``. The gather stays inside each row,
so rows sharded over the batch axes stay where they are (no all-gather of hidden states).
The result equals the full path at scored positions and is 0 elsewhere; every consumer of the
update's log-probs and entropies (PPO ratio, KL, entropy bonus, DPO sums, importance weights,
behaviour metrics) reads them through ``loss_mask`` only.

The capacity ``C`` is static per compiled program: the host, which lays the batch out, counts
the scored tokens of every row and :class:`ScoredCapacity` rounds the largest count up to a
power of two (never below ``learner.scored_capacity_min``), keeping the largest capacity it has
given out (it never shrinks: one program per run once warmed up). With packed rows the same
value is the pack plan's scored-token budget per row (``packing.plan_packing``), so a row grows
it only where one trajectory alone holds more; the trainer reserves the most a trajectory can
hold before the first update (:meth:`ScoredCapacity.reserve`), and the compile-ahead path
(``ahead.py``) compiles that value: the programs every update runs. A capacity of at least
``T`` falls back to the full head (``None``).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from flax import nnx

from agentrl_jax.learner.logprobs import model_hidden, option_limit, position_stats
from agentrl_jax.models.lm_head import lm_head_f32

Array = jax.Array


def scored_positions(loss_mask: Array, capacity: int) -> Array:
    """``idx [R, C]`` int32: per row, the positions ``t >= 1`` with ``loss_mask != 0`` in
    increasing order, then ``T`` (an empty slot). Scored positions past ``C`` are dropped (the
    host sizes ``C`` to the largest row count: :class:`ScoredCapacity`)."""
    r, t = loss_mask.shape
    scored = (loss_mask != 0) & (jnp.arange(t)[None, :] >= 1)
    slot = jnp.where(scored, jnp.cumsum(scored, axis=1) - 1, capacity)  # [R, T]
    idx = jnp.full((r, capacity), t, jnp.int32)
    rows = jnp.broadcast_to(jnp.arange(r)[:, None], (r, t))
    cols = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32)[None, :], (r, t))
    return idx.at[rows, slot].set(cols, mode="drop")


def scored_logprobs_from_hidden(hidden: Array, tokens: Array, loss_mask: Array,
                                logits_fn: Callable[[Array], Array], capacity: int, *,
                                chunk_size: int = 512, temperature: float = 1.0,
                                with_entropy: bool = False, vocab_size: int | None = None,
                                option_ranks: np.ndarray | None = None,
                                option_counts: Array | None = None
                                ) -> tuple[Array, Array | None]:
    """Token-aligned ``(logprobs [R, T], entropy [R, T] | None)`` at the scored positions
    (``loss_mask != 0``, ``t >= 1``; 0 elsewhere), the head run on ``[R, capacity]`` gathered
    hidden states (module docstring). ``hidden [R, T, D]``, ``tokens`` / ``loss_mask`` ``[R, T]``;
    ``logits_fn``, ``chunk_size``, ``temperature``, ``option_ranks`` / ``option_counts
    [R, T]`` (token-aligned, gathered at the scored positions like the targets): as
    ``logprobs.logprobs_from_hidden``."""
    r, t, d = hidden.shape
    idx = scored_positions(loss_mask, capacity)  # [R, C]
    valid = idx < t
    src = jnp.clip(idx - 1, 0, t - 1)
    h_sel = jnp.take_along_axis(hidden, src[..., None], axis=1)  # [R, C, D]
    targets = jnp.take_along_axis(tokens, jnp.clip(idx, 0, t - 1), axis=1)  # [R, C]
    counts = (None if option_counts is None
              else jnp.take_along_axis(option_counts, jnp.clip(idx, 0, t - 1), axis=1))
    lp, ent = position_stats(h_sel, targets, logits_fn, chunk_size=chunk_size,
                             temperature=temperature, with_entropy=with_entropy,
                             vocab_size=vocab_size, option_ranks=option_ranks,
                             option_counts=counts)
    rows = jnp.broadcast_to(jnp.arange(r)[:, None], idx.shape)

    def scatter(x: Array) -> Array:
        return jnp.zeros((r, t), x.dtype).at[rows, idx].set(jnp.where(valid, x, 0),
                                                             mode="drop")
    return scatter(lp), (scatter(ent) if with_entropy else None)


def scored_token_logprobs(graphdef: nnx.GraphDef, params: nnx.State, tokens: Array,
                          attention_mask: Array | None, loss_mask: Array, capacity: int, *,
                          chunk_size: int = 512, temperature: float = 1.0,
                          use_attention_mask: bool = False, positions: Array | None = None,
                          segment_ids: Array | None = None, option_counts: Array | None = None
                          ) -> Array:
    """``logprobs.token_logprobs`` (no entropy) with the head only at the scored positions of
    ``loss_mask [B, T]``, at most ``capacity`` a row: ``logprobs [B, T]``, 0 elsewhere
    (``option_counts [B, T]``: per-token option limits)."""
    model = nnx.merge(graphdef, params)
    hidden = model_hidden(model, tokens, attention_mask, use_attention_mask,
                          positions=positions, segment_ids=segment_ids)
    lp, _ = scored_logprobs_from_hidden(hidden, tokens, loss_mask, lm_head_f32(model), capacity,
                                        chunk_size=chunk_size, temperature=temperature,
                                        vocab_size=model.cfg.vocab_size,
                                        **option_limit(model, option_counts))
    return lp


def row_counts(loss_mask: np.ndarray) -> np.ndarray:
    """Host: scored tokens per row, ``[R]`` int (``loss_mask != 0`` at ``t >= 1``)."""
    m = np.asarray(loss_mask) != 0
    return m[:, 1:].sum(axis=1).astype(np.int64)


def capacity_bucket(count: int, minimum: int) -> int:
    """The smallest power of two ``>= max(count, minimum, 1)``."""
    need = max(int(count), int(minimum), 1)
    return 1 << (need - 1).bit_length()


class ScoredCapacity:
    """A learner's per-row capacity for the scored LM head: the largest
    :func:`capacity_bucket` it has handed out (it only grows), starting at
    ``capacity_bucket(0, minimum)``. ``enabled`` False: always the full head (``None``)."""

    def __init__(self, enabled: bool, minimum: int):
        self.enabled = enabled
        self.value = capacity_bucket(0, minimum)
        self.minimum = minimum

    def current(self, length: int) -> int | None:
        """The capacity a ``[rows, length]`` program compiled now would take (``None``: the
        full head), without growing: what the compile-ahead path compiles."""
        if not self.enabled or self.value >= length:
            return None
        return self.value

    def reserve(self, count: int) -> None:
        """Grow the kept value to hold ``count`` scored tokens a row (``capacity_bucket``):
        the trainer reserves the most one trajectory can hold (its turns x generated tokens a
        turn) before compiling ahead, so no update of the run needs a larger capacity (the
        pack plan keeps every packed row within it: ``packing.plan_packing``)."""
        if self.enabled:
            self.value = max(self.value, capacity_bucket(count, self.minimum))

    def for_rows(self, max_row_count: int, length: int) -> int | None:
        """The capacity for rows of ``length`` tokens whose largest scored count is
        ``max_row_count`` (grows the kept value where needed); ``None``: the full head."""
        if self.enabled:
            self.value = max(self.value, capacity_bucket(max_row_count, self.minimum))
        return self.current(length)


__all__ = ["scored_positions", "scored_logprobs_from_hidden", "scored_token_logprobs", "row_counts", "capacity_bucket",
           "ScoredCapacity"]
