"""A recipe-following TextCraft expert that reads only the observations.

It parses the crafting commands of the first observation and, before every action, plans the
goal's recipe tree depth-first from its own record of the inventory: ``get`` for ingredients
without a crafting command, one ``craft`` per batch otherwise. Ingredients may name a type
(``planks``, ``wooden slabs``) that ``get`` refuses; the expert learns that from the answer
("Could not find ...") and then uses a listed command making a concrete item of that type
(``oak planks``, ``oak slab``), trying the next one if a craft with it is refused. It knows
nothing of the environment's code or data, so the tests use it as an independent reference.
"""

from __future__ import annotations

from typing import Any

import dataclasses
import math
import re

COMMAND_RE = re.compile(r"^craft (\d+) (.+?) using (.+)$")
GOAL_RE = re.compile(r"Goal: craft (.+?)\.?$", re.MULTILINE)
GOT_RE = re.compile(r"^Got (\d+) (.+)$")
CRAFTED_RE = re.compile(r"^Crafted (\d+) (.+)$")


@dataclasses.dataclass(frozen=True)
class Command:
    output: str
    count: int
    inputs: tuple[tuple[str, int], ...]


def parse_observation(observation: str) -> tuple[list[Command], str]:
    """The crafting commands and the goal of a first TextCraft observation."""
    commands = []
    for line in observation.splitlines():
        match = COMMAND_RE.match(line.strip())
        if match:
            inputs = []
            for part in match.group(3).split(","):
                count, _, name = part.strip().partition(" ")
                inputs.append((name, int(count)))
            commands.append(Command(match.group(2), int(match.group(1)), tuple(inputs)))
    goal = GOAL_RE.search(observation)
    if goal is None:
        raise ValueError("no goal in observation")
    return commands, goal.group(1)


def _singular(word: str) -> str:
    return word[:-1] if word.endswith("s") else word


@dataclasses.dataclass
class _Step:
    action: str
    ingredients: tuple[tuple[str, int], ...] = ()  # for a craft: (item, count) consumed
    type_choices: tuple[tuple[str, str], ...] = ()  # for a craft: (type, concrete item) used


class TextCraftExpert:
    """Interactive policy: call ``act(feedback)`` with the previous action's observation."""

    def __init__(self, observation: str) -> None:
        self.commands, self.goal = parse_observation(observation)
        self._by_output: dict[str, list[Command]] = {}
        for command in self.commands:
            self._by_output.setdefault(command.output, []).append(command)
        self.inventory: dict[str, int] = {}
        self._types: set[str] = set()  # names that `get` refused
        self._bad: set[tuple[str, str]] = set()  # (type, item) pairs a craft refused
        self._last: _Step | None = None

    # -- policy

    def act(self, feedback: str | None = None) -> str:
        """The next action, given the observation that answered the previous one."""
        if self._last is not None and feedback is not None:
            self._learn(self._last, feedback.strip().splitlines()[0] if feedback.strip() else "")
        plan = self.plan()
        self._last = plan[0] if plan else _Step("inventory")
        return self._last.action

    def _learn(self, step: _Step, feedback: str) -> None:
        if step.action.startswith("get "):
            _, count, name = step.action.split(" ", 2)
            if GOT_RE.match(feedback):
                self.inventory[name] = self.inventory.get(name, 0) + int(count)
            elif feedback.startswith("Could not find"):
                self._types.add(name)
        elif step.action.startswith("craft "):
            crafted = CRAFTED_RE.match(feedback)
            if crafted:
                for item, n in step.ingredients:
                    self.inventory[item] -= n
                name = crafted.group(2)
                self.inventory[name] = self.inventory.get(name, 0) + int(crafted.group(1))
            elif feedback.startswith("Could not find a valid recipe"):
                self._bad.update(step.type_choices)

    # -- planning

    def candidates(self, type_name: str) -> list[str]:
        """Listed outputs that may be items of ``type_name``, best guesses first."""
        last = _singular(type_name.split()[-1])
        suffix = [o for o in self._by_output if o == _singular(type_name) or o.endswith(" " + type_name) or o.endswith(" " + _singular(type_name))]
        by_word = [o for o in self._by_output if o.split()[-1] == last and o not in suffix]
        return sorted(suffix) + sorted(by_word)

    def resolve(self, name: str) -> str:
        """The concrete item to use for ``name`` (itself unless ``get`` refused it as a type)."""
        if name in self._by_output or name not in self._types:
            return name
        for candidate in self.candidates(name):
            if (name, candidate) not in self._bad:
                return candidate
        return name

    def plan(self) -> list[_Step]:
        """The remaining actions, from the recorded inventory."""
        inventory = dict(self.inventory)
        steps: list[_Step] = []
        self._obtain(self.goal, 1, inventory, steps, path=())
        return steps

    def _obtain(self, name: str, count: int, inventory: dict[str, int], steps: list[_Step], path: tuple[str, ...]) -> str:
        """Make ``count`` of ``name`` available; ``path`` holds the items being crafted above it."""
        concrete = self.resolve(name)
        deficit = count - inventory.get(concrete, 0)
        if deficit <= 0 and name != self.goal:
            return concrete
        path = path + (concrete,)
        # skip commands whose ingredients lead back to an item being crafted (recipe cycles exist)
        options = [c for c in self._by_output.get(concrete, []) if not any(self.resolve(i) in path for i, _ in c.inputs)]
        if not options:
            steps.append(_Step(f"get {deficit} {concrete}"))
            inventory[concrete] = inventory.get(concrete, 0) + deficit
            return concrete
        command = options[0]
        batches = max(1, math.ceil(deficit / command.count))
        used = tuple((self._obtain(ingredient, n * batches, inventory, steps, path), n) for ingredient, n in command.inputs)
        choices = tuple((ingredient, item) for (ingredient, _), (item, _) in zip(command.inputs, used) if ingredient != item)
        line = f"craft {command.count} {concrete} using " + ", ".join(f"{n} {item}" for item, n in used)
        for _ in range(batches):
            steps.append(_Step(line, used, choices))
            for item, n in used:
                inventory[item] -= n
            inventory[concrete] = inventory.get(concrete, 0) + command.count
        return concrete


class TextCraftExpertPolicy:
    """The recipe expert: built from the first observation, then told each answer."""

    def __init__(self, task_id: str):
        self.expert: Any = None

    def act(self, observation: str) -> str | None:
        if self.expert is None:
            self.expert = TextCraftExpert(observation)
            return self.expert.act()
        return self.expert.act(observation)
