"""Stop strings on the host: decode only at the tokens that can complete a match.

The engine finishes a sequence at the first output position ``j`` whose detokenized prefix
``decode(ids[:j + 1])`` contains a stop string. Decoding every prefix costs a decode of the whole
growing output per generated token; this module narrows it down.

Why it is exact: for plain text, decoding appends -- token ``j`` adds its isolated decode (its
*piece*) to the text of ``ids[:j]``. A match that is absent from ``decode(ids[:j])`` and present
in ``decode(ids[:j + 1])`` therefore ends inside the piece of token ``j``, so that piece contains
the stop string's last character. Tokens whose isolated decode is not plain text -- empty,
containing U+FFFD (a partial UTF-8 byte sequence that joins its neighbours), special or added
tokens -- and ids past the tokenizer's vocabulary (model vocab padding) may change the text
otherwise and count as possible completers too. The earliest matching position is always a
possible completer, so testing only those positions finds the same ``j``, text and match.

Whitespace breaks the argument: decoders may drop a piece's leading space when it is decoded
alone (SentencePiece's ``▁``) or insert / remove spaces between pieces (WordPiece joining,
clean-up before punctuation). For a stop string ending in whitespace other than ``"\\n"`` every
token counts as a possible completer (the plain per-token check).
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Sequence

import numpy as np

from agentrl_jax.rollout.engine.prefill_plan import GIL_SAFE


def may_complete_mask(tokenizer: Any, stops: Sequence[str], skip_special_tokens: bool
                      ) -> np.ndarray:
    """``mask[t]``: can token ``t`` complete a match of one of ``stops``? -> ``[V + 1]`` bool,
    ``V = len(tokenizer)``; entry ``V`` (always True) stands for every id ``>= V``.

    Cached per (tokenizer, stop tuple, skip_special_tokens) and read-only (engines share it);
    building one decodes every token once (a fraction of a second for SmolLM2's 49k tokens;
    docs/PERFORMANCE.md, "Figures moved out of the code's comments")."""
    key = (tuple(stops), bool(skip_special_tokens))
    try:
        return _cached_mask(tokenizer, *key)
    except TypeError:  # an unhashable tokenizer: build without the cache
        return _build_mask(tokenizer, *key)


@functools.lru_cache(maxsize=32)
def _cached_mask(tokenizer: Any, stops: tuple[str, ...], skip_special_tokens: bool) -> np.ndarray:
    return _build_mask(tokenizer, stops, skip_special_tokens)


def _build_mask(tokenizer: Any, stops: tuple[str, ...], skip_special_tokens: bool) -> np.ndarray:
    vocab = len(tokenizer)
    if any(not s or (s[-1].isspace() and s[-1] != "\n") for s in stops):
        return np.ones((vocab + 1,), np.bool_)  # see the module docstring: whitespace
    singles = np.arange(vocab, dtype=np.uint32).reshape(vocab, 1)  # [V, 1]
    backend = getattr(tokenizer, "backend_tokenizer", None)  # a fast tokenizer's Rust object
    if backend is not None:  # faster than transformers' batch_decode (its Python clean-up
        # only removes spaces, covered by the whitespace rule above); an array, not 49k small
        # lists, so that building the mask does not set off a full garbage collection
        pieces = backend.decode_batch(singles, skip_special_tokens=skip_special_tokens)
    else:
        pieces = tokenizer.batch_decode(singles.tolist(), skip_special_tokens=skip_special_tokens)
    last = {s[-1] for s in stops}
    mask = np.fromiter((not p or "\ufffd" in p or any(c in p for c in last) for p in pieces),
                       np.bool_, count=vocab)
    added = set(getattr(tokenizer, "all_special_ids", ()))
    added.update(getattr(tokenizer, "get_added_vocab", dict)().values())
    mask[[i for i in added if 0 <= i < vocab]] = True
    mask = np.append(mask, True)
    mask.flags.writeable = False
    return mask


def candidates(mask: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Positions ``j`` of ``ids`` (``[n]`` token ids) where ``mask`` says the token may complete a
    match -> ``[k]`` int, ascending."""
    return np.flatnonzero(mask[np.minimum(ids, len(mask) - 1)])


