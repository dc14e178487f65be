"""ScienceWorld's short list (``environments.scienceworld.shortlist``): what it drops, how it
orders a command's actions (task words, then recency) and how it interleaves the commands,
each against a hand-worked case."""

from __future__ import annotations

import pytest

from environments.scienceworld.shortlist import (arguments_of, command_of, is_useful, recency,
                                                 shortlist, task_overlap, task_words)


@pytest.mark.parametrize("action, command, arguments", [
    ("look around", "look", ["around"]),
    ("look at metal pot", "look at", ["metal pot"]),
    ("pick up thermometer", "pick up", ["thermometer"]),
    ("move metal pot to stove", "move", ["metal pot", "stove"]),
    ("pour jug into flower pot 1", "pour", ["jug", "flower pot 1"]),
    ("use thermometer on ice cream", "use", ["thermometer", "ice cream"]),
    ("open door to kitchen", "open", ["door to kitchen"]),
    ("wait1", "wait1", []),
])
def test_command_and_arguments(action, command, arguments):
    assert command_of(action) == command
    assert arguments_of(action) == arguments


@pytest.mark.parametrize("action, useful", [
    ("go to kitchen", True),
    ("open door to kitchen", True),
    ("close door to hallway", True),
    ("pick up thermometer", True),
    ("connect battery anode to orange wire terminal 1", True),
    ("reset task", False),                      # loses the progress
    ("task", False),                            # repeats the first message
    ("focus on air", False),                    # a non-object
    ("move apple to inventory", False),
    ("mix kitchen", False),                     # a location, not gone to
    ("move apple to bathroom", False),
    ("focus on door to hallway", False),        # a door, not opened or closed
    ("go to door to kitchen", False),
    ("connect apple to battery anode", False),  # one end is no terminal
    ("connect apple to bathroom", False),
    ("disconnect battery", False),
    ("eat apple", False),
])
def test_what_is_dropped(action, useful):
    assert is_useful(action) is useful


def test_task_words_keep_the_objects():
    words = task_words("Task Description: Your task is to boil ice cream. First, focus on the "
                       "substance.")
    assert {"boil", "ice", "cream", "substance"} <= words
    assert not words & {"your", "task", "to", "first", "focus", "on", "the", "is"}
    assert task_overlap("focus on ice cream", words) == 2
    assert task_overlap("move apple to ceramic cup containing ice cream", words) == 2
    assert task_overlap("pick up apple", words) == 0


def test_recency_is_the_latest_observation_naming_the_object():
    observations = ["You see a thermometer, an apple and a stove.", "You look at the stove.",
                    "You move the Apple to the inventory."]
    assert recency("apple", observations) == 3          # case-insensitive
    assert recency("stove", observations) == 2
    assert recency("thermometer", observations) == 1
    assert recency("apple in inventory", observations) == 3  # the location is not the name
    assert recency("banana", observations) == 0


def test_a_commands_order_task_words_then_recency_then_alphabet():
    actions = sorted(["look at apple", "look at banana", "look at ice cream", "look at stove",
                      "look around"])
    observations = ["You see an apple, a banana and a stove.", "The stove is now on."]
    # task words: ice cream (2 words) first; then stove (seen latest), then apple and banana
    # (seen in observation 1: alphabetical)
    assert shortlist(actions, "Your task is to boil ice cream.", observations) == [
        "look around", "look at ice cream", "look at stove", "look at apple", "look at banana"]
    # with no task and no observations: alphabetical within the command
    assert shortlist(actions) == ["look around", "look at apple", "look at banana",
                                  "look at ice cream", "look at stove"]


def test_one_focus_is_listed_the_first_in_the_commands_order_last_in_its_turn():
    actions = sorted(["focus on apple", "focus on banana", "focus on ice cream", "look around",
                      "look at apple", "look at banana"])
    observations = ["You see an apple and a banana.", "You look at the banana."]
    # turn 1: look around, look at (its first), then the one focus; turn 2: look at's second
    assert shortlist(actions, "Your task is to boil ice cream.", observations) == [
        "look around", "look at banana", "focus on ice cream", "look at apple"]
    # no task object: the thing seen latest
    assert shortlist(actions, "Your task is to find a living thing.", observations) == [
        "look around", "look at banana", "focus on banana", "look at apple"]


def test_two_argument_recency_sums_over_both_objects():
    actions = sorted(["move apple to bowl", "move apple to stove", "move pot to stove"])
    observations = ["A bowl, an apple.", "A pot.", "The stove is hot."]
    # the sums of the latest observation naming each object: pot + stove 2 + 3 = 5,
    # apple + stove 1 + 3 = 4, apple + bowl 1 + 1 = 2
    assert shortlist(actions, "", observations) == ["move pot to stove", "move apple to stove",
                                                     "move apple to bowl"]


def test_empty_and_all_dropped_lists():
    assert shortlist([]) == []
    assert shortlist(["reset task", "task", "mix kitchen"]) == []
