"""Token log-probabilities (and entropies) of a causal LM over a batch, chunked over time.

Alignment convention (used everywhere in the learner, same as the batch contract)::

    logprobs[b, t] = log pi(tokens[b, t] | tokens[b, :t])        for t >= 1
    logprobs[b, 0] = 0                                           (nothing predicts token 0)

i.e. per-token arrays stay aligned with ``tokens``, ``loss_mask`` and ``rollout_logprobs``
(the sampler reports the logprob of each token at that token's index). Internally the hidden
state at position ``t - 1`` predicts token ``t``: we compute ``next_lp[:, p] = log p(tokens[:, p+1]
| tokens[:, :p+1])`` for every position ``p`` (the last one scores a dummy target and is
dropped) and shift right by one. ``loss_mask[:, 0]`` must be 0 (a trajectory starts with a
prompt token), which the learner checks.

Memory: the ``[B, T, V]`` logits are never materialised. The final hidden states are split into
chunks of ``chunk_size`` positions; a ``lax.scan`` computes each chunk's ``[B, c, V]`` float32
logits, their logsumexp, the target logit and (optionally) the entropy, and keeps only
``[B, c]`` results. The chunk body is wrapped in ``jax.checkpoint`` so the backward pass
recomputes a chunk's logits instead of saving all of them (peak extra memory ~ one chunk's
logits + its gradient, e.g. 512 x 151936 x 4 B = 311 MB per sequence for Qwen2.5).

The chunk is at most ``chunk_size`` positions, and at most ``max_chunk_bytes`` of float32
logits (``B x c x V x 4``) when that is set: by default on CPU (:func:`default_chunk_bytes`,
32 MiB: 170 positions of one row or 21 of 8 rows at SmolLM2's V = 49152, where 512 positions
of 8 rows would be 768 MiB per logits-sized temporary and the backward pass holds several),
unbounded on accelerators.
Positions are then split into equal chunks (``ceil(T / n)`` for the fewest ``n`` chunks that
fit), so padding is at most ``n - 1`` positions.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from agentrl_jax.algorithms.losses import entropy_from_logits
from agentrl_jax.models.llama import CausalLM
from agentrl_jax.models.lm_head import lm_head_f32
from agentrl_jax.models.output_tokens import limit_to_options, option_ranks
from agentrl_jax.sharding.activations import current_mesh

Array = jax.Array


def shift_right(x: Array, fill: float = 0.0) -> Array:
    """``out[:, t] = x[:, t-1]``, ``out[:, 0] = fill`` (prediction-aligned -> token-aligned)."""
    pad = jnp.full_like(x[:, :1], fill)
    return jnp.concatenate([pad, x[:, :-1]], axis=1)


def next_token_targets(tokens: Array) -> Array:
    """``targets[:, p] = tokens[:, p+1]`` (last position: 0, a dummy that is dropped)."""
    return jnp.concatenate([tokens[:, 1:], jnp.zeros_like(tokens[:, :1])], axis=1)


def _chunk_stats(logits_fn: Callable[[Array], Array], h: Array, tgt: Array, temperature: float,
                 with_entropy: bool, ranks: np.ndarray | None = None,
                 counts: Array | None = None) -> tuple[Array, Array]:
    logits = logits_fn(h).astype(jnp.float32)
    if counts is not None:  # the per-turn option limit (models/output_tokens.py)
        logits = limit_to_options(logits, ranks, counts)
    if temperature != 1.0:
        logits = logits / temperature
    lse = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, tgt[..., None].astype(jnp.int32), axis=-1)[..., 0]
    lp = picked - lse
    if with_entropy:
        # -inf logits (tokens outside ``cfg.output_token_ids``) contribute 0, value and gradient
        ent = entropy_from_logits(logits)
    else:
        ent = jnp.zeros_like(lp)
    return lp, ent


#: default ``max_chunk_bytes`` on CPU (bytes of one chunk's float32 logits)
CPU_CHUNK_BYTES = 32 * 2**20


def default_chunk_bytes() -> int | None:
    """``CPU_CHUNK_BYTES`` on a CPU backend, else ``None`` (only ``chunk_size`` bounds)."""
    mesh = current_mesh()
    platform = mesh.devices.flat[0].platform if mesh is not None else jax.default_backend()
    return CPU_CHUNK_BYTES if platform == "cpu" else None


def chunk_length(t: int, rows: int, vocab: int, chunk_size: int,
                 max_chunk_bytes: int | None) -> int:
    """Positions per logits chunk: ``c = ceil(t / n)`` for the fewest chunks ``n`` with
    ``c <= chunk_size`` and ``rows * c * vocab * 4 <= max_chunk_bytes`` (if set; >= 1)."""
    c_max = max(1, min(chunk_size, t))
    if max_chunk_bytes is not None:
        c_max = max(1, min(c_max, max_chunk_bytes // max(1, rows * vocab * 4)))
    n = -(-t // c_max)
    return -(-t // n)


def position_stats(hidden: Array, targets: Array, logits_fn: Callable[[Array], Array], *,
                   chunk_size: int = 512, temperature: float = 1.0, with_entropy: bool = False,
                   vocab_size: int | None = None, max_chunk_bytes: int | None | str = "auto",
                   option_ranks: np.ndarray | None = None, option_counts: Array | None = None
                   ) -> tuple[Array, Array]:
    """``(lp [N, L], ent [N, L])`` at every position of ``hidden [N, L, D]``:
    ``lp = log softmax(logits_fn(h) / temperature)[target]`` with ``targets [N, L]``, and the
    entropy of that distribution (zeros unless ``with_entropy``). Chunks of positions
    (:func:`chunk_length`) in a ``lax.scan``, each rematerialised in the backward pass: the
    ``[N, L, V]`` logits never exist at once. ``option_counts [N, L]`` int (with
    ``option_ranks [V]``): the per-position option limit of each target's distribution
    (``output_tokens.limit_to_options``; 0: none)."""
    b, t, d = hidden.shape
    if max_chunk_bytes == "auto":
        max_chunk_bytes = default_chunk_bytes()
    if vocab_size is None and max_chunk_bytes is not None:
        vocab_size = jax.eval_shape(logits_fn, jax.ShapeDtypeStruct((1, d), hidden.dtype)).shape[-1]
    c = chunk_length(t, b, vocab_size or 1, chunk_size, max_chunk_bytes)
    n = -(-t // c)
    pad = n * c - t
    if pad:
        hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
        targets = jnp.pad(targets, ((0, 0), (0, pad)))
        if option_counts is not None:
            option_counts = jnp.pad(option_counts, ((0, 0), (0, pad)))
    hs = hidden.reshape(b, n, c, d).swapaxes(0, 1)  # [n, B, c, D]
    ts = targets.reshape(b, n, c).swapaxes(0, 1)  # [n, B, c]
    xs = (hs, ts)
    if option_counts is not None:
        if option_ranks is None:
            raise ValueError("option_counts needs option_ranks (the policy's option tokens)")
        xs += (option_counts.astype(jnp.int32).reshape(b, n, c).swapaxes(0, 1),)

    body = jax.checkpoint(
        lambda h, tg, *cnt: _chunk_stats(logits_fn, h, tg, temperature, with_entropy,
                                         option_ranks, *cnt),
        prevent_cse=False)

    if n == 1:
        lp, ent = body(*(x[0] for x in xs))
        lp, ent = lp[None], ent[None]
    else:
        def step(carry, x):
            return carry, body(*x)
        _, (lp, ent) = jax.lax.scan(step, None, xs)
    lp = lp.swapaxes(0, 1).reshape(b, n * c)[:, :t]
    ent = ent.swapaxes(0, 1).reshape(b, n * c)[:, :t]
    return lp, ent


def logprobs_from_hidden(hidden: Array, tokens: Array, logits_fn: Callable[[Array], Array], *,
                         chunk_size: int = 512, temperature: float = 1.0,
                         with_entropy: bool = False, vocab_size: int | None = None,
                         max_chunk_bytes: int | None | str = "auto",
                         option_ranks: np.ndarray | None = None,
                         option_counts: Array | None = None
                         ) -> tuple[Array, Array | None]:
    """Token-aligned ``(logprobs [B, T], entropy [B, T] | None)`` from final hidden states.

    ``hidden [B, T, D]`` are the model's final-normed hidden states, ``logits_fn`` maps
    ``[..., D] -> [..., V]`` (the LM head). ``entropy[b, t]`` is the entropy of the distribution
    that token ``t`` was drawn from (0 at ``t = 0``). Chunks: :func:`chunk_length` with
    ``max_chunk_bytes`` (``"auto"``: :func:`default_chunk_bytes`; ``vocab_size`` ``V``,
    default: read from ``logits_fn``'s output shape). The head runs at every position; the
    update's passes run it only at scored ones (``scored.py``). ``option_counts [B, T]`` int,
    token-aligned like ``tokens`` (the option limit token ``t`` was sampled under; 0: none),
    with ``option_ranks [V]``: ``output_tokens.limit_to_options``.
    """
    counts = None if option_counts is None else next_token_targets(option_counts)
    lp, ent = position_stats(hidden, next_token_targets(tokens), logits_fn,
                             chunk_size=chunk_size, temperature=temperature,
                             with_entropy=with_entropy, vocab_size=vocab_size,
                             max_chunk_bytes=max_chunk_bytes, option_ranks=option_ranks,
                             option_counts=counts)
    return shift_right(lp), (shift_right(ent) if with_entropy else None)


def model_hidden(model: CausalLM, tokens: Array, attention_mask: Array | None,
                 use_attention_mask: bool, *, positions: Array | None = None,
                 segment_ids: Array | None = None) -> Array:
    """Final hidden states ``[B, T, D]`` of a cache-less forward pass over ``tokens [B, T]``.

    With right-padded rows (every row's real tokens form a prefix) the causal mask alone is
    exact for every real token, so by default no attention mask is passed: that keeps the
    fast causal attention path (cuDNN flash attention on GPU) instead of XLA's masked
    ``[B, H, T, T]`` attention. Padded positions then see real tokens, but their outputs are
    masked out of every loss.

    Packed rows (several sequences end to end): ``segment_ids [B, T]`` int (a token attends
    only to earlier-or-same tokens with its segment id; 0 may mark padding) and
    ``positions [B, T]`` int32 (RoPE positions, restarting at 0 in each segment; default
    ``0..T-1``).
    """
    mask = attention_mask if use_attention_mask else None
    return model(tokens, positions=positions, attention_mask=mask, compute_logits=False,
                 segment_ids=segment_ids).hidden


def token_logprobs(graphdef: nnx.GraphDef, params: nnx.State, tokens: Array,
                   attention_mask: Array | None = None, *, chunk_size: int = 512,
                   temperature: float = 1.0, with_entropy: bool = False,
                   use_attention_mask: bool = False, positions: Array | None = None,
                   segment_ids: Array | None = None, option_counts: Array | None = None
                   ) -> tuple[Array, Array | None]:
    """Token-aligned log-probs (+ entropy) of the policy ``nnx.merge(graphdef, params)``.
    ``option_counts [B, T]``: per-token option limits (:func:`policy_option_ranks`).

    ``positions`` / ``segment_ids``: packed rows (see :func:`model_hidden`). The value at a
    segment's first token is then scored by the previous segment's last hidden state, as
    meaningless as ``logprobs[:, 0]``: keep ``loss_mask`` 0 there (a trajectory starts with a
    prompt token). The head runs at every position (only at the scored ones:
    ``scored.scored_token_logprobs``)."""
    model = nnx.merge(graphdef, params)
    hidden = model_hidden(model, tokens, attention_mask, use_attention_mask,
                          positions=positions, segment_ids=segment_ids)
    return logprobs_from_hidden(hidden, tokens, lm_head_f32(model), chunk_size=chunk_size,
                                temperature=temperature, with_entropy=with_entropy,
                                vocab_size=model.cfg.vocab_size,
                                **option_limit(model, option_counts))


def policy_option_ranks(model: CausalLM) -> np.ndarray:
    """The ``[V]`` option ranks of ``model``'s restricted policy (``output_tokens.option_ranks``);
    ``ValueError`` when its config lists no option tokens (no ``model.output_tokens``)."""
    ids = model.cfg.option_token_ids
    if ids is None:
        raise ValueError("per-turn option limits need a policy restricted to its option tokens "
                         "(model.output_tokens): this model's config lists none")
    return option_ranks(ids, model.cfg.vocab_size)


def option_limit(model: CausalLM, option_counts: Array | None) -> dict:
    """The ``option_ranks`` / ``option_counts`` keywords of the head functions for
    ``option_counts`` (none when it is ``None``)."""
    if option_counts is None:
        return {}
    return {"option_ranks": policy_option_ranks(model), "option_counts": option_counts}


__all__ = ["logprobs_from_hidden", "position_stats", "token_logprobs", "model_hidden",
           "shift_right", "next_token_targets", "chunk_length", "default_chunk_bytes",
           "CPU_CHUNK_BYTES", "option_limit", "policy_option_ranks"]
