"""Action parsing: turn the model's reply into one environment action, or explain why not.

Parsers are registered by name in ``PARSERS`` (an ``agentrl_common.registry.Registry``) and chosen
from config (``rollout.parser``). ``react`` (default) takes the text after
the last ``Action:`` marker, up to the end of that line; ``raw`` takes the whole reply;
``choice`` reads the reply's first letter as the label of one of the environment's valid
actions, listed as options after each observation. A reply without a parsable action is an
*invalid turn*: the environment is not stepped, the agent gets ``INVALID_FORMAT_FEEDBACK`` as the
next observation, and the turn counts toward the horizon.
"""

from __future__ import annotations

import dataclasses
import re
import zlib
from typing import Callable, Sequence

from agentrl_common.registry import Registry

# The same text for every prompt style (``react`` answers end with the Action line too).
INVALID_FORMAT_FEEDBACK = ("Invalid response: no action found. Reply with one 'Action: ...' line "
                           "naming one action.")
MAX_ACTION_CHARS = 512


@dataclasses.dataclass(frozen=True)
class ParsedAction:
    action: str | None  # None: no valid action in the reply
    error: str | None = None
    option: int | None = None  # a multiple-choice reply: the index of the option it named


_ACTION_RE = re.compile(r"action\s*:\s*(.*)", re.IGNORECASE)


def parse_react(text: str) -> ParsedAction:
    """``Thought: ... Action: go to red ball 1`` -> ``go to red ball 1``.

    The last ``Action:`` wins; surrounding quotes, backticks and brackets around the whole action
    are removed; the action ends at the line end. Empty or over-long actions are invalid.
    """
    matches = list(_ACTION_RE.finditer(text))
    if not matches:
        return ParsedAction(None, "no 'Action:' line")
    action = matches[-1].group(1).strip().splitlines()[0].strip() if matches[-1].group(1).strip() \
        else ""
    action = action.strip("`\"' ").rstrip(".").strip("`\"' ")
    if not action:
        return ParsedAction(None, "empty action")
    if len(action) > MAX_ACTION_CHARS:
        return ParsedAction(None, f"action longer than {MAX_ACTION_CHARS} characters")
    return ParsedAction(action)


def parse_raw(text: str) -> ParsedAction:
    """The whole reply, stripped, is the action (for tool-tag environments such as deep search)."""
    action = text.strip()
    return ParsedAction(action) if action else ParsedAction(None, "empty reply")


# Labels of listed options, in order: "a" names the first option.
CHOICE_LABELS = "abcdefghijklmnopqrstuvwxyz"


def options_block(options: Sequence[str]) -> str:
    """``["turn left", "go to red ball 1"]`` -> ``"Options: a) turn left, b) go to red ball 1"``
    (the first ``len(CHOICE_LABELS)`` options; more cannot be named)."""
    shown = options[:len(CHOICE_LABELS)]
    return "Options: " + ", ".join(f"{CHOICE_LABELS[i]}) {o}" for i, o in enumerate(shown))


def option_order(options: Sequence[str], seed: int) -> list[int]:
    """The order ``agent.shuffle_options`` shows ``options`` in: a permutation ``p`` of
    ``range(n)`` (``n = len(options)``); shown option ``k`` is ``options[p[k]]``.

    Formula (CRC-32 of UTF-8 bytes, ``zlib.crc32(data, start)``; stable across processes and
    Python versions, unlike the salted ``hash()``)::

        salt = crc32("\x1f".join(options), seed mod 2**32)
        key_i = crc32(options[i], salt)
        p = the indices i sorted by (key_i, i)

    So the order is a function of the seed and the whole option list (its strings and their
    order) alone: every episode that lists the same options under the same seed sees the same
    order, and another list (or seed) gets an unrelated one. E.g. ``option_order(["turn
    left", "turn right", "go forward"], 0) == [1, 2, 0]``."""
    salt = zlib.crc32("\x1f".join(options).encode("utf-8"), int(seed) & 0xFFFFFFFF)
    keys = [zlib.crc32(str(o).encode("utf-8"), salt) for o in options]
    return sorted(range(len(options)), key=lambda i: (keys[i], i))


def shuffled_options(options: Sequence[str], seed: int) -> list[str]:
    """``options`` in the order :func:`option_order` gives them (``[n]`` -> ``[n]``)."""
    return [options[i] for i in option_order(options, seed)]


def parse_choice(text: str, options: Sequence[str] = ()) -> ParsedAction:
    """Multiple choice: the first character of the reply (the text after the last ``Action:``
    marker, stripped) is the label of one of ``options`` (``options_block``; ``a`` is the
    first, case-insensitive), and that option is the action; the rest of the reply is ignored.

    So every reply that starts with a letter in ``a`` .. the last label is one of the valid
    actions: an untrained model, whose replies are random tokens, picks among the options at
    random (with the frequencies of first letters in its vocabulary) and learns by RL which to
    pick. A reply that starts with no letter, or with a letter past the last option, is invalid.
    The episode shows the options after each observation (its parser ``takes_options``).
    """
    matches = list(_ACTION_RE.finditer(text))
    reply = (matches[-1].group(1) if matches else text).strip()
    if not options:
        return ParsedAction(None, "no options were listed")
    if not reply:
        return ParsedAction(None, "empty reply")
    label = reply[0].lower()
    index = CHOICE_LABELS.find(label) if label.isascii() else -1
    count = min(len(options), len(CHOICE_LABELS))
    if index < 0:
        return ParsedAction(None, f"the reply starts with {reply[0]!r}, not an option letter")
    if index >= count:
        return ParsedAction(None, f"no option {label!r} (options a to {CHOICE_LABELS[count - 1]})")
    return ParsedAction(options[index], option=index)


parse_choice.takes_options = True  # type: ignore[attr-defined]

#: name -> ``parse(reply text[, options]) -> ParsedAction`` (config ``rollout.parser``)
PARSERS: Registry[Callable[..., ParsedAction]] = Registry("action parser")
PARSERS.register("react", parse_react)
PARSERS.register("raw", parse_raw)
PARSERS.register("choice", parse_choice)


def takes_options(parser: Callable[..., ParsedAction]) -> bool:
    """Whether ``parser`` reads a reply against listed options (``parse_choice``): the episode
    then shows them after each observation and passes them with the reply."""
    return bool(getattr(parser, "takes_options", False))


def get_parser(name: str) -> Callable[..., ParsedAction]:
    """The parser registered as ``name``; ``UnknownNameError`` (a ``ValueError``) otherwise."""
    return PARSERS.get(name)
