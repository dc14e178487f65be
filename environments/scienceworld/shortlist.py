"""ScienceWorld's short list: which of a state's hundreds of valid actions an agent is shown.

The simulator lists every action/object combination it accepts (400-900 in a typical room,
about 70% of them ``connect X to Y``), most of them absurd (``mix kitchen``, ``focus on door
to hallway``, ``connect apple to bathroom``). A lettered-choice agent sees the first 26
(``agent.list_valid_actions``), so the order decides what it can do at all. The order here
uses only what the agent itself is shown (the task description and the episode's
observations) and the list:

1. **Drop** what cannot help: ``reset task`` (loses the progress) and ``task`` (repeats the
   first message); actions on the agent, the air or the inventory as an object; any action on
   a location other than ``go to`` it; any action on a door other than opening or closing it;
   ``connect`` unless both ends are electrical terminals (``anode``, ``cathode``,
   ``terminal``); ``disconnect`` and ``eat``.
2. **Group** the rest by command (``open``, ``look at``, ``pick up``, ``move``, ...) and order
   each group by, first, how many of an action's object words the task description uses
   (``focus on ice cream`` first when the task is to boil ice cream), then by how recently
   its objects were named in an observation (the sum over its arguments of the 1-based index
   of the latest observation naming one, 0 when none: the thing just picked up, looked at or
   seen in the room comes before the rest), then the simulator's alphabetical order.
3. **One focus, last**: of ``focus on``, only the group's first action is kept. Focusing is
   irreversible, and on a wrong object it fails the task (score -100), so every listed focus
   is a way to lose; one a list (about what the order before this one listed) leaves the
   task's object, or the thing just looked at or picked up, in reach.
4. **Take turns**: one action of each command in turn, commands with the fewest actions first,
   so that the first N cover every kind of command before the combinatorial ones repeat; the
   irreversible commands come last in each turn (a policy that favours the first letters, as
   the base model does, should not meet the way to lose first).

What it is worth is measured on the gold action sequences, as the share of their steps whose
action is among the first 26 (``benchmarks/analysis/sciworld_options.py``, docs/ENVIRONMENTS.md).
"""

from __future__ import annotations

import re
from typing import Sequence

#: ScienceWorld's ten locations (its map is fixed): only ``go to`` one is a useful action on it
LOCATIONS = frozenset({"art studio", "bathroom", "bedroom", "foundry", "greenhouse", "hallway",
                       "kitchen", "living room", "outside", "workshop"})
#: arguments that make a valid but useless action ("mix air", "focus on inventory")
NON_OBJECTS = frozenset({"agent", "air", "inventory"})
#: never listed: ``reset task`` loses the task's progress; ``task`` repeats the first message
NEVER_LISTED = frozenset({"reset task", "task"})
#: commands never listed: none of the tasks needs them, and they crowd the list
USELESS_COMMANDS = frozenset({"disconnect", "eat"})
#: commands of which only the first action (in the group's order) is listed: irreversible ones
IRREVERSIBLE_COMMANDS = frozenset({"focus on"})
#: what a ``connect`` end must name to be part of a circuit
ELECTRICAL_WORDS = ("anode", "cathode", "terminal")
#: the word between the two arguments of a two-argument command
_SECOND_ARGUMENT = {"connect": " to ", "dunk": " into ", "move": " to ", "pour": " into ",
                    "use": " on "}
#: the words of a task description that say nothing about its objects
_TASK_STOP_WORDS = frozenset("""
a about above after an and are around as at be below by can cause change changes completely
description determine done first focus for found from has have if in into is it its located
make matter most next of on or part reaches stage state take task than that the their them
then these this those to until use way when whether which will with without you your
actions action find some thing""".split())
_WORD = re.compile(r"[a-z0-9\-]+")


def command_of(action: str) -> str:
    """The command of ``action``: its first word, or its first two when the second is a
    preposition (``"look at pot"`` -> ``"look at"``, ``"pick up pot"`` -> ``"pick up"``)."""
    words = action.split()
    if len(words) > 1 and words[1] in ("on", "at", "in", "up", "down", "to"):
        return " ".join(words[:2])
    return words[0] if words else ""


def arguments_of(action: str) -> list[str]:
    """The object names of ``action``: ``"move metal pot to stove"`` -> ``["metal pot",
    "stove"]``, ``"focus on ice cream"`` -> ``["ice cream"]``, ``"look around"`` -> ``[]``."""
    command = command_of(action)
    rest = action[len(command):].strip()
    if not rest:
        return []
    separator = _SECOND_ARGUMENT.get(command)
    if separator and separator in rest:
        return rest.split(separator, 1)
    return [rest]


def is_useful(action: str) -> bool:
    """False for the actions rule 1 of the module docstring drops."""
    command = command_of(action)
    arguments = arguments_of(action)
    if action in NEVER_LISTED or command in USELESS_COMMANDS:
        return False
    if any(word in NON_OBJECTS for word in action.split()[1:]):
        return False
    for argument in arguments:
        if argument in LOCATIONS and command != "go to":
            return False
        if "door" in argument.split() and command not in ("open", "close"):
            return False
    if command == "connect":
        return all(any(word in a for word in ELECTRICAL_WORDS) for a in arguments)
    return True


def task_words(task_description: str) -> frozenset[str]:
    """The description's words less the ones that name no object (lower case)."""
    return frozenset(w for w in _WORD.findall(task_description.lower())
                     if len(w) > 1 and w not in _TASK_STOP_WORDS)


def task_overlap(action: str, words: frozenset[str]) -> int:
    """How many distinct words of ``action``'s arguments are in ``words``."""
    argument_words = {w for a in arguments_of(action) for w in _WORD.findall(a.lower())}
    return len(argument_words & words)


def recency(argument: str, observations: Sequence[str]) -> int:
    """The 1-based index of the latest of ``observations`` that names ``argument`` (its name
    before any ``" in "`` / ``" on "`` location, case-insensitive); 0 when none does."""
    name = argument.split(" in ")[0].split(" on ")[0].lower()
    for index in range(len(observations) - 1, -1, -1):
        if name in observations[index].lower():
            return index + 1
    return 0


def shortlist(actions: Sequence[str], task_description: str = "",
              observations: Sequence[str] = ()) -> list[str]:
    """``actions`` (the simulator's valid actions, alphabetical) dropped, grouped, ordered,
    cut and interleaved as the module docstring says. ``observations``: the episode's
    observations so far, oldest first."""
    words = task_words(task_description)
    recency_of: dict[str, int] = {}  # an argument's recency, once a call (arguments repeat)

    def rank_key(action: str) -> tuple[int, int]:
        arguments = arguments_of(action)
        for argument in arguments:
            if argument not in recency_of:
                recency_of[argument] = recency(argument, observations)
        return -task_overlap(action, words), -sum(recency_of[a] for a in arguments)

    groups: dict[str, list[str]] = {}
    for action in actions:
        if is_useful(action):
            groups.setdefault(command_of(action), []).append(action)
    for command, group in groups.items():
        group.sort(key=rank_key)
        if command in IRREVERSIBLE_COMMANDS:
            del group[1:]
    order = [group for _, group in sorted(groups.items(), key=lambda item: (
        item[0] in IRREVERSIBLE_COMMANDS, len(item[1]), item[1][0]))]
    ranked: list[str] = []
    for i in range(max((len(g) for g in order), default=0)):
        ranked.extend(g[i] for g in order if i < len(g))
    return ranked
