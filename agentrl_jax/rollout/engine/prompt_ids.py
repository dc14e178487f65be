"""A prompt's token ids checked and converted once, at submission (``Engine.validate``).

The actor pool hands the engine each turn's whole context as a list of Python ints; this turns
it into the int32 array the request keeps (prefill rows are slices of it; its bytes are the
``share_prompts`` key), with the conversion and the range check in C (docs/PERFORMANCE.md,
"A prompt's intake").
"""

from __future__ import annotations

import array
from typing import Any, Sequence

import numpy as np

from agentrl_jax.rollout.contract import InvalidRequestError


#: ``array.array`` type codes of machine integers: such an array holds integers only, so it is
#: read in place (``np.frombuffer``) with no per-element conversion
_ARRAY_INTS = {code: np.dtype(code) for code in "bBhHiIlLqQ"}


def check_input_ids(input_ids: Sequence[Any] | array.array | np.ndarray, vocab_size: int | None,
                    max_length: int | None) -> np.ndarray:
    """Validate a prompt: a non-empty list (or tuple) of integers (Python or numpy; bools
    refused), or a 1-D ``array.array`` / ``numpy`` array of a machine integer type (read in
    place: an episode that keeps its context as ``array("i")`` hands it over without a
    conversion per token; ``RolloutBackend.takes_id_arrays``), inside the vocabulary ``[0,
    vocab_size)`` (``None``: ``[0, 2**31)``), shorter than the context. Returns the ids as a
    new int32 array ``[L]`` (never a view of the caller's list or array), which the engine
    keeps as the request's prompt."""
    limit = vocab_size if vocab_size is not None else 2**31
    if isinstance(input_ids, (array.array, np.ndarray)):
        return _checked(_machine_ints(input_ids), limit, max_length, input_ids)
    if not isinstance(input_ids, (list, tuple)) or not input_ids:
        raise InvalidRequestError("input_ids must be a non-empty list of integers")
    try:
        # C-level conversion (a float, string or None raises TypeError here); bools would
        # pass as 0 / 1, so only the elements converted to 0 or 1 have their type checked
        # (docs/PERFORMANCE.md, "A prompt's intake")
        ids = np.frombuffer(array.array("q", input_ids), np.int64)
        if any(isinstance(input_ids[i], (bool, np.bool_)) for i in np.flatnonzero(ids <= 1)):
            raise TypeError
    except (TypeError, OverflowError):  # element by element: names the offending type;
        ids = _as_int_array(input_ids)  # None: an int past int64, outside any vocabulary
    return _checked(ids, limit, max_length, input_ids)


def _machine_ints(input_ids: array.array | np.ndarray) -> np.ndarray:
    """A 1-D, non-empty integer array's values in place (a view), or InvalidRequestError."""
    if isinstance(input_ids, array.array):
        if input_ids.typecode not in _ARRAY_INTS:
            raise InvalidRequestError(
                f"input_ids as an array must hold integers, got type code {input_ids.typecode!r}")
        ids = np.frombuffer(input_ids, _ARRAY_INTS[input_ids.typecode])
    else:
        ids = input_ids
        if ids.dtype.kind not in "iu":
            raise InvalidRequestError(
                f"input_ids must contain only integers, found an array of {ids.dtype}")
    if ids.ndim != 1 or not len(ids):
        raise InvalidRequestError("input_ids must be a non-empty list of integers")
    return ids


def _checked(ids: np.ndarray | None, limit: int, max_length: int | None,
             input_ids: Any) -> np.ndarray:
    """The range and length checks; a new int32 array ``[L]``. ``ids`` None: an element past
    int64 (``input_ids`` names it)."""
    if ids is None or ids.min() < 0 or ids.max() >= limit:
        bad = ([t for t in input_ids if not 0 <= int(t) < limit] if ids is None
               else ids[(ids < 0) | (ids >= limit)].tolist())
        raise InvalidRequestError(
            f"input_ids contain {len(bad)} token ids outside the vocabulary [0, {limit}),"
            f" e.g. {bad[:5]}")
    if max_length is not None and len(ids) >= max_length:
        raise InvalidRequestError(
            f"prompt has {len(ids)} tokens; the context length is {max_length}, so prompts "
            f"must have at most {max_length - 1} tokens")
    return ids.astype(np.int32)  # a copy, also when ``ids`` is int32


def _as_int_array(input_ids: Sequence[Any]) -> np.ndarray | None:
    """The ids as int64 ``[L]``, element by element (numpy integers converted; bools and other
    types refused with their type named); None when one is past int64."""
    out = []
    for t in input_ids:
        if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)):
            raise InvalidRequestError(
                f"input_ids must contain only integers, found {type(t).__name__}")
        out.append(int(t))
    try:
        return np.asarray(out, np.int64)
    except OverflowError:
        return None


__all__ = ["check_input_ids"]
