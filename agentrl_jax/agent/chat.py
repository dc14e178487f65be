"""Token-exact multi-turn chat: prompt ids once, then observation ids appended turn by turn.

A trajectory's ids are exactly ``prompt_ids + gen_1 + obs_1 + gen_2 + obs_2 + ...`` where
``gen_k`` are the ids the engine produced (never decoded and re-encoded) and ``obs_k`` are the ids
that the model's own chat template puts between the end of an assistant turn and the start of the
next assistant turn: the end-of-turn marker (unless the model already generated it), the user
message holding the observation, and the generation prompt.

The observation ids are found with the template itself: render a conversation whose last
assistant message is a unique placeholder followed by the new user message; everything after the
placeholder is the suffix. This works for any template (ChatML, Llama-3, Qwen, ...); nothing is
hard-coded.

Tokenising is the largest host cost of a turn (docs/PERFORMANCE.md, "Host cost of a turn"), so
text is encoded by ``SegmentEncoder`` where the tokenizer allows it: a HF fast tokenizer splits
text at its added (special) tokens *first* and encodes each piece between them on its own, so
``encode(text)`` is the concatenation of the pieces' encodings. The encoder does that split
itself and caches the pieces (the system prompt, ``"assistant\n"``, repeated observations), so
only new text is run through BPE. It is used only when the split provably matches (no added
token strips whitespace or needs a word boundary, probe texts encode identically); otherwise the
tokenizer's own ``encode`` runs, as before. The first prompt is likewise built from the template
rendered once per system prompt (checked on probe texts, as the observation suffix is).

Where the tokenizer's pre-tokenizer is GPT-2's byte-level regex (SmolLM2's), the encoder also
cuts each piece before every line break that follows a printable ASCII character: no
pre-token spans such a point, so each line encodes on its own, and the cache holds lines. An
observation then reaches BPE only for the lines it has not shown before (BabyAI's observations
repeat most of their lines from turn to turn and across the samples of a group).
"""

from __future__ import annotations

import collections
import json
import re
from typing import Any

_PLACEHOLDER = "\u2063AGENTRL_ASSISTANT_PLACEHOLDER\u2063"
_OBSERVATION_MARKER = "\u2063AGENTRL_OBSERVATION\u2063"
_PROBES = ("probe observation", "  two lines\nof {text} with 'quotes' and <tags>  ")


_ENCODER_PROBES = (
    "plain words and 12345 digits", " leading space", "trailing space ", "\n\nnew\nlines\n",
    "<|im_start|>user\nhi<|im_end|>\n", "x<|im_end|><|im_start|>y", "\u00e9\u4e2d\U0001f600 'quoted' <tag>",
    "Action: turn left\n", "  \t mixed   whitespace  ",
    "line one.\nline two\n\n  indented 42\nx \ny\t\nz\r\nend's\n'quote'\n")

#: a line break after a printable ASCII character: a GPT-2 byte-level pre-tokenizer always
#: cuts there (no alternative of its regex holds a non-space character followed by whitespace,
#: and what it matches from the line break on depends only on the text from there)
_LINE_CUT = re.compile(r"(?<=[!-~])(?=\n)")


def cuts_before_line_breaks(backend: Any) -> bool:
    """Whether the HF ``tokenizers.Tokenizer`` ``backend`` encodes text cut at ``_LINE_CUT`` as
    the concatenation of the parts' encodings: no normaliser, a BPE model without dropout and a
    pre-tokenizer that is GPT-2's byte-level regex without an added prefix space, optionally
    after a ``Digits`` split (which never spans a line break). Other pre-tokenizers (the
    Llama-3 and Qwen2 regexes keep punctuation and the line breaks after it together) say
    False."""
    try:  # the components' own state (the whole tokenizer's JSON holds its vocabulary)
        model = backend.model
        plain_bpe = (backend.normalizer is None and type(model).__name__ == "BPE"
                     and not model.dropout)
        pre = json.loads(backend.pre_tokenizer.__getstate__()) if plain_bpe else {}
    except (AttributeError, TypeError, ValueError):
        return False
    if not plain_bpe or not isinstance(pre, dict):
        return False
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else [pre]
    if not steps or not all(isinstance(step, dict) for step in steps):
        return False
    *before, last = steps
    return (all(step.get("type") == "Digits" for step in before)
            and last.get("type") == "ByteLevel" and last.get("use_regex") is True
            and last.get("add_prefix_space") is False)


