"""Whether a run's first turn has room to generate, checked before anything starts.

An episode's first prompt is the chat template around the system prompt (``"You are an agent
acting in the <env> environment."``, the environment's instructions, the answer format of
``agent.prompt_style``) and the first observation, followed by ``agent.response_prefix``
(``agent/episode.py``). When that prompt leaves fewer than ``MIN_NEW_TOKENS`` of
``rollout.max_context`` to generate, every episode ends with ``context_limit`` before its
first turn: no step has a token to train on. The instructions and the observation come from
the environment servers, which are not started yet, so the check uses a lower bound:

    floor = tokens(template(system prompt without instructions, empty observation))
            - MERGE_SLACK + tokens(agent.response_prefix)

``MERGE_SLACK`` allows for tokens the byte-pair merges at the two places where the
environment's text goes could save; every real first prompt is at least ``floor`` tokens
(checked against the real BabyAI and TextCraft prompts in ``tests/test_run_checks.py``). A run
is refused when ``floor + MIN_NEW_TOKENS > rollout.max_context`` for any of its environments.
"""

from __future__ import annotations

from typing import Any

from agentrl_jax.agent.episode import MIN_NEW_TOKENS

#: tokens the merges at the two insertion points (instructions, observation) may save
MERGE_SLACK = 4


def first_prompt_floor(formatter: Any, env_name: str, prompt_style: str,
                       response_prefix: str) -> int:
    """A lower bound on the first prompt's tokens of an ``env_name`` episode (module
    docstring); ``formatter``: an ``agent.chat.ChatFormatter``."""
    from agentrl_jax.agent.prompts import system_prompt

    skeleton = formatter.prompt_ids(system_prompt("", env_name, prompt_style), "")
    prefix = formatter.encode_text(response_prefix) if response_prefix else []
    return max(len(skeleton) - MERGE_SLACK, 0) + len(prefix)


def prompt_room_problems(env_names: list[str], prompt_style: str, response_prefix: str,
                         max_context: int, tokenizer: Any) -> list[str]:
    """One line per environment whose first turn cannot fit ``max_context`` tokens (the
    floor of :func:`first_prompt_floor` plus ``MIN_NEW_TOKENS`` to generate); []."""
    from agentrl_jax.agent.chat import ChatFormatter

    formatter = ChatFormatter(tokenizer)
    prefix_tokens = len(formatter.encode_text(response_prefix)) if response_prefix else 0
    out = []
    for name in env_names:
        floor = first_prompt_floor(formatter, name, prompt_style, response_prefix)
        if floor + MIN_NEW_TOKENS > max_context:
            out.append(
                f"rollout.max_context: {max_context} tokens leave no room for the first turn of "
                f"{name}: its first prompt takes at least {floor} tokens (system prompt and "
                f"chat template {floor - prefix_tokens}, agent.response_prefix {prefix_tokens}) "
                f"before the instructions and the observation, and a turn needs "
                f"{MIN_NEW_TOKENS} more to generate; every episode would end with "
                f"context_limit before its first turn")
    return out


def run_prompt_problems(model: Any, env: Any, agent: Any, rollout: Any) -> list[str]:
    """:func:`prompt_room_problems` of a run's valid ``model``, ``env``, ``agent`` and
    ``rollout`` sections, with the tokenizer of ``model.name`` (loaded here: seconds the
    first time for a GGUF file, then cached). A tokenizer that cannot be loaded is left to
    the model check (no line here)."""
    from agentrl_jax.models.pretrained import resolve_model_path
    from agentrl_jax.models.tokenizer import load_tokenizer

    try:
        tokenizer = load_tokenizer(resolve_model_path(model.name))
    except Exception:  # noqa: BLE001  (the model check says what is wrong with the source)
        return []
    return prompt_room_problems(env.name_list, agent.prompt_style, agent.response_prefix,
                                rollout.max_context, tokenizer)
