"""Shortest primitive-action paths for the BabyAI macro actions (BFS over position x direction).

Planning uses only cells the agent has SEEN during the episode (unseen cells count as blocked),
with their current content from the world grid (objects never move unless the agent moves them,
so a seen cell's content is what the agent knows). A macro therefore never exploits knowledge of
unexplored rooms; when the only way to a visible object leads through unseen cells the macro
reports that no path is known and the agent must explore with primitive actions.
"""

from __future__ import annotations

import collections
from typing import Any, Callable

from environments.babyai.view import DIR_TO_VEC

LEFT, RIGHT, FORWARD = 0, 1, 2  # minigrid's action numbers


def passable(obj: Any) -> bool:
    """Can the agent step onto a cell holding ``obj``? (lava is avoided although enterable)"""
    if obj is None:
        return True
    if obj.type == "lava":
        return False
    return bool(obj.can_overlap())


def plan_to_face(
    start: tuple[int, int],
    direction: int,
    target: tuple[int, int],
    can_enter: Callable[[int, int], bool],
) -> list[int] | None:
    """Primitive actions that end next to ``target`` facing it; ``None`` if no known path.

    can_enter(x, y): whether the agent may stand on that cell.
    """
    tx, ty = target
    start_state = (start[0], start[1], direction)
    parents: dict[tuple[int, int, int], tuple[tuple[int, int, int], int] | None] = {start_state: None}
    queue = collections.deque([start_state])
    while queue:
        state = queue.popleft()
        x, y, d = state
        dx, dy = DIR_TO_VEC[d]
        if (x + dx, y + dy) == (tx, ty):
            return _unwind(parents, state)
        for action, nxt in (
            (LEFT, (x, y, (d - 1) % 4)),
            (RIGHT, (x, y, (d + 1) % 4)),
            (FORWARD, (x + dx, y + dy, d)),
        ):
            if nxt in parents:
                continue
            if action == FORWARD and not can_enter(nxt[0], nxt[1]):
                continue
            parents[nxt] = (state, action)
            queue.append(nxt)
    return None


def _unwind(parents: dict, state: tuple[int, int, int]) -> list[int]:
    actions = []
    link = parents[state]
    while link is not None:
        state, action = link
        actions.append(action)
        link = parents[state]
    actions.reverse()
    return actions
