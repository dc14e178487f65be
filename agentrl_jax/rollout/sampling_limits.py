"""The allowed range of every sampling parameter, in one place.

The rollout server's request models (``api_models.py``), ``SamplingParams.validate`` (every
backend, the engine's last check before a request enters its batch) and the run-config
validation (``training/preflight/validate.py``, ``rollout.*``) all read their ranges from here, so a value
is refused the same way -- with the same range in the message -- wherever it comes from.

The bounds fit the engine's per-slot arrays (``compiled.py``: int32 ``ints``, float32
``floats``) and the served model. Some bounds depend on the engine; they are given as
*context* (the keys of :data:`CONTEXT_KEYS`: ``max_length``, ``max_batch``, ``vocab_size``,
``max_stop_ids``, ``option_tokens``) and, without it, fall back to the static bound.

=====================  =============================================================  ========
parameter              allowed values                                                 default
=====================  =============================================================  ========
``max_new_tokens``     integer in [0, context length] (``max_length``; else 2^31 - 1).      128
                       The engine stops at the end of the context: it generates at
                       most ``max_length - len(prompt)`` tokens (a clamp, not an error).
``temperature``        0 (greedy) or a number in [1e-06, 1000]: smaller positive          1.0
                       values would overflow the float32 ``logits / T``.
``top_p``              number in (0, 1]                                                   1.0
``top_k``              -1 (off) or an integer in [1, 2^31 - 1] (int32). A ``top_k`` of     -1
                       the vocabulary size or more keeps every token (the same as -1):
                       the engine clamps it to the vocabulary.
``min_p``              number in [0, 1]                                                   0.0
``n``                  integer in [1, max_batch] (else [1, 2^31 - 1])                       1
``seed``               integer in [0, 2^63 - 1] (also ``sampling_seed``)                 None
``stop_token_ids``     at most ``max_stop_ids`` distinct ids, each in [0, vocab_size)    None
                       (else [0, 2^31 - 1])
``stop``               at most 32 strings of 1 to 1024 characters                        None
``logprob_start_len``  integer in [-1, 2^31 - 1] (only -1 with ``return_logprob``)        None
``option_count``       integer in [1, option tokens]: sample only the first n option     None
                       tokens of a restricted policy (``option_tokens``: the served
                       policy's ``ModelConfig.option_token_ids``; ours only, refused
                       where the policy has none and by the SGLang backend)
=====================  =============================================================  ========

Penalties (``frequency_penalty``, ``presence_penalty``, ``repetition_penalty``,
``min_new_tokens``) are not implemented: the server accepts only their defaults
(``servers/api_fields.py``: ``Unsupported*``).

A problem is one phrase naming the range, e.g. ``"must be -1 (off) or an integer in [1,
2147483647] (got 2147483648)"``; callers prefix the field's name.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

INT32_MAX = 2**31 - 1
SEED_MAX = 2**63 - 1
MIN_TEMPERATURE = 1e-6  # smallest positive temperature (float32 logits / T stay finite)
MAX_TEMPERATURE = 1000.0
MAX_STOP_STRINGS = 32
MAX_STOP_CHARS = 1024
#: engine-dependent bounds a caller may pass as context
CONTEXT_KEYS = ("max_length", "max_batch", "vocab_size", "max_stop_ids", "option_tokens")


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(float(x))


def _fmt(x: float | int) -> str:
    return str(x) if _is_int(x) else format(float(x), "g")


def _got(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


@dataclasses.dataclass(frozen=True)
class Limit:
    """The range of one numeric parameter.

    ``integer``: integers only (else any finite number); ``[low, high]`` inclusive unless
    ``low_open``; ``high_key``: a context key whose value (minus ``high_offset``) replaces
    ``high`` when given; ``off``: a value outside the range that is also allowed (top-k -1,
    temperature 0), described by ``off_label``.
    """

    name: str
    default: Any
    low: float
    high: float
    integer: bool = False
    low_open: bool = False
    high_key: str | None = None
    high_offset: int = 0
    off: float | None = None
    off_label: str = ""

    def upper(self, context: Mapping[str, Any] | None = None) -> float:
        """The upper bound with ``context`` (the static ``high`` without it)."""
        if self.high_key is not None and context and context.get(self.high_key) is not None:
            return min(self.high, int(context[self.high_key]) - self.high_offset)
        return self.high

    def describe(self, context: Mapping[str, Any] | None = None) -> str:
        """The allowed values in words: ``"-1 (off) or an integer in [1, 2147483647]"``."""
        kind = "an integer" if self.integer else "a number"
        left = "(" if self.low_open else "["
        text = f"{kind} in {left}{_fmt(self.low)}, {_fmt(self.upper(context))}]"
        if self.off is not None:
            text = f"{_fmt(self.off)} ({self.off_label}) or {text}"
        return text

    def problem(self, value: Any, context: Mapping[str, Any] | None = None) -> str | None:
        """None if ``value`` is allowed, else ``"must be <range> (got <value>)"``."""
        ok_type = _is_int(value) if self.integer else _is_num(value)
        if ok_type:
            if self.off is not None and value == self.off:
                return None
            high = self.upper(context)
            above_low = value > self.low if self.low_open else value >= self.low
            if above_low and value <= high:
                return None
        return f"must be {self.describe(context)} (got {_got(value)})"


MAX_NEW_TOKENS = Limit("max_new_tokens", 128, 0, INT32_MAX, integer=True,
                       high_key="max_length")
TEMPERATURE = Limit("temperature", 1.0, MIN_TEMPERATURE, MAX_TEMPERATURE, off=0,
                    off_label="greedy")
TOP_P = Limit("top_p", 1.0, 0.0, 1.0, low_open=True)
TOP_K = Limit("top_k", -1, 1, INT32_MAX, integer=True, off=-1, off_label="off")
MIN_P = Limit("min_p", 0.0, 0.0, 1.0)
N = Limit("n", 1, 1, INT32_MAX, integer=True, high_key="max_batch")
SEED = Limit("seed", None, 0, SEED_MAX, integer=True)
STOP_TOKEN_ID = Limit("stop_token_ids", None, 0, INT32_MAX, integer=True,
                      high_key="vocab_size", high_offset=1)
LOGPROB_START_LEN = Limit("logprob_start_len", None, -1, INT32_MAX, integer=True)
OPTION_COUNT = Limit("option_count", None, 1, INT32_MAX, integer=True, high_key="option_tokens")

#: every numeric limit by parameter name
LIMITS = {lim.name: lim for lim in (MAX_NEW_TOKENS, TEMPERATURE, TOP_P, TOP_K, MIN_P, N, SEED,
                                     STOP_TOKEN_ID, LOGPROB_START_LEN, OPTION_COUNT)}


def stop_token_ids_problem(ids: Any, context: Mapping[str, Any] | None = None) -> str | None:
    """None if ``ids`` (a list of integers) fits, else one phrase: too many distinct ids for
    ``max_stop_ids``, or the ids outside ``[0, vocab_size)``."""
    if not isinstance(ids, list):
        return f"must be a list of integers (got {_got(ids)})"
    limit = (context or {}).get("max_stop_ids")
    distinct = len(set(ids)) if all(_is_int(t) for t in ids) else len(ids)
    if limit is not None and distinct > limit:
        return f"must hold at most {limit} distinct ids (got {distinct})"
    bad = [t for t in ids if STOP_TOKEN_ID.problem(t, context) is not None]
    if bad:
        shown = ", ".join(_got(t) for t in bad[:5]) + (", ..." if len(bad) > 5 else "")
        return (f"must be integers in [0, {_fmt(STOP_TOKEN_ID.upper(context))}] "
                f"(got {shown})")
    return None


def stop_problem(stop: Any) -> str | None:
    """None if ``stop`` (a list of strings) fits, else one phrase naming the limit."""
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        return f"must be a string or a list of strings (got {_got(stop)})"
    if len(stop) > MAX_STOP_STRINGS:
        return f"must hold at most {MAX_STOP_STRINGS} strings (got {len(stop)})"
    for s in stop:
        if not 1 <= len(s) <= MAX_STOP_CHARS:
            return (f"strings must have 1 to {MAX_STOP_CHARS} characters (got one of "
                    f"{len(s)})")
    return None


__all__ = ["Limit", "LIMITS", "MAX_NEW_TOKENS", "TEMPERATURE", "TOP_P", "TOP_K", "MIN_P", "N",
           "SEED", "STOP_TOKEN_ID", "LOGPROB_START_LEN", "INT32_MAX", "SEED_MAX",
           "MIN_TEMPERATURE", "MAX_TEMPERATURE", "MAX_STOP_STRINGS", "MAX_STOP_CHARS",
           "CONTEXT_KEYS", "stop_token_ids_problem", "stop_problem"]
