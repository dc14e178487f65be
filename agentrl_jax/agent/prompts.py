"""System prompts: the environment's own instructions wrapped in a ReAct answer format."""

from __future__ import annotations

REACT_FORMAT = (
    "Each turn, first think briefly, then give exactly one action, in this format:\n"
    "Thought: <one or two sentences of reasoning>\n"
    "Action: <the action>\n"
    "Give only one Action line per turn; the environment answers with what happened next.")


ACTION_FORMAT = (
    "Each turn, reply with exactly one action, in this format:\n"
    "Action: <the action>\n"
    "For example:\nAction: turn left")

# Answer formats by name (config ``agent.prompt_style``): ``react`` (reason, then act) and
# ``action`` (act only; suits small models, often with ``agent.response_prefix = "Action:"``).
ANSWER_FORMATS = {"react": REACT_FORMAT, "action": ACTION_FORMAT}


def system_prompt(instructions: str, env_name: str | None = None, style: str = "react") -> str:
    """The system message of an episode.

    instructions: the environment's description of its task and action syntax (``info`` of
    ``/create``); the answer format (``ANSWER_FORMATS[style]``) tells the model how to answer.
    """
    if style not in ANSWER_FORMATS:
        raise KeyError(f"unknown prompt style {style!r} (known: {sorted(ANSWER_FORMATS)})")
    head = f"You are an agent acting in the {env_name} environment.\n" if env_name else ""
    return f"{head}{instructions.strip()}\n\n{ANSWER_FORMATS[style]}"


def first_user_message(observation: str) -> str:
    return observation.strip()
