"""System prompts: the environment's own instructions followed by an answer format.

``action`` (the default, ``training/config/experiment.py``): one ``Action:`` line per turn; with
``agent.response_prefix = "Action:"`` the model only completes the action, which the default
SmolLM2-135M-Instruct does (``benchmarks/analysis/action_format.py``, docs/RESULTS.md). ``react``: a
``Thought:`` line, then an ``Action:`` line, for models that can follow it
(``training.config.experiment.use_react``).
"""

from __future__ import annotations

import dataclasses

from agentrl_common.registry import Registry
from environments.registry import FAMILIES, get_family

REACT_FORMAT = (
    "Each turn, first think briefly, then give exactly one action, in this format:\n"
    "Thought: <one or two sentences of reasoning>\n"
    "Action: <the action>\n"
    "Give only one Action line per turn; the environment answers with what happened next.")


ACTION_FORMAT = (
    "Each turn, reply with exactly one action, in this format:\n"
    "Action: <the action>")

CHOICE_FORMAT = (
    "Each turn, choose one of the listed options and reply with its letter, in this format:\n"
    "Action: <letter>")


@dataclasses.dataclass(frozen=True)
class PromptStyle:
    """An answer format: ``text`` ends the system prompt; ``action_example``: append the
    family's example action (its registry entry's ``action_example``) after it."""

    text: str
    action_example: bool = False


#: answer formats by name (config ``agent.prompt_style``): ``react`` (reason, then act) and
#: ``action`` (act only; suits small models, often with ``agent.response_prefix = "Action:"``)
PROMPT_STYLES: Registry[PromptStyle] = Registry("prompt style", expected=PromptStyle)
PROMPT_STYLES.register("react", PromptStyle(REACT_FORMAT))
PROMPT_STYLES.register("action", PromptStyle(ACTION_FORMAT, action_example=True))
#: ``choice``: the letter of a listed option (with ``rollout.parser = "choice"``)
PROMPT_STYLES.register("choice", PromptStyle(CHOICE_FORMAT))

def action_example(env_name: str | None) -> str | None:
    """The example action of family ``env_name`` (its registry entry's ``action_example``);
    None for a family without one or a name that is not a registered family. Small models copy
    the example, so it is an action of that family (with BabyAI's "turn left" as the example for
    every family, TextCraft accepted 4% of SmolLM2's actions)."""
    if not env_name or env_name not in FAMILIES:
        return None
    return get_family(env_name).action_example


def answer_format(style: str, env_name: str | None = None) -> str:
    """The answer-format paragraph of ``style`` (:data:`PROMPT_STYLES`) for ``env_name``;
    ``UnknownNameError`` (a ``ValueError``) for an unregistered style."""
    entry = PROMPT_STYLES.get(style)
    text = entry.text
    example = action_example(env_name) if entry.action_example else None
    if example:
        text += f"\nFor example:\nAction: {example}"
    return text


def system_prompt(instructions: str, env_name: str | None = None, style: str = "react") -> str:
    """The system message of an episode.

    instructions: the environment's description of its task and action syntax (``info`` of
    ``/create``); the answer format (``PROMPT_STYLES.get(style)``) tells the model how to answer.
    """
    head = f"You are an agent acting in the {env_name} environment.\n" if env_name else ""
    return f"{head}{instructions.strip()}\n\n{answer_format(style, env_name)}"


def first_user_message(observation: str) -> str:
    return observation.strip()


def windowed_first_message(first_user: str, omitted: int) -> str:
    """The first user message of a prompt whose history window (``agent.history_turns``) has
    dropped ``omitted`` turns: the message itself (the task), then one line saying so."""
    if omitted <= 0:
        return first_user
    turns = "turn" if omitted == 1 else "turns"
    return f"{first_user}\n\n({omitted} earlier {turns} omitted)"