class SegmentEncoder:
    """``encode(text)`` of a HF fast tokenizer, computed piecewise with a cache.

    A fast tokenizer first cuts ``text`` at its added tokens (matched literally), then
    normalises, pre-tokenises and BPE-encodes each piece between them independently. So
    ``encode(text) == concat(encode(piece) or [added id] for piece in split(text))``; the split
    is done here with one regular expression over the added tokens' contents (longest first, as
    the tokenizer matches them) and each piece's ids are cached (LRU, ``cache_size`` pieces).

    With ``lines`` (``cuts_before_line_breaks``: GPT-2's byte-level pre-tokenizer) each piece
    is also cut at ``_LINE_CUT`` and the cache holds its lines.

    ``build`` returns None when that identity cannot be relied on: not a fast tokenizer, an
    added token with ``lstrip`` / ``rstrip`` / ``single_word`` / ``normalized`` set (they change
    the text around the match), or a probe text that encodes differently.
    """

    def __init__(self, backend: Any, added: dict[str, int], cache_size: int = 32768,
                 lines: bool = False):
        self._backend = backend
        self._added = added
        self.lines = bool(lines)
        pattern = "|".join(re.escape(t) for t in sorted(added, key=len, reverse=True))
        self._split = re.compile(f"({pattern})") if pattern else None
        self._cache: collections.OrderedDict[str, tuple[int, ...]] = collections.OrderedDict()
        self._cache_size = int(cache_size)

    @classmethod
    def build(cls, tokenizer: Any, cache_size: int = 32768) -> SegmentEncoder | None:
        backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer",
                                                                           None)
        decoder = getattr(tokenizer, "added_tokens_decoder", None)
        if backend is None or not hasattr(backend, "encode") or not isinstance(decoder, dict):
            return None
        added: dict[str, int] = {}
        for token_id, token in decoder.items():
            content = getattr(token, "content", None)
            if not isinstance(content, str) or not content:
                return None
            if (getattr(token, "lstrip", True) or getattr(token, "rstrip", True)
                    or getattr(token, "single_word", True) or getattr(token, "normalized", True)):
                return None
            added[content] = int(token_id)
        encoder = cls(backend, added, cache_size, lines=cuts_before_line_breaks(backend))
        for probe in _ENCODER_PROBES:
            if encoder.encode(probe) != list(tokenizer.encode(probe, add_special_tokens=False)):
                return None
        return encoder

    def _piece(self, piece: str) -> tuple[int, ...]:
        cache = self._cache
        ids = cache.get(piece)
        if ids is not None:
            cache.move_to_end(piece)
            return ids
        ids = tuple(self._backend.encode(piece, add_special_tokens=False).ids)
        cache[piece] = ids
        if len(cache) > self._cache_size:
            cache.popitem(last=False)
        return ids

    def _text(self, text: str, out: list[int]) -> None:
        """Appends the ids of ``text`` (no added token in it) to ``out``: its lines' with
        ``lines``, else its own."""
        if not self.lines or "\n" not in text:
            out.extend(self._piece(text))
            return
        for line in _LINE_CUT.split(text):
            out.extend(self._piece(line))

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        if self._split is None:
            if text:
                self._text(text, out)
            return out
        added = self._added
        # re.split with a capturing group alternates text pieces and added-token matches
        for i, piece in enumerate(self._split.split(text)):
            if i % 2:
                out.append(added[piece])
            elif piece:
                self._text(piece, out)
        return out


