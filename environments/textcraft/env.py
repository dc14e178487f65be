"""The TextCraft text environment (Minecraft-like crafting from text recipes).

Task ids are goal item names with underscores, e.g. ``dark_oak_sign`` (544 goals of crafting depth
>= 1). The first observation lists crafting commands (the goal's recipe tree plus up to 10
distractors, shuffled by the episode seed) and the goal. Actions, as in the original:

* ``get N <item>``: fetch a base item (not craftable, not a tag);
* ``craft N <item> using N <a>, M <b>``: apply a recipe; ingredients must match one recipe of the
  item exactly (an item may stand for its tag, e.g. ``oak planks`` for ``planks``); one use crafts
  one batch (the recipe's output count);
* ``inventory``: list what you hold.

``valid_actions`` lists the actions that would succeed now (``actions.admissible_actions``): the
crafts the inventory allows, the ``get`` of the base items the commands use, then ``inventory``;
the server appends them to the observations of sessions created with ``list_actions``.

Reward 1 and ``done`` when the goal item is crafted; ``truncated`` after ``max_steps`` steps.
"""

from __future__ import annotations

import re
import zlib
from typing import Any

from environments.core.base import InvalidTaskError, ResetResult, StepResult, TextEnvironment
from environments.textcraft.actions import CraftCommand, admissible_actions, parse_commands
from environments.textcraft.world import PREFIX, CraftingWorld, item_id, item_name, world

MAX_STEPS = 50
MAX_COUNT_DIGITS = 9  # counts in actions: a longer number is not understood (no int() of 4,300 digits)
CRAFT_RE = re.compile(r"craft (.*) using (.*)")
GET_RE = re.compile(rf"get ([0-9]{{1,{MAX_COUNT_DIGITS}}}) (.*)")
COUNT_RE = re.compile(rf"([0-9]{{1,{MAX_COUNT_DIGITS}}}) (.*)")
TASK_ID_RE = re.compile(r"[a-z0-9]+(?:_[a-z0-9]+)*", re.ASCII)  # the catalog's goal names, e.g. dark_oak_sign

INSTRUCTIONS = (
    "You are in a Minecraft-like crafting game. Each turn, answer with exactly one action:\n"
    "get <count> <item>: fetch a basic item (one that has no crafting command);\n"
    "craft <count> <item> using <count> <ingredient>, <count> <ingredient>: use one of the crafting "
    "commands; ingredients and counts must match it exactly, and an ingredient written as a type "
    "(e.g. planks) must be given as a concrete item (e.g. oak planks);\n"
    "inventory: list what you have.\n"
    "Craft the goal item to win."
)


class ActionFailed(Exception):
    """An action that was understood but could not be carried out (a normal, unrewarded step)."""


def default_seed(goal: str) -> int:
    """The seed used when none is given: stable across processes (unlike ``hash``)."""
    return zlib.crc32(goal.encode())


