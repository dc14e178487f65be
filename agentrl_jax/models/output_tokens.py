"""A policy restricted to a set of output tokens: every other token's logit is -inf.

``ModelConfig.output_token_ids`` (a sorted tuple of token ids, or ``None``: the whole
vocabulary) is part of the model's static structure, so the one function that turns hidden
states into logits (``lm_head.lm_head_f32``, and ``CausalLM.logits``) applies it, and every
consumer of those logits sees the same restricted distribution::

    logits'[..., v] = logits[..., v]   if v in allowed
                      -inf             otherwise
    log pi(v) = logits'[v] / T - logsumexp_{u in allowed}(logits'[u] / T)

i.e. the softmax renormalised over the allowed tokens: the engine samples from it (a
disallowed token has probability exactly 0) and reports its log-probs; the learner scores,
differentiates, and takes entropies of the same distribution (a -inf logit contributes 0 to
the entropy: ``logprobs._chunk_stats``).

Why: a small random or untrained model spreads its mass over the whole vocabulary; when the
answer format is a few tokens (``rollout.parser = "choice"``: one letter names a listed
action), a policy over those tokens alone starts at a uniform choice among the actions and RL
moves mass between them instead of losing it to tokens it never sampled (docs/RESULTS.md,
"The CPU learning check at temperature 1").

**Per-turn option limits.** The restricted entries keep their listed order
(``ModelConfig.option_token_ids``: entry ``k`` is option ``k``, e.g. `` a`` .. `` z``). A turn
that lists ``n`` options may name only the first ``n``; a per-position integer ``n`` (0: no
per-turn limit) narrows the static set further with a ``[V]`` rank array that is a constant of
the compiled program (:func:`option_ranks`: option ``k`` -> ``k``, every other token ->
``V``)::

    allowed[..., v] = (n[...] <= 0) or (rank[v] < n[...])
    logits''[..., v] = logits'[..., v] if allowed else -inf       (:func:`limit_to_options`)

so with ``n >= 1`` only the first ``n`` option tokens remain: EOS is excluded too (an EOS-only
reply names no option and is a parser failure, exactly what the limit exists to prevent; a
turn without options, ``n = 0``, keeps EOS). The engine applies it per slot before sampling
(the first token after prefill included: it is sampled by the first decode step) and the
learner per scored position, so both renormalise over the same tokens and importance ratios
stay 1 at equal weights.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


def allowed_mask(allowed: Sequence[int], vocab_size: int) -> np.ndarray:
    """``mask [V]`` bool: True at the ``allowed`` token ids (a constant of the compiled
    program)."""
    mask = np.zeros(vocab_size, bool)
    mask[np.asarray(list(allowed), np.int64)] = True
    return mask


def restrict_logits(logits: Array, allowed: Sequence[int] | None) -> Array:
    """``logits [..., V]`` with every column outside ``allowed`` set to -inf (``None``: as
    they are). The gradient reaches the allowed columns only."""
    if allowed is None:
        return logits
    mask = allowed_mask(allowed, logits.shape[-1])
    return jnp.where(mask, logits, jnp.asarray(-jnp.inf, logits.dtype))


#: a per-position option count meaning "no per-turn limit" (the static restriction alone)
NO_OPTION_LIMIT = 0


def option_ranks(option_token_ids: Sequence[int], vocab_size: int) -> np.ndarray:
    """``rank [V]`` int32: ``k`` at the ``k``-th option token, ``V`` elsewhere (EOS, and every
    token outside the restriction): ``rank < n`` holds exactly for the first ``n`` options."""
    rank = np.full(vocab_size, vocab_size, np.int32)
    rank[np.asarray(list(option_token_ids), np.int64)] = np.arange(len(option_token_ids),
                                                                    dtype=np.int32)
    return rank


def limit_to_options(logits: Array, ranks: np.ndarray, counts: Array) -> Array:
    """``logits [..., V]`` with the per-position option limit ``counts [...]`` int applied:
    where ``counts >= 1`` every column whose ``ranks [V]`` (:func:`option_ranks`) is not below
    the count is -inf; where ``counts <= 0`` (``NO_OPTION_LIMIT``) the logits are unchanged."""
    n = counts[..., None]
    allowed = (n <= NO_OPTION_LIMIT) | (jnp.asarray(ranks) < n)
    return jnp.where(allowed, logits, jnp.asarray(-jnp.inf, logits.dtype))


def check_token_ids(ids: Sequence[int], vocab_size: int) -> tuple[int, ...]:
    """``ids`` as a sorted tuple; ``ValueError`` unless they are non-empty, distinct integers
    in ``[0, vocab_size)``."""
    ids = list(ids)
    if not ids:
        raise ValueError("output_token_ids: must name at least one token (None: every token)")
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < vocab_size:
            raise ValueError(f"output_token_ids: {i!r} is not a token id in [0, {vocab_size})")
    if len(set(ids)) != len(ids):
        raise ValueError(f"output_token_ids: repeats a token ({sorted(ids)})")
    return tuple(sorted(int(i) for i in ids))


def token_entries(spec: str | Sequence[str]) -> list[str]:
    """The token strings of a ``model.output_tokens`` setting: a string is one token per
    character (``"abc"``), a list / tuple gives whole token strings (``[" left", " right"]``)."""
    if isinstance(spec, str):
        return list(spec)
    return [str(s) for s in spec]


def resolve_option_tokens(tokenizer: Any, spec: str | Sequence[str]) -> tuple[int, ...]:
    """The token ids of ``spec``'s entries (:func:`token_entries`) through ``tokenizer``, in
    the listed order (entry ``k``: option ``k``). ``ValueError`` naming the entry when one is
    not exactly one token (no special tokens added), or when two entries are the same token."""
    entries = token_entries(spec)
    if not entries:
        raise ValueError("model.output_tokens: lists no token")
    ids: dict[int, str] = {}
    for entry in entries:
        encoded = tokenizer.encode(entry, add_special_tokens=False)
        if len(encoded) != 1:
            raise ValueError(f"model.output_tokens: {entry!r} is {len(encoded)} tokens for this "
                             f"tokenizer ({encoded}), not one")
        token = int(encoded[0])
        if token in ids:
            raise ValueError(f"model.output_tokens: {entry!r} and {ids[token]!r} are the same "
                             f"token ({token})")
        ids[token] = entry
    return tuple(ids)


def resolve_output_tokens(tokenizer: Any, spec: str | Sequence[str],
                          eos_token_ids: Sequence[int] = ()) -> tuple[int, ...]:
    """The sorted token ids of ``spec`` (:func:`resolve_option_tokens`) plus ``eos_token_ids``
    (a reply may always end); ``ValueError`` as :func:`resolve_option_tokens`."""
    ids = resolve_option_tokens(tokenizer, spec)
    return tuple(sorted(set(ids) | {int(e) for e in eos_token_ids}))


__all__ = ["allowed_mask", "restrict_logits", "check_token_ids", "token_entries",
           "resolve_output_tokens", "resolve_option_tokens", "option_ranks", "limit_to_options",
           "NO_OPTION_LIMIT"]