class ChatFormatter:
    """Renders chat messages into token ids with a HF tokenizer's chat template.

    ``fast=False`` turns off the piecewise encoder and the cached prompt template (every call
    then renders the template and runs the tokenizer on the whole text, the reference path).
    """

    def __init__(self, tokenizer: Any, eos_token_ids: tuple[int, ...] | None = None,
                 fast: bool = True):
        self.tokenizer = tokenizer
        if eos_token_ids is None:
            eos = tokenizer.eos_token_id
            eos_token_ids = () if eos is None else (eos,)
        self.eos_token_ids = tuple(eos_token_ids)
        self.fast = fast
        self._suffix_parts: dict[str | None, tuple[str, str] | None] = {}
        self._prompt_parts: dict[str | None, tuple[str, str] | None] = {}
        self._eos_text: dict[int, str] = {}
        self._encoder = SegmentEncoder.build(tokenizer) if fast else None

    def _render(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)

    def encode_text(self, text: str) -> list[int]:
        if self._encoder is not None:
            return self._encoder.encode(text)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _render_prompt(self, system: str | None, user: str) -> str:
        messages = ([{"role": "system", "content": system}] if system else [])
        messages.append({"role": "user", "content": user})
        return self._render(messages, add_generation_prompt=True)

    def prompt_ids(self, system: str | None, user: str) -> list[int]:
        """Ids of ``[system, user]`` followed by the assistant generation prompt."""
        if not self.fast:
            return self.encode_text(self._render_prompt(system, user))
        if system not in self._prompt_parts:
            if len(self._prompt_parts) > 64:
                self._prompt_parts.clear()
            self._prompt_parts[system] = self._verbatim_parts(
                lambda content: self._render_prompt(system, content))
        parts = self._prompt_parts[system]
        text = (self._render_prompt(system, user) if parts is None
                else parts[0] + user + parts[1])
        return self.encode_text(text)

    @staticmethod
    def _verbatim_parts(render: Any) -> tuple[str, str] | None:
        """``(before, after)`` if ``render(content) == before + content + after`` for every
        probe content (the template inserts the message verbatim), else None."""
        parts = render(_OBSERVATION_MARKER).split(_OBSERVATION_MARKER)
        if len(parts) != 2:
            return None
        before, after = parts
        if all(render(p) == before + p + after for p in _PROBES):
            return before, after
        return None

    def observation_ids(self, system: str | None, observation: str,
                        generated_ids: list[int]) -> list[int]:
        """Ids to append after an assistant turn ``generated_ids`` to add a user ``observation``
        and open the next assistant turn.

        If the assistant turn ended with an EOS id (the template's end-of-turn token), the
        template's own end-of-turn text is not repeated.
        """
        suffix = self._observation_suffix(system, observation)
        if generated_ids and generated_ids[-1] in self.eos_token_ids:
            eos = generated_ids[-1]
            eos_text = self._eos_text.get(eos)
            if eos_text is None:
                eos_text = self.tokenizer.decode([eos], skip_special_tokens=False)
                self._eos_text[eos] = eos_text
            if suffix.startswith(eos_text):
                suffix = suffix[len(eos_text):]
        return self.encode_text(suffix)

    def _render_suffix(self, system: str | None, observation: str) -> str:
        """Template text after an assistant turn, up to the next generation prompt."""
        messages = ([{"role": "system", "content": system}] if system else [])
        messages += [{"role": "user", "content": "x"},
                     {"role": "assistant", "content": _PLACEHOLDER},
                     {"role": "user", "content": observation}]
        text = self._render(messages, add_generation_prompt=True)
        cut = text.find(_PLACEHOLDER)
        if cut < 0:
            raise ValueError("the chat template dropped the assistant message; cannot build "
                             "observation ids")
        return text[cut + len(_PLACEHOLDER):]

    def _observation_suffix(self, system: str | None, observation: str) -> str:
        """``_render_suffix`` without rendering the template every turn.

        Most templates insert the user message verbatim: the suffix is then
        ``before + observation + after``. That is checked once per system prompt on probe
        strings (with newlines, quotes, braces); templates that transform the content fall back
        to rendering every time.
        """
        if system not in self._suffix_parts:
            fast = self._verbatim_parts(lambda content: self._render_suffix(system, content))
            if len(self._suffix_parts) > 64:
                self._suffix_parts.clear()
            self._suffix_parts[system] = fast
        fast = self._suffix_parts[system]
        if fast is None:
            return self._render_suffix(system, observation)
        return fast[0] + observation + fast[1]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)