class TextCraftEnv(TextEnvironment):
    """One TextCraft instance; all instances of a process share one read-only ``CraftingWorld``."""

    name = "textcraft"

    def __init__(self, max_steps: int = MAX_STEPS) -> None:
        self.max_steps = max_steps
        self._world: CraftingWorld = world()
        self._goal_id = ""
        self._task_id = ""
        self._inventory: dict[str, int] = {}
        self._steps = 0
        self._ended = True
        self._success = False
        self._commands: list[str] = []
        self._parsed: tuple[CraftCommand, ...] = ()

    def reset(self, task_id: str, seed: int | None = None) -> ResetResult:
        """Start goal ``task_id``, a goal name exactly as the catalog lists it (``dark_oak_sign``)."""
        goal_id = PREFIX + task_id
        if TASK_ID_RE.fullmatch(task_id) is None or self._world.depth.get(goal_id, 0) < 1:
            raise InvalidTaskError(f"unknown TextCraft goal {task_id[:100]!r}; task ids are the catalog's goal names, e.g. 'dark_oak_sign'")
        self._task_id = goal_id.replace(PREFIX, "")
        self._goal_id = goal_id
        self._inventory = {}
        self._steps = 0
        self._ended = self._success = False
        self._commands = self._world.commands(goal_id, default_seed(self._task_id) if seed is None else seed)
        self._parsed = parse_commands(self._commands)
        observation = "Crafting commands:\n{}\n\nGoal: craft {}.".format("\n".join(self._commands), item_name(goal_id))
        info = {
            "task_id": self._task_id,
            "goal": item_name(goal_id),
            "depth": self._world.depth[goal_id],
            "max_steps": self.max_steps,
            "instructions": INSTRUCTIONS,
            "crafting_commands": list(self._commands),
            "success": False,
            "steps": 0,
            "invalid_action": False,
            "state_key": self.state_key(),
        }
        return ResetResult(observation=observation, info=info)

    def step(self, action: str) -> StepResult:
        if not self._goal_id:
            raise RuntimeError("step before reset")
        if self._ended:
            return StepResult("The episode has ended.", 0.0, True, False, self._info(invalid=True))
        self._steps += 1
        text = " ".join(action.strip().split()).rstrip(".")
        invalid = False
        reward = 0.0
        try:
            if (match := CRAFT_RE.match(text)) is not None:
                observation = self._craft(match.group(1), match.group(2))
                if self._inventory.get(self._goal_id, 0) > 0:
                    reward, self._success, self._ended = 1.0, True, True
            elif (match := GET_RE.match(text)) is not None:
                observation = self._get(int(match.group(1)), match.group(2))
            elif text.startswith("inventory"):
                observation = self._show_inventory()
            else:
                invalid = True
                observation = f"Could not execute {action.strip()}"
        except ActionFailed as failure:
            observation = str(failure)
        truncated = not self._ended and self._steps >= self.max_steps
        if truncated:
            self._ended = True
            observation += "\nYou ran out of steps."
        return StepResult(observation, reward, self._success, truncated, self._info(invalid))

    def close(self) -> None:
        self._inventory = {}

    def valid_actions(self) -> list[str] | None:
        """The actions that succeed now, most useful first, at most 26 with ``inventory`` last
        (``actions.admissible_actions``); None before the first reset and after the episode."""
        if not self._goal_id or self._ended:
            return None
        return admissible_actions(self._world, self._parsed, self._goal_id, self._inventory)

    # -- actions

    def _get(self, count: int, name: str) -> str:
        name_id = item_id(name)
        if count < 1 or not self._world.is_base_item(name_id):
            raise ActionFailed(f"Could not find {name}")
        self._inventory[name_id] = self._inventory.get(name_id, 0) + count
        return f"Got {count} {name}"

    def _craft(self, output_text: str, inputs_text: str) -> str:
        match = COUNT_RE.match(output_text.strip())
        output_id = item_id(match.group(2) if match else output_text)
        inputs: list[tuple[str, int]] = []
        for part in inputs_text.split(","):
            part_match = COUNT_RE.match(part.strip())
            if part_match is None:
                raise ActionFailed(f"Wrong item format: {part.strip()}")
            inputs.append((item_id(part_match.group(2)), int(part_match.group(1))))
        if any(self._inventory.get(name_id, 0) < count for name_id, count in inputs):
            raise ActionFailed(f"Could not find enough items to craft {item_name(output_id)}")
        recipe = self._world.match_recipe(output_id, inputs)
        if recipe is None:
            raise ActionFailed(f"Could not find a valid recipe for {item_name(output_id)}")
        for name_id, count in inputs:
            self._inventory[name_id] -= count
            if self._inventory[name_id] == 0:
                del self._inventory[name_id]
        made = recipe.output_item.count
        self._inventory[output_id] = self._inventory.get(output_id, 0) + made
        return f"Crafted {made} {item_name(output_id)}"

    def _show_inventory(self) -> str:
        if not self._inventory:
            return "Inventory: You are not carrying anything."
        return "Inventory: " + " ".join(f"[{item_name(k)}] ({v})" for k, v in self._inventory.items())

    def _info(self, invalid: bool) -> dict[str, Any]:
        return {"task_id": self._task_id, "success": self._success, "steps": self._steps, "invalid_action": invalid,
                "state_key": self.state_key()}

    def state_key(self) -> str:
        """Names the game state within a task: the inventory (sorted), the only thing actions change
        (the goal and the crafting commands are the task's). The step count is not part of it
        (GiGPO's anchor states, see docs/ALGORITHMS.md)."""
        return ";".join(f"{k}={v}" for k, v in sorted(self._inventory.items())) or "empty"
