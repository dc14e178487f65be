"""Text rendering of the BabyAI agent view and the names of visible objects.

Objects are named ``<color> <type> <n>`` where ``n`` numbers the visible objects of the same
color and type from the nearest (``1``) outwards; the macro actions use the same names.
"""

from __future__ import annotations

import functools
from typing import Any, Iterable, NamedTuple

from environments.babyai.view import SeenCell

OBJECT_TYPES = ("key", "ball", "box", "door", "goal", "lava")
PICKABLE = ("key", "ball", "box")


class VisibleObject(NamedTuple):
    name: str  # "red ball 1"
    kind: str  # "ball"
    color: str
    x: int
    y: int
    forward: int
    right: int
    state: str  # "open" / "closed" / "locked" for doors, "" otherwise


def _steps(n: int, word: str) -> str:
    return f"{n} step{'s' if n != 1 else ''} {word}"


@functools.lru_cache(maxsize=None)
def relative_position(forward: int, right: int) -> str:
    """``2 steps forward and 1 step left`` (``right`` < 0 means left)."""
    parts = []
    if forward:
        parts.append(_steps(forward, "forward"))
    if right:
        parts.append(_steps(abs(right), "right" if right > 0 else "left"))
    return " and ".join(parts) if parts else "right here"


def visible_objects(seen: Iterable[SeenCell]) -> list[VisibleObject]:
    """The objects among ``seen`` cells (not the agent's own cell), nearest first, numbered."""
    cells = [
        c
        for c in seen
        if c.obj is not None and getattr(c.obj, "type", None) in OBJECT_TYPES and (c.forward or c.right)
    ]
    cells.sort(key=lambda c: (c.forward + abs(c.right), c.forward, c.right))
    counts: dict[tuple[str, str], int] = {}
    objects = []
    for c in cells:
        key = (c.obj.color, c.obj.type)
        counts[key] = counts.get(key, 0) + 1
        state = ""
        if c.obj.type == "door":
            state = "locked" if c.obj.is_locked else "open" if c.obj.is_open else "closed"
        objects.append(
            VisibleObject(f"{c.obj.color} {c.obj.type} {counts[key]}", c.obj.type, c.obj.color, c.x, c.y, c.forward, c.right, state)
        )
    return objects


def describe_object(obj: VisibleObject) -> str:
    words = f"{obj.state} {obj.color} {obj.kind}" if obj.state else f"{obj.color} {obj.kind}"
    article = "an" if words[0] in "aeiou" else "a"
    return f"{article} {words} ({obj.name}) {relative_position(obj.forward, obj.right)}"


def _blocking(cell: SeenCell | None) -> str | None:
    """What blocks the agent in ``cell`` ('wall', 'closed door', an object) or None."""
    if cell is None:
        return None
    obj = cell.obj
    if obj is None:
        return None
    if isinstance(obj, str) or obj.type == "wall":
        return "a wall"
    if obj.type == "door":
        return None if obj.is_open else f"a {'locked' if obj.is_locked else 'closed'} {obj.color} door"
    if obj.can_overlap():
        return None
    return f"a {obj.color} {obj.type}"


def describe(mission: str, seen: list[SeenCell], objects: list[VisibleObject], carrying: Any) -> str:
    """The observation text (without the list of available actions)."""
    by_offset = {(c.forward, c.right): c for c in seen}
    lines = [f"Your goal: {mission}"]
    if objects:
        lines.append("You see " + "; ".join(describe_object(o) for o in objects) + ".")
    else:
        lines.append("You see no objects.")

    walls = [side for side, offset in (("on your left", (0, -1)), ("on your right", (0, 1))) if _is_wall(by_offset.get(offset))]
    if walls:
        lines.append(f"There is a wall {' and '.join(walls)}.")

    # first blocking cell straight ahead (absent cells there are empty: see view.agent_view)
    ahead = None
    for distance in range(1, max((c.forward for c in seen), default=0) + 1):
        ahead = _blocking(by_offset.get((distance, 0)))
        if ahead:
            break
    if ahead:
        where = "right in front of you" if distance == 1 else f"{distance} steps ahead"
        lines.append(f"You are facing {ahead} {where}.")
    else:
        lines.append("The way ahead is clear as far as you can see.")

    lines.append(f"You are carrying a {carrying.color} {carrying.type}." if carrying is not None else "You are not carrying anything.")
    return "\n".join(lines)


def _is_wall(cell: SeenCell | None) -> bool:
    return cell is not None and (isinstance(cell.obj, str) or getattr(cell.obj, "type", None) == "wall")
