"""The BabyAI text environment: minigrid levels driven by text actions.

Actions (case-insensitive):

* primitives: ``turn left``, ``turn right``, ``move forward``, ``pickup``, ``drop``, ``toggle``
  (one minigrid step each);
* macros over visible objects, named as in the observation (``<color> <type> <n>``, ``n``
  defaults to 1): ``go to <color> <type> [n]`` (end next to it, facing it), ``pick up <color>
  <type> [n]`` (go to it, then pickup), ``go through <color> door [n]`` (go to the door, open or
  unlock it with the carried key if needed, and walk through); each expands into minigrid steps by
  BFS over the cells seen so far (see ``planner``);
* ``check available actions``: lists the actions; takes no minigrid step.

Reward and termination are minigrid's: ``1 - 0.9 * steps / max_steps`` on success, 0 otherwise;
``done`` on success or failure, ``truncated`` when the level's step limit is reached. Steps are
counted in minigrid steps, so a macro costs as many steps as its expansion.
"""

from __future__ import annotations

import copy
import hashlib
import re
from typing import Any

from environments.babyai.describe import PICKABLE, VisibleObject, describe, visible_objects
from environments.babyai.levels import make_level, parse_task_id
from environments.babyai.planner import FORWARD, passable, plan_to_face
from environments.babyai.view import DIR_TO_VEC, SeenCell, Sight
from environments.core.base import ResetResult, StepResult, TextEnvironment

PRIMITIVES = {"turn left": 0, "turn right": 1, "move forward": 2, "pickup": 3, "drop": 4, "toggle": 5}
PICKUP, DROP, TOGGLE = 3, 4, 5
ALIASES = {
    "left": "turn left",
    "right": "turn right",
    "forward": "move forward",
    "go forward": "move forward",
    "move ahead": "move forward",
    "pick up": "pickup",
    "pick": "pickup",
    "open": "toggle",
}
CHECK = "check available actions"
# the object number is 1 to 4 ASCII digits: a longer one names no visible object anyway
MACRO_RE = re.compile(r"(go to|pick up|go through) (?:the )?([a-z]+) ([a-z]+)(?: ([0-9]{1,4}))?", re.ASCII)

INSTRUCTIONS = (
    "You are an agent in a grid world of rooms. Each turn, answer with exactly one action.\n"
    "Primitive actions: turn left, turn right, move forward, pickup (the object in front of you), "
    "drop (what you carry, in front of you), toggle (open/close the door or box in front of you; "
    "a locked door opens if you carry a key of its color).\n"
    "Macro actions on objects you see, named as in the observation: go to <color> <object> <n>, "
    "pick up <color> <object> <n>, go through <color> door <n>.\n"
    "check available actions: list the actions available now."
)


def _no_obs() -> dict:
    """Replaces minigrid's per-step image observation, which this text environment never uses."""
    return {}


def _normalize(action: str) -> str:
    text = " ".join(action.strip().lower().replace("_", " ").split()).strip(" .!")
    return ALIASES.get(text, text)


