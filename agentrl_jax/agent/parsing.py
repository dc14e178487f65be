"""Action parsing: turn the model's reply into one environment action, or explain why not.

Parsers are registered by name in ``PARSERS`` (an ``agentrl_common.registry.Registry``) and chosen
from config (``rollout.parser``). ``react`` (default) takes the text after
the last ``Action:`` marker, up to the end of that line. A reply without a parsable action is an
*invalid turn*: the environment is not stepped, the agent gets ``INVALID_FORMAT_FEEDBACK`` as the
next observation, and the turn counts toward the horizon.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable

from agentrl_common.registry import Registry

# The same text for every prompt style (``react`` answers end with the Action line too).
INVALID_FORMAT_FEEDBACK = ("Invalid response: no action found. Reply with one 'Action: ...' line "
                           "naming one action.")
MAX_ACTION_CHARS = 512


@dataclasses.dataclass(frozen=True)
class ParsedAction:
    action: str | None  # None: no valid action in the reply
    error: str | None = None


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


#: name -> ``parse(reply text) -> ParsedAction`` (config ``rollout.parser``)
PARSERS: Registry[Callable[[str], ParsedAction]] = Registry("action parser")
PARSERS.register("react", parse_react)
PARSERS.register("raw", parse_raw)


def get_parser(name: str) -> Callable[[str], ParsedAction]:
    """The parser registered as ``name``; ``UnknownNameError`` (a ``ValueError``) otherwise."""
    return PARSERS.get(name)
