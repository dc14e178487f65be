"""TextCraft's admissible actions: the ``get`` / ``craft`` / ``inventory`` actions that succeed now.

``admissible_actions`` is what ``TextCraftEnv.valid_actions`` lists (the server appends the first
``list_actions`` of them to each observation; the lettered-choice format names each with a
letter, so the list is bounded by ``MAX_ADMISSIBLE``). It reads only what the agent can read
too, the episode's crafting commands and goal, plus the inventory (which ``inventory`` shows):
the order never reveals which commands are distractors beyond what the commands themselves say.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from typing import Mapping, Sequence

from environments.textcraft.world import CraftingWorld, item_id, item_name

#: the most actions listed: one per option letter ("a".."z"), ``inventory`` included
MAX_ADMISSIBLE = 26
#: the most concrete-ingredient variants listed per crafting command (``planks`` may be several
#: kinds of planks held at once; one variant is enough to use the command)
MAX_VARIANTS_PER_COMMAND = 3
INVENTORY = "inventory"
_COMMAND_RE = re.compile(r"^craft (\d+) (.+?) using (.+)$")


@dataclasses.dataclass(frozen=True)
class CraftCommand:
    """One crafting-command line, e.g. ``craft 4 stick using 2 planks``: ``output`` and
    ``ingredients`` are item ids (an ingredient may be a tag such as ``minecraft:planks``)."""

    output: str
    count: int
    ingredients: tuple[tuple[str, int], ...]


def parse_commands(lines: Sequence[str]) -> tuple[CraftCommand, ...]:
    """The crafting-command lines of an episode (``CraftingWorld.commands``), parsed; a line
    that is not a crafting command raises ``ValueError``."""
    parsed = []
    for line in lines:
        match = _COMMAND_RE.match(line)
        if match is None:
            raise ValueError(f"not a crafting command: {line!r}")
        ingredients = []
        for part in match.group(3).split(", "):
            count, _, name = part.partition(" ")
            ingredients.append((item_id(name), int(count)))
        parsed.append(CraftCommand(item_id(match.group(2)), int(match.group(1)), tuple(ingredients)))
    return tuple(parsed)


def goal_relevant_items(world: CraftingWorld, commands: Sequence[CraftCommand], goal_id: str) -> set[str]:
    """Items (and tags) the goal is crafted from through ``commands``: the goal, the ingredients
    of every command making a relevant item (or an item of a relevant tag), transitively. The
    agent can derive the same from the observation; distractor commands make other items."""
    relevant = {goal_id}
    grew = True
    while grew:
        grew = False
        for command in commands:
            if command.output in relevant or world.tag_of(command.output) in relevant:
                for ingredient, _ in command.ingredients:
                    if ingredient not in relevant:
                        relevant.add(ingredient)
                        grew = True
    return relevant


def _craft_variants(world: CraftingWorld, command: CraftCommand, inventory: Mapping[str, int]) -> list[str]:
    """The ``craft`` actions of ``command`` that succeed with ``inventory``: a tag ingredient is
    written as a held item of that tag (most held first, then by name), at most
    ``MAX_VARIANTS_PER_COMMAND`` variants; each is checked with the environment's own rule
    (``CraftingWorld.match_recipe``, and enough of every item, counting an item given twice)."""
    slots: list[list[tuple[str, int]]] = []
    for ingredient, count in command.ingredients:
        if world.is_tag(ingredient):
            held = sorted((k for k, v in inventory.items() if v >= count and world.tag_of(k) == ingredient),
                          key=lambda k: (-inventory[k], k))
            slots.append([(k, count) for k in held])
        else:
            slots.append([(ingredient, count)] if inventory.get(ingredient, 0) >= count else [])
    actions = []
    for inputs in itertools.product(*slots):
        needed: dict[str, int] = {}
        for name_id, count in inputs:
            needed[name_id] = needed.get(name_id, 0) + count
        if any(inventory.get(k, 0) < n for k, n in needed.items()):
            continue
        if world.match_recipe(command.output, inputs) is None:
            continue
        actions.append(f"craft {command.count} {item_name(command.output)} using "
                       + ", ".join(f"{n} {item_name(k)}" for k, n in inputs))
        if len(actions) == MAX_VARIANTS_PER_COMMAND:
            break
    return actions


def admissible_actions(world: CraftingWorld, commands: Sequence[CraftCommand], goal_id: str,
                       inventory: Mapping[str, int], limit: int = MAX_ADMISSIBLE) -> list[str]:
    """The actions that succeed in this state, most useful first, at most ``limit`` (``>= 1``),
    ``inventory`` always last:

    1. ``craft`` of the goal, then of the other goal-relevant items (``goal_relevant_items``),
       in command order, for every command whose ingredients the inventory holds
       (``_craft_variants``: tag ingredients written as held concrete items);
    2. ``get N <item>`` for each goal-relevant base item held in fewer than N, where N is the
       most any relevant command needs of it (one batch of any of them; repeat for more);
    3. the crafts of distractor commands;
    4. the ``get`` of relevant base items already held in N, then of the base items only
       distractor commands use (N: the most such a command needs);
    5. ``inventory``.

    Deterministic (command order, then first appearance) and cheap: a few passes over the
    episode's commands (at most ~70) per call.
    """
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    relevant = goal_relevant_items(world, commands, goal_id)
    goal_crafts, relevant_crafts, other_crafts = [], [], []
    for command in commands:
        variants = _craft_variants(world, command, inventory)
        if command.output == goal_id:
            goal_crafts += variants
        elif command.output in relevant or world.tag_of(command.output) in relevant:
            relevant_crafts += variants
        else:
            other_crafts += variants
    get_count: dict[str, int] = {}  # base item -> N, relevant commands' needs first
    is_relevant: dict[str, bool] = {}
    for relevant_pass in (True, False):
        for command in commands:
            command_relevant = command.output in relevant or world.tag_of(command.output) in relevant
            if command_relevant != relevant_pass:
                continue
            for ingredient, count in command.ingredients:
                if not world.is_base_item(ingredient) or is_relevant.get(ingredient, relevant_pass) != relevant_pass:
                    continue
                is_relevant[ingredient] = relevant_pass
                get_count[ingredient] = max(get_count.get(ingredient, 0), count)
    missing = [k for k in get_count if is_relevant[k] and inventory.get(k, 0) < get_count[k]]
    held = [k for k in get_count if is_relevant[k] and inventory.get(k, 0) >= get_count[k]]
    distractor_items = [k for k in get_count if not is_relevant[k]]
    gets = [f"get {get_count[k]} {item_name(k)}" for k in missing + held + distractor_items]
    ordered = goal_crafts + relevant_crafts + gets[:len(missing)] + other_crafts + gets[len(missing):]
    return list(dict.fromkeys(ordered))[:limit - 1] + [INVENTORY]
