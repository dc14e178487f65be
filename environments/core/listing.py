"""Valid actions listed for a session (the servers' ``list_actions`` and ``action_text``
fields, docs/ENVIRONMENTS.md): whether a result gets a list, and the result with it."""

from __future__ import annotations

import dataclasses
from typing import TypeVar

from environments.core.base import ResetResult, StepResult, action_list_text
from environments.core.sessions import Session

R = TypeVar("R", ResetResult, StepResult)


def wants_list(session: Session) -> bool:
    """The session asked for action lists, its episode runs, and its observations lack one."""
    return bool(session.list_actions) and not session.finished and not session.env.lists_actions_in_observation


def with_action_list(result: R, actions: list[str] | None, limit: int, text: bool = True) -> R:
    """``result`` with the listed actions (the first ``limit``) in ``info["listed_actions"]`` and,
    when ``text``, ``action_list_text(actions, limit)`` as the observation's last line; unchanged
    where ``actions`` is None or empty (the family has no list, or nothing is valid)."""
    if not actions or limit <= 0:
        return result
    info = dict(result.info)
    info["listed_actions"] = list(actions[:limit])
    observation = (f"{result.observation.rstrip()}\n{action_list_text(actions, limit)}" if text
                   else result.observation)
    return dataclasses.replace(result, observation=observation, info=info)
