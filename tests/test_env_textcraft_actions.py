"""TextCraft's listed actions (``TextCraftEnv.valid_actions``): every listed action succeeds, every
craft and get that would succeed is listed (while the list has room), a policy restricted to the
list can follow the recipe expert to the goal, and the HTTP server appends the list."""

from __future__ import annotations

import math
import random
import re

import pytest

from agentrl_common.processes import start_env_server
from environments.core.client import EnvClient
from environments.textcraft.actions import MAX_ADMISSIBLE, admissible_actions, parse_commands
from environments.textcraft.catalog import TextCraftCatalog
from environments.textcraft.env import TextCraftEnv
from environments.textcraft.expert import TextCraftExpert
from environments.textcraft.world import item_id, item_name, world

pytestmark = pytest.mark.timeout(300)

SUCCESS_RE = re.compile(r"^(Got \d+ |Crafted \d+ |Inventory: )")


def _replayed(task_id: str, seed: int, actions: list[str]) -> TextCraftEnv:
    """A fresh environment brought to the same state by replaying ``actions``."""
    env = TextCraftEnv(max_steps=10_000)
    env.reset(task_id, seed=seed)
    for action in actions:
        env.step(action)
    return env


def _succeeds(task_id: str, seed: int, history: list[str], action: str) -> bool:
    result = _replayed(task_id, seed, history).step(action)
    return SUCCESS_RE.match(result.observation) is not None and not result.info["invalid_action"]


def _brute_force_successes(env: TextCraftEnv, task_id: str, seed: int, history: list[str]) -> tuple[set[str], set[str]]:
    """The command lines of which some ``craft`` succeeds (each line, every ingredient written as
    itself or as each held item in turn; a success counts for the lines it uses), and the items of which some ``get`` succeeds (each
    ingredient of the commands, with its count), found by trying each on a replayed copy."""
    held = sorted(item_name(k) for k in env._inventory)
    lines, items = set(), set()
    for line in env._commands:
        head, _, ingredients = line.partition(" using ")
        parts = [p.partition(" ") for p in ingredients.split(", ")]
        combos = [[]]
        for count, _, name in parts:
            combos = [c + [f"{count} {n}"] for c in combos for n in [name] + held]
        for combo in combos:
            action = f"{head} using {', '.join(combo)}"
            if _succeeds(task_id, seed, history, action):
                lines.update(_command_lines_of(action, env._commands))
        items.update(name for count, _, name in parts if _succeeds(task_id, seed, history, f"get {count} {name}"))
    return lines, items


def _command_lines_of(action: str, lines: list[str]) -> set[str]:
    """The command lines ``action`` uses: same output and counts, each ingredient the line's own
    or an item of the line's tag."""
    head, _, ingredients = action.partition(" using ")
    given = [p.partition(" ") for p in ingredients.split(", ")]
    found = set()
    for line in lines:
        line_head, _, line_ingredients = line.partition(" using ")
        wanted = [p.partition(" ") for p in line_ingredients.split(", ")]
        if line_head == head and len(wanted) == len(given) and all(
                gc == wc and (gn == wn or world().tag_of(item_id(gn)) == item_id(wn))
                for (gc, _, gn), (wc, _, wn) in zip(given, wanted)):
            found.add(line)
    return found


def test_every_listed_action_succeeds_and_every_possible_one_is_listed_on_random_walks():
    rng = random.Random(7)
    goals = list(TextCraftCatalog().task_ids("train"))
    checked = crafts_listed = full = 0
    for task_id in rng.sample(goals, 24):
        seed = rng.randrange(1_000)
        env = TextCraftEnv(max_steps=10_000)
        env.reset(task_id, seed=seed)
        history: list[str] = []
        for _ in range(12):
            listed = env.valid_actions()
            assert listed == env.valid_actions()  # deterministic
            assert 1 < len(listed) <= MAX_ADMISSIBLE and listed[-1] == "inventory"
            assert len(set(listed)) == len(listed)
            for action in listed:
                assert _succeeds(task_id, seed, history, action), (task_id, history, action)
                checked += 1
            crafts_listed += sum(a.startswith("craft ") for a in listed)
            possible_lines, possible_gets = _brute_force_successes(env, task_id, seed, history)
            listed_lines = set().union(*(_command_lines_of(a, env._commands) for a in listed if a.startswith("craft ")))
            listed_gets = {a.split(" ", 2)[2] for a in listed if a.startswith("get ")}
            if len(listed) < MAX_ADMISSIBLE:  # the list had room: nothing possible left out
                assert possible_lines <= listed_lines, (task_id, history, possible_lines - listed_lines)
                assert possible_gets <= listed_gets, (task_id, history, possible_gets - listed_gets)
                full += 1
            # walk: mostly crafts when there are some, so that the walks reach deeper states
            crafts = [a for a in listed if a.startswith("craft ")]
            action = rng.choice(crafts if crafts and rng.random() < 0.6 else listed)
            result = env.step(action)
            history.append(action)
            if result.done:
                assert env.valid_actions() is None  # nothing to choose once the episode ended
                break
    assert checked > 1_500 and crafts_listed > 50 and full > 100, (checked, crafts_listed, full)


