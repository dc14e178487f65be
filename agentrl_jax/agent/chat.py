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
"""

from __future__ import annotations

from typing import Any

_PLACEHOLDER = "\u2063AGENTRL_ASSISTANT_PLACEHOLDER\u2063"
_OBSERVATION_MARKER = "\u2063AGENTRL_OBSERVATION\u2063"
_PROBES = ("probe observation", "  two lines\nof {text} with 'quotes' and <tags>  ")


class ChatFormatter:
    """Renders chat messages into token ids with a HF tokenizer's chat template."""

    def __init__(self, tokenizer: Any, eos_token_ids: tuple[int, ...] | None = None):
        self.tokenizer = tokenizer
        if eos_token_ids is None:
            eos = tokenizer.eos_token_id
            eos_token_ids = () if eos is None else (eos,)
        self.eos_token_ids = tuple(eos_token_ids)
        self._suffix_parts: dict[str | None, tuple[str, str] | None] = {}

    def _render(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)

    def encode_text(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(self, system: str | None, user: str) -> list[int]:
        """Ids of ``[system, user]`` followed by the assistant generation prompt."""
        messages = ([{"role": "system", "content": system}] if system else [])
        messages.append({"role": "user", "content": user})
        return self.encode_text(self._render(messages, add_generation_prompt=True))

    def observation_ids(self, system: str | None, observation: str,
                        generated_ids: list[int]) -> list[int]:
        """Ids to append after an assistant turn ``generated_ids`` to add a user ``observation``
        and open the next assistant turn.

        If the assistant turn ended with an EOS id (the template's end-of-turn token), the
        template's own end-of-turn text is not repeated.
        """
        suffix = self._observation_suffix(system, observation)
        if generated_ids and generated_ids[-1] in self.eos_token_ids:
            eos_text = self.tokenizer.decode([generated_ids[-1]], skip_special_tokens=False)
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
            parts = self._render_suffix(system, _OBSERVATION_MARKER).split(_OBSERVATION_MARKER)
            fast = None
            if len(parts) == 2:
                before, after = parts
                if all(self._render_suffix(system, p) == before + p + after for p in _PROBES):
                    fast = (before, after)
            if len(self._suffix_parts) > 64:
                self._suffix_parts.clear()
            self._suffix_parts[system] = fast
        fast = self._suffix_parts[system]
        if fast is None:
            return self._render_suffix(system, observation)
        return fast[0] + observation + fast[1]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)
