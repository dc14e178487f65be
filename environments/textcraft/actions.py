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


def goal_distances(world: CraftingWorld, commands: Sequence[CraftCommand], goal_id: str) -> dict[str, int]:
    """Items (and tags) the goal is crafted from through ``commands``, each with its distance
    from the goal: the goal is 0; the ingredients of a command making an item at distance d (or
    an item of a tag at distance d) are at d + 1 unless nearer (breadth first). The agent can
    derive the same from the observation; distractor commands make items not in this map."""
    distance = {goal_id: 0}
    frontier = [goal_id]
    while frontier:
        wanted = set(frontier)
        frontier = []
        for command in commands:
            made = command.output if command.output in wanted else world.tag_of(command.output)
            if made not in wanted:
                continue
            for ingredient, _ in command.ingredients:
                if ingredient not in distance:
                    distance[ingredient] = distance[made] + 1
                    frontier.append(ingredient)
    return distance


def _is_relevant(world: CraftingWorld, command: CraftCommand, distance: Mapping[str, int]) -> bool:
    """``command`` makes a goal-relevant item (or an item of a goal-relevant tag)."""
    return command.output in distance or world.tag_of(command.output) in distance


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

    1. ``craft`` of the goal, then of the other goal-relevant items (``goal_distances``), in
       command order, for every command whose ingredients the inventory holds
       (``_craft_variants``: tag ingredients written as held concrete items);
    2. ``get N <item>`` for each goal-relevant base item held in fewer than N, nearest the
       goal first (then in order of first appearance), where N is the most any relevant command
       needs of it (one batch of any of them; repeat it for more);
    3. the crafts of distractor commands;
    4. the ``get`` of relevant base items already held in N, then of the base items only
       distractor commands use (N: the most such a command needs);
    5. ``inventory``.

    Deterministic (command order, then first appearance) and cheap: a few passes over the
    episode's commands (at most ~70) per call.
    """
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    distance = goal_distances(world, commands, goal_id)
    goal_crafts, relevant_crafts, other_crafts = [], [], []
    for command in commands:
        variants = _craft_variants(world, command, inventory)
        if command.output == goal_id:
            goal_crafts += variants
        elif _is_relevant(world, command, distance):
            relevant_crafts += variants
        else:
            other_crafts += variants
    get_count: dict[str, int] = {}  # base item -> N: the most a relevant command needs
    other_count: dict[str, int] = {}  # base items only distractor commands use -> N
    for command in commands:
        counts = get_count if _is_relevant(world, command, distance) else other_count
        for ingredient, count in command.ingredients:
            if world.is_base_item(ingredient):
                counts[ingredient] = max(counts.get(ingredient, 0), count)
    nearest = sorted(get_count, key=lambda k: distance[k])  # stable: first appearance within a distance
    missing = [k for k in nearest if inventory.get(k, 0) < get_count[k]]
    held = [k for k in nearest if inventory.get(k, 0) >= get_count[k]]
    gets = [f"get {get_count[k]} {item_name(k)}" for k in missing + held]
    gets += [f"get {n} {item_name(k)}" for k, n in other_count.items() if k not in get_count]
    ordered = goal_crafts + relevant_crafts + gets[:len(missing)] + other_crafts + gets[len(missing):]
    return list(dict.fromkeys(ordered))[:limit - 1] + [INVENTORY]