def _follow_with_listed_actions(task_id: str, seed: int) -> tuple[bool, bool, int]:
    """The recipe expert plays ``task_id`` on one environment; a shadow environment takes only
    listed actions: the expert's own action where it is listed, else (for a ``get``) a listed
    ``get`` of the same item repeated until the shadow holds as much. Returns (expert solved,
    shadow solved, steps where the expert's exact action was listed)."""
    env, shadow = TextCraftEnv(max_steps=10_000), TextCraftEnv(max_steps=10_000)
    expert = TextCraftExpert(env.reset(task_id, seed=seed).observation)
    shadow.reset(task_id, seed=seed)
    feedback, exact = None, 0
    for _ in range(60):
        action = expert.act(feedback)
        result = env.step(action)
        feedback = result.observation
        if not SUCCESS_RE.match(result.observation):  # the expert probing a type name ("get 3 planks")
            continue
        listed = shadow.valid_actions()
        if action in listed:
            exact += 1
            shadow_result = shadow.step(action)
        else:
            assert action.startswith("get "), (task_id, action, listed)
            item = action.split(" ", 2)[2]
            same_item = [a for a in listed if a.startswith("get ") and a.split(" ", 2)[2] == item]
            assert same_item, (task_id, action, listed)
            want = env._inventory[item_id(item)]
            for _ in range(math.ceil(want / int(same_item[0].split()[1]))):
                if shadow._inventory.get(item_id(item), 0) >= want:
                    break
                assert same_item[0] in shadow.valid_actions()
                shadow_result = shadow.step(same_item[0])
        assert SUCCESS_RE.match(shadow_result.observation), (task_id, action, shadow_result.observation)
        if result.done:
            return True, shadow_result.done and shadow_result.info["success"], exact
    return False, False, exact


def test_a_policy_choosing_only_listed_actions_can_follow_the_expert_to_the_goal():
    catalog = TextCraftCatalog()
    goals = list(catalog.task_ids("train"))[::5] + list(catalog.task_ids("test"))[::3]
    expert_solved = shadow_solved = exact = 0
    for k, task_id in enumerate(goals):
        solved, followed, n = _follow_with_listed_actions(task_id, seed=k)
        expert_solved += solved
        shadow_solved += followed
        exact += n
        assert followed or not solved, task_id
    assert expert_solved >= 0.9 * len(goals) and shadow_solved == expert_solved and exact > 5 * len(goals)


def test_hand_computed_lists_for_stick():
    env = TextCraftEnv()
    env.reset("stick")  # the default seed: the commands printed in test_env_textcraft
    logs = ["acacia logs", "jungle logs", "crimson stems", "warped stems", "oak logs", "dark oak logs",
            "spruce logs", "birch logs"]
    # stick <- 2 bamboo (distance 1) or 2 planks <- 1 <kind> logs (distance 2); string, honeycomb
    # and diamond only feed distractors (loom, beehive, jukebox, scaffolding)
    start = env.valid_actions()
    assert start[:2] == ["get 2 bamboo", "get 1 acacia logs"]
    assert set(start[1:9]) == {f"get 1 {name}" for name in logs}
    assert start[9:] == ["get 2 string", "get 3 honeycomb", "get 1 diamond", "inventory"]  # loom: 2 string
    env.step("get 1 oak logs")
    assert env.valid_actions()[0] == "craft 4 oak planks using 1 oak logs"
    assert "get 1 oak logs" in env.valid_actions()[:10]  # held already: after the missing ones
    env.step("craft 4 oak planks using 1 oak logs")
    now = env.valid_actions()
    # the goal first (the tag "planks" written as the held oak planks), a distractor (bowl:
    # 3 planks) after every relevant get, and no craft needing more than 4 oak planks
    assert now[0] == "craft 4 stick using 2 oak planks"
    assert now.index("craft 4 bowl using 3 oak planks") == 10
    assert not any("jukebox" in a or "beehive" in a or "loom" in a for a in now)
    env.step("get 2 bamboo")
    assert env.valid_actions()[:2] == ["craft 1 stick using 2 bamboo", "craft 4 stick using 2 oak planks"]  # command order
    assert env.step("craft 1 stick using 2 bamboo").done and env.valid_actions() is None


def test_limit_and_unknown_lines_are_refused():
    crafting = world()
    commands = parse_commands(["craft 4 stick using 2 planks", "craft 4 oak planks using 1 oak logs"])
    assert admissible_actions(crafting, commands, "minecraft:stick", {}, limit=1) == ["inventory"]
    assert admissible_actions(crafting, commands, "minecraft:stick", {"minecraft:oak_planks": 5}) == [
        "craft 4 stick using 2 oak planks", "get 1 oak logs", "inventory"]
    with pytest.raises(ValueError, match="limit"):
        admissible_actions(crafting, commands, "minecraft:stick", {}, limit=0)
    with pytest.raises(ValueError, match="crafting command"):
        parse_commands(["get 1 oak logs"])


async def test_the_server_lists_textcraft_actions_after_each_observation():
    with start_env_server("textcraft") as server:
        async with EnvClient(server.url, list_actions=5) as client:
            env_id, observation, info = await client.create(task_id="stick")
            local = TextCraftEnv()
            local.reset("stick")
            expected = local.valid_actions()
            assert info["listed_actions"] == expected[:5]
            assert observation.endswith("\nValid actions: " + ", ".join(expected[:5])
                                        + f" (and {len(expected) - 5} more).")
            step = await client.step(env_id, info["listed_actions"][0])
            local.step(info["listed_actions"][0])
            assert step.info["listed_actions"] == local.valid_actions()[:5]
            assert step.observation.startswith("Got 2 bamboo\nValid actions: ")
            await client.close(env_id)