def completer_hits(toks: np.ndarray, valid: np.ndarray, slots: np.ndarray,
                   masks: Sequence[np.ndarray | None]) -> np.ndarray:
    """Where ``slots`` generated a possible completer in this decode call.

    ``toks``, ``valid``: ``[steps, max_batch]`` tokens and valid flags of one decode call;
    ``slots``: ``[n]`` slot ids with stop strings; ``masks[slot]``: that slot's
    ``may_complete_mask``. Returns ``[steps, n]`` bool: ``mask[toks[j, slot]] & valid[j, slot]``.
    One vectorised lookup per distinct mask, over at most :data:`GIL_SAFE` tokens per NumPy op
    (``prefill_plan``: larger ones let a busy thread take the engine thread's GIL)."""
    steps = toks.shape[0]
    out = np.zeros((steps, len(slots)), np.bool_)
    groups: dict[int, list[int]] = {}
    for i, slot in enumerate(slots.tolist()):
        groups.setdefault(id(masks[slot]), []).append(i)
    width = max(1, GIL_SAFE // max(steps, 1))  # columns per op
    for rows in groups.values():
        mask = masks[int(slots[rows[0]])]
        top = len(mask) - 1
        for k in range(0, len(rows), width):
            idx = np.asarray(rows[k:k + width])
            cols = slots[idx]
            out[:, idx] = mask[np.minimum(toks[:, cols], top)] & valid[:, cols]
    return out


def slots_to_check(toks: np.ndarray, valid: np.ndarray, slots: np.ndarray,
                   masks: Sequence[np.ndarray | None]) -> np.ndarray:
    """Which of ``slots`` generated a possible completer in this decode call -> ``[n]`` bool
    (``completer_hits`` over the call's steps)."""
    return completer_hits(toks, valid, slots, masks).any(axis=0)


def detokenize(tokenizer: Any, ids: list[int], skip_special_tokens: bool) -> str:
    """``tokenizer.decode(ids, skip_special_tokens=...)`` (``ids``: a list of ints), the same
    text. For a transformers ``TokenizersBackend`` (every fast tokenizer) whose ``_decode`` is
    the library's own and that cleans up no spaces, that ``decode`` ends in one call of its
    Rust tokenizer's ``decode``; called here directly, without the per-id Python conversion
    before it (most of a short output's detokenising time)."""
    module = sys.modules.get("transformers.tokenization_utils_tokenizers")
    backend = getattr(module, "TokenizersBackend", None)
    if backend is not None and isinstance(tokenizer, backend) and \
            type(tokenizer)._decode is backend._decode and \
            not tokenizer.clean_up_tokenization_spaces:
        return tokenizer.backend_tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
    return tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def find_stop(tokenizer: Any, ids: np.ndarray, start: int, stops: Sequence[str],
              skip_special_tokens: bool, mask: np.ndarray | None = None,
              positions: Sequence[int] | np.ndarray | None = None
              ) -> tuple[int, str, int, str] | None:
    """The earliest ``j >= start`` at which ``decode(ids[:j + 1])`` contains a stop string.

    ``ids``: ``[n]`` output token ids; positions before ``start`` are known not to match.
    ``mask``: the stops' ``may_complete_mask`` (``None``: test every position).
    ``positions``: the candidates of ``ids[start:]`` (ascending, ``>= start``) when the
    caller has them already (the engine: from ``completer_hits`` of the decode call);
    ``None``: found here with ``mask``. Returns ``(j, text, index, matched)`` -- the decoded
    prefix, and the stop string found at the smallest ``index`` in it (ties: the smallest
    string) -- or ``None``."""
    if positions is None:
        positions = (range(start, len(ids)) if mask is None
                     else start + candidates(mask, ids[start:]))
    if len(positions) == 0:
        return None
    prefix = ids.tolist()
    for j in positions:
        text = detokenize(tokenizer, prefix[:j + 1], skip_special_tokens)
        hits = [(text.find(s), s) for s in stops if s in text]
        if hits:
            index, matched = min(hits)
            return int(j), text, index, matched
    return None
