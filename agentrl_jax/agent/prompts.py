"""System prompts: the environment's own instructions wrapped in a ReAct answer format."""

from __future__ import annotations

REACT_FORMAT = (
    "Each turn, first think briefly, then give exactly one action, in this format:\n"
    "Thought: <one or two sentences of reasoning>\n"
    "Action: <the action>\n"
    "Give only one Action line per turn; the environment answers with what happened next.")


def system_prompt(instructions: str, env_name: str | None = None) -> str:
    """The system message of an episode.

    instructions: the environment's description of its task and action syntax (``info`` of
    ``/create``); the ReAct format tells the model how to answer.
    """
    head = f"You are an agent acting in the {env_name} environment.\n" if env_name else ""
    return f"{head}{instructions.strip()}\n\n{REACT_FORMAT}"


def first_user_message(observation: str) -> str:
    return observation.strip()