class BabyAIEnv(TextEnvironment):
    """One BabyAI instance; task ids are ``<level id>/seed=<n>`` (see ``catalog``)."""

    name = "babyai"
    lists_actions_in_observation = True  # every observation ends with "Available actions: ..."

    def __init__(self) -> None:
        self._level: str | None = None
        self._env: Any = None
        self._task_id = ""
        self._seen = bytearray()
        self._view: list[SeenCell] = []
        self._objects: list[VisibleObject] = []
        self._ended = False
        self._success = False
        self._actions: list[str] | None = None  # available actions, cached until the next step
        self._sight: Sight | None = None
        # sha256 state of minigrid's ``hash()`` after the grid part (the grid changes only on
        # reset and pickup / drop / toggle): ``state_key`` adds the agent's pose to a copy
        self._grid_hash: Any = None

    def __deepcopy__(self, memo: dict) -> "BabyAIEnv":
        """An independent copy of the episode (a what-if trial of an action: see
        ``macro_expert``); the grid-hash cache, which ``hashlib`` cannot copy, starts empty."""
        clone = type(self).__new__(type(self))
        memo[id(self)] = clone
        for key, value in self.__dict__.items():
            setattr(clone, key, None if key == "_grid_hash" else copy.deepcopy(value, memo))
        return clone

    # -- episode

    def reset(self, task_id: str, seed: int | None = None) -> ResetResult:
        """Start ``task_id``; the layout is fixed by the task's seed (``seed`` is not used)."""
        level, level_seed = parse_task_id(task_id)
        if level != self._level:
            self._env = make_level(level)
            self._env.gen_obs = _no_obs
            self._level = level
        env = self._env
        env.reset(seed=level_seed)
        if self._sight is None or self._sight.env is not env:
            self._sight = Sight(env)
        else:
            self._sight.reset()
        self._task_id = task_id
        self._grid_hash = None
        self._seen = bytearray(env.width * env.height)
        self._ended = self._success = False
        self._look()
        info = self._info(invalid=False)
        info.update(max_steps=int(env.max_steps), mission=env.mission, instructions=INSTRUCTIONS)
        return ResetResult(observation=self._render(), info=info)

    def step(self, action: str) -> StepResult:
        if self._env is None:
            raise RuntimeError("step before reset")
        if self._ended:
            return StepResult(self._render("The episode has ended."), 0.0, True, False, self._info(invalid=True))
        text = _normalize(action)
        reward, terminated, truncated = 0.0, False, False
        invalid = False
        if text in PRIMITIVES:
            feedback = self._primitive_feedback(PRIMITIVES[text])
            reward, terminated, truncated = self._act(PRIMITIVES[text])
        elif text == CHECK:
            feedback = "Available actions: " + ", ".join(self.available_actions()) + "."
        else:
            match = MACRO_RE.fullmatch(text)
            target = self._find(match) if match else None
            if target is None:
                invalid = True
                feedback = (
                    f"'{action.strip()}' is not a valid action here."
                    if match is None
                    else f"You do not see a {match.group(2)} {match.group(3)} {match.group(4) or 1}."
                )
            else:
                feedback, reward, terminated, truncated = self._macro(match.group(1), target)
        self._ended = terminated or truncated
        self._success = self._success or (terminated and reward > 0)
        if truncated and not terminated:
            feedback += " You ran out of steps."
        return StepResult(self._render(feedback), float(reward), bool(terminated), bool(truncated and not terminated), self._info(invalid))

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None
            self._level = None
            self._sight = None

    # -- views

    def valid_actions(self) -> list[str]:
        """``available_actions`` (the observation lists them already)."""
        return self.available_actions()

    def available_actions(self) -> list[str]:
        """Primitive actions that can have an effect now, then macros over the visible objects."""
        if self._actions is not None:
            return list(self._actions)
        env = self._env
        front = self._front()
        actions = ["turn left", "turn right"]
        if passable(front):
            actions.append("move forward")
        if front is not None and env.carrying is None and front.can_pickup():
            actions.append("pickup")
        if env.carrying is not None and front is None:
            actions.append("drop")
        if front is not None and front.type in ("door", "box"):
            actions.append("toggle")
        for obj in self._objects:
            actions.append(f"go to {obj.name}")
            if obj.kind in PICKABLE and env.carrying is None:
                actions.append(f"pick up {obj.name}")
            if obj.kind == "door":
                actions.append(f"go through {obj.name}")
        actions.append(CHECK)
        self._actions = actions
        return list(actions)

    def _look(self) -> None:
        """Recompute what the agent sees and remember the seen cells (for planning)."""
        self._view = self._sight.look(self._seen)
        self._objects = visible_objects(self._view)
        self._actions = None

    def _render(self, feedback: str = "") -> str:
        """The feedback line, the view, and (unless ``action_text`` is off) the available actions."""
        lines = [feedback] if feedback else []
        lines.append(describe(self._env.mission, self._view, self._objects, self._env.carrying))
        if self.action_text:
            lines.append("Available actions: " + ", ".join(self.available_actions()))
        return "\n".join(lines)

    def _info(self, invalid: bool) -> dict[str, Any]:
        return {
            "task_id": self._task_id,
            "success": self._success,
            "steps": int(self._env.step_count),
            "invalid_action": invalid,
            "available_actions": self.available_actions(),
            "state_key": self.state_key(),
        }

    def state_key(self) -> str:
        """Names the simulator state (equal for equal states of one task): minigrid's own
        ``hash()`` of the grid (objects, doors), the agent's position and direction, plus what
        it carries. The step count is not part of it (GiGPO's anchor states, see
        docs/ALGORITHMS.md).

        ``env.hash()`` encodes the whole grid in Python on every call (a third of a server's
        time per step); the grid part of the digest is kept until the grid can change (reset,
        pickup, drop, toggle) and only the agent's pose is hashed per call: the same string
        (tests/test_env_babyai.py checks it against ``env.hash()``)."""
        env = self._env
        if self._grid_hash is None:
            grid_hash = hashlib.sha256()
            grid_hash.update(str(env.grid.encode().tolist()).encode("utf8"))
            self._grid_hash = grid_hash
        digest = self._grid_hash.copy()
        digest.update(str(env.agent_pos).encode("utf8"))
        digest.update(str(env.agent_dir).encode("utf8"))
        carrying = env.carrying
        held = f"{carrying.color} {carrying.type}" if carrying is not None else "-"
        return f"{digest.hexdigest()[:16]}|{held}"

    def _front(self) -> Any:
        env = self._env
        dx, dy = DIR_TO_VEC[env.agent_dir]
        x, y = int(env.agent_pos[0]) + dx, int(env.agent_pos[1]) + dy
        if 0 <= x < env.width and 0 <= y < env.height:
            return env.grid.get(x, y)
        return None

    # -- acting

    def _act(self, action: int, full: bool = True) -> tuple[float, bool, bool]:
        """One minigrid step. ``full=False`` (inside a macro) only records the cells seen; the
        macro calls ``_look`` once at its end."""
        env = self._env
        _, reward, terminated, truncated, _ = env.step(action)
        if action >= PICKUP:  # pickup / drop / toggle may change the cell in front (a door opens)
            self._grid_hash = None
            dx, dy = DIR_TO_VEC[env.agent_dir]
            self._sight.refresh(int(env.agent_pos[0]) + dx, int(env.agent_pos[1]) + dy)
        if full:
            self._look()
        else:
            self._sight.look(self._seen, collect=False)
        return float(reward), bool(terminated), bool(truncated)

    def _primitive_feedback(self, action: int) -> str:
        front, carrying = self._front(), self._env.carrying
        if action == FORWARD and not passable(front):
            return f"You cannot move forward: there is a {front.color} {front.type} in the way." if front.type != "wall" else "You cannot move forward: there is a wall in the way."
        if action == PICKUP and (front is None or not front.can_pickup()):
            return "There is nothing to pick up in front of you."
        if action == PICKUP and carrying is not None:
            return "You are already carrying something."
        if action == DROP and carrying is None:
            return "You are not carrying anything."
        if action == DROP and front is not None:
            return "You cannot drop here: the cell in front of you is not empty."
        if action == TOGGLE and (front is None or front.type not in ("door", "box")):
            return "There is nothing to toggle in front of you."
        return ""

    def _find(self, match: re.Match) -> VisibleObject | None:
        name = f"{match.group(2)} {match.group(3)} {int(match.group(4) or 1)}"
        for obj in self._objects:
            if obj.name == name and (match.group(1) != "go through" or obj.kind == "door"):
                if match.group(1) == "pick up" and obj.kind not in PICKABLE:
                    return None
                return obj
        return None

    def _macro(self, verb: str, target: VisibleObject) -> tuple[str, float, bool, bool]:
        """Expand a macro into primitive steps; returns (feedback, reward, terminated, truncated)."""
        try:
            return self._run_macro(verb, target)
        finally:
            self._look()

    def _run_macro(self, verb: str, target: VisibleObject) -> tuple[str, float, bool, bool]:
        env = self._env
        width, height, seen = env.width, env.height, self._seen
        grid = env.grid

        def can_enter(x: int, y: int) -> bool:
            return 0 <= x < width and 0 <= y < height and seen[y * width + x] == 1 and passable(grid.get(x, y))

        start = (int(env.agent_pos[0]), int(env.agent_pos[1]))
        plan = plan_to_face(start, int(env.agent_dir), (target.x, target.y), can_enter)
        if plan is None:
            return f"You know no way to reach the {target.name} yet.", 0.0, False, False
        total, terminated, truncated = 0.0, False, False
        for n, action in enumerate(plan, 1):
            reward, terminated, truncated = self._act(action, full=False)
            total += reward
            if (terminated or truncated) and n < len(plan):
                return f"You moved towards the {target.name}.", total, terminated, truncated
        feedback = f"You are in front of the {target.name}."
        if terminated or truncated:
            return feedback, total, terminated, truncated
        follow: list[int] = []
        if verb == "pick up":
            if env.carrying is not None:
                return feedback + " You cannot pick it up: you are already carrying something.", total, False, False
            follow = [PICKUP]
        elif verb == "go through":
            door = grid.get(target.x, target.y)
            if door.is_locked and not (env.carrying is not None and env.carrying.type == "key" and env.carrying.color == door.color):
                return feedback + f" It is locked and you have no {door.color} key.", total, False, False
            follow = ([] if door.is_open else [TOGGLE]) + [FORWARD, FORWARD]
        for action in follow:
            if action == FORWARD and not passable(self._front()):
                return feedback + " Something blocks the way.", total, terminated, truncated
            reward, terminated, truncated = self._act(action, full=False)
            total += reward
            if terminated or truncated:
                break
        if verb == "pick up" and env.carrying is not None:
            feedback = f"You picked up the {target.color} {target.kind}."
        elif verb == "go through":
            feedback = f"You went through the {target.color} door."
        return feedback, total, terminated, truncated
