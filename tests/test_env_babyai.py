"""BabyAI family: minigrid's BabyAIBot solves held-out tasks through the HTTP client, the text view
agrees with minigrid's own visibility, macros do what they say, splits are deterministic."""

from __future__ import annotations

import asyncio
import random

import pytest

from environments.babyai.catalog import TEST_SEED_BASE, BabyAICatalog
from environments.babyai.env import BabyAIEnv
from environments.babyai.expert import BabyAIBotExpert
from environments.babyai.levels import level_names, make_level, parse_task_id
from environments.babyai.view import DIR_TO_VEC, agent_view
from environments.core.client import EnvClient, EnvServerError
from agentrl_common.processes import start_env_server

pytestmark = pytest.mark.timeout(180)

EXPERT_LEVELS = [
    "BabyAI-GoToRedBall-v0",
    "BabyAI-GoToLocal-v0",
    "BabyAI-PickupLoc-v0",
    "BabyAI-PutNextLocal-v0",
    "BabyAI-OpenDoorLoc-v0",
    "BabyAI-UnlockLocal-v0",
    "BabyAI-GoToObjMaze-v0",
    "BabyAI-KeyCorridorS3R2-v0",
    "BabyAI-SynthLoc-v0",
    "BabyAI-BossLevel-v0",
]


@pytest.fixture(scope="module")
def server():
    with start_env_server("babyai") as proc:
        yield proc


async def _expert_episode(client: EnvClient, task_id: str) -> tuple[bool, int]:
    """Play one episode with the bot through the server; check the server against the local copy."""
    expert = BabyAIBotExpert(task_id)
    env_id, observation, info = await client.create(task_id=task_id)
    assert f"Your goal: {expert.mission}" in observation
    try:
        for _ in range(info["max_steps"] + 1):
            action = expert.act()
            if action is None:
                return False, 0
            result = await client.step(env_id, action)
            reward, terminated, truncated = expert.mirror()
            assert result.reward == pytest.approx(reward) and result.done == terminated, task_id
            assert result.truncated == (truncated and not terminated)
            assert result.info["steps"] == expert.env.step_count
            if result.done or result.truncated:
                success = bool(result.info["success"])
                if success:  # minigrid's reward for the steps taken
                    assert result.reward == pytest.approx(1 - 0.9 * result.info["steps"] / info["max_steps"])
                return success, result.info["steps"]
        raise AssertionError(f"{task_id}: the episode outlived its step limit")
    finally:
        await client.close(env_id)


async def test_bot_expert_solves_held_out_test_tasks_through_http(server):
    async with EnvClient(server.url) as client:
        test_ids = await client.tasks("test")
        sample = [t for level in EXPERT_LEVELS for t in [i for i in test_ids if i.startswith(level + "/")][:3]]
        assert len(sample) == 30
        outcomes = await asyncio.gather(*(_expert_episode(client, t) for t in sample))
    solved = sum(ok for ok, _ in outcomes)
    assert solved >= 27, f"expert solved {solved}/30"
    assert sum(steps for _, steps in outcomes) > 300  # real episodes, not trivial ones


def test_text_view_matches_minigrid_visibility():
    rng = random.Random(0)
    checked = 0
    for level in ["BabyAI-GoToLocal-v0", "BabyAI-BossLevel-v0", "BabyAI-KeyCorridorS3R3-v0", "BabyAI-OpenDoorsOrderN4-v0"]:
        env = make_level(level)
        env.reset(seed=7)
        for _ in range(120):
            grid, vis = env.gen_obs_grid()
            size, half = env.agent_view_size, env.agent_view_size // 2
            (ax, ay), (fx, fy) = env.agent_pos, DIR_TO_VEC[env.agent_dir]
            expected, expected_seen = {}, set()
            for i in range(size):
                for j in range(size):
                    if not vis[i, j]:
                        continue
                    forward, right = size - 1 - j, i - half
                    x, y = ax + forward * fx - right * fy, ay + forward * fy + right * fx
                    if 0 <= x < env.width and 0 <= y < env.height:
                        expected_seen.add((x, y))
                    cell = grid.get(i, j)
                    if cell is not None and (forward, right) != (0, 0):
                        expected[(forward, right)] = (cell.type, cell.color, getattr(cell, "is_open", None))
            seen = bytearray(env.width * env.height)
            got = {
                (c.forward, c.right): ("wall", "grey", None) if isinstance(c.obj, str) else (c.obj.type, c.obj.color, getattr(c.obj, "is_open", None))
                for c in agent_view(env, seen)
                if (c.forward, c.right) != (0, 0)
            }
            assert got == expected
            assert {(k % env.width, k // env.width) for k, v in enumerate(seen) if v} == expected_seen
            checked += 1
            _, _, terminated, truncated, _ = env.step(rng.choice([0, 1, 2, 2, 2, 3, 5]))
            if terminated or truncated:
                break
    assert checked > 200


def test_incremental_sight_stays_exact_when_doors_open_and_objects_move():
    env = BabyAIEnv()
    rng = random.Random(1)
    catalog = BabyAICatalog()
    for k in range(30):
        result = env.reset(catalog.task_ids("train")[k * 11])
        actions = result.info["available_actions"]
        for _ in range(40):
            doors = [a for a in actions if a.startswith("go through")]
            step = env.step(rng.choice(["toggle", "toggle", "pickup", "drop", "move forward", "turn left", *doors]))
            assert env._view == agent_view(env._env)
            actions = step.info["available_actions"]
            if step.done or step.truncated:
                break


def _task_with(predicate, level: str, tries: int = 200) -> tuple[BabyAIEnv, str]:
    env = BabyAIEnv()
    for seed in range(tries):
        task_id = f"{level}/seed={seed}"
        result = env.reset(task_id)
        found = predicate(result.info["available_actions"], env)
        if found:
            return env, found
    raise AssertionError(f"no {level} seed within {tries} tries")


def test_go_to_and_pick_up_macros_end_facing_and_holding_the_object():
    env, action = _task_with(lambda acts, _: next((a for a in acts if a.startswith("pick up ")), None), "BabyAI-PickupDist-v0")
    color, kind = action.split()[2:4]
    go = env.step(action.replace("pick up", "go to"))
    if not go.done:
        front = env._env.grid.get(*env._env.front_pos)
        assert (front.color, front.type) == (color, kind)
        assert go.observation.startswith(f"You are in front of the {color} {kind}")
        env.step("pickup")
        assert (env._env.carrying.color, env._env.carrying.type) == (color, kind)


def test_go_through_door_macro_crosses_the_door():
    def unlocked_door(actions, env):
        doors = {o.name: o for o in env._objects if o.kind == "door" and o.state != "locked"}
        return next((a for a in actions if a.startswith("go through") and a[len("go through ") :] in doors), None)

    env, action = _task_with(unlocked_door, "BabyAI-GoToObjDoor-v0")
    result = env.step(action)
    assert result.done or result.observation.startswith(f"You went through the {action.split()[2]} door")
    if not result.done:
        inner = env._env
        dx, dy = DIR_TO_VEC[inner.agent_dir]
        behind = inner.grid.get(int(inner.agent_pos[0]) - dx, int(inner.agent_pos[1]) - dy)
        assert behind is not None and behind.type == "door" and behind.is_open


def test_invalid_actions_and_checks_take_no_minigrid_step():
    env = BabyAIEnv()
    result = env.reset("BabyAI-GoToLocal-v0/seed=3")
    for action in ["fly to the moon", "go to purple unicorn 1", "check available actions"]:
        step = env.step(action)
        assert step.info["steps"] == 0 and not step.done
        assert step.info["invalid_action"] == (action != "check available actions")
    assert "Available actions:" in env.step("check available actions").observation
    assert env.step("turn left").info["steps"] == 1
    assert "turn left" in result.info["available_actions"] and "Your goal:" in result.observation


async def test_truncation_after_max_steps_then_409(server):
    async with EnvClient(server.url) as client:
        env_id, _, info = await client.create(task_id="BabyAI-GoToRedBall-v0/seed=5")
        for _ in range(info["max_steps"]):
            result = await client.step(env_id, "turn left")
        assert result.truncated and not result.done and result.reward == 0.0 and not result.info["success"]
        with pytest.raises(EnvServerError) as error:
            await client.step(env_id, "turn left")
        assert error.value.status == 409
        await client.close(env_id)


async def test_same_task_gives_the_same_episode_and_stdout_stays_clean(server):
    async with EnvClient(server.url) as client:
        first = await client.create(task_id="BabyAI-BossLevel-v0/seed=1000003")
        second = await client.create(task_id="BabyAI-BossLevel-v0/seed=1000003")
        assert first.observation == second.observation
        for k in range(10):  # BossLevel rejects many samples while generating
            await client.reset(first.env_id, task_id=f"BabyAI-BossLevel-v0/seed={k}")
        await client.close(first.env_id)
        await client.close(second.env_id)
    assert "Sampling rejected" not in server.log_tail(100_000)


def test_splits_are_deterministic_and_disjoint():
    catalog = BabyAICatalog()
    train, test = catalog.task_ids("train"), catalog.task_ids("test")
    assert len(level_names()) == 96 and len(train) == 96 * 500 and len(test) == 96 * 50
    assert list(BabyAICatalog().task_ids("test")) == list(test)
    assert all(parse_task_id(t)[1] < TEST_SEED_BASE for t in train[-200:])
    assert all(parse_task_id(t)[1] >= TEST_SEED_BASE for t in test)
    assert {parse_task_id(t)[0] for t in test[:96]} == set(level_names())  # every level early on
    assert catalog.resolve("test", 5) == test[5]


def test_state_key_equals_minigrid_hash_while_the_grid_changes():
    """The cached grid digest gives minigrid's own ``env.hash()`` at every step: after moves,
    pickups, drops, door toggles and macros, on many levels (the key's reference: the
    uncached ``f"{env.hash()}|{held}"``)."""
    env = BabyAIEnv()
    rng = random.Random(7)
    catalog = BabyAICatalog()
    checked = changed = grid_changes = 0
    for k in range(40):
        result = env.reset(catalog.task_ids("train")[k * 13])
        actions = result.info["available_actions"]
        for _ in range(30):
            grid_before = env._env.grid.encode().tobytes()
            macros = [a for a in actions if a.startswith(("go through", "pick up", "go to"))]
            step = env.step(rng.choice(["toggle", "toggle", "pickup", "drop", "move forward",
                                        "turn left", "turn right", *macros]))
            raw = env._env
            held = f"{raw.carrying.color} {raw.carrying.type}" if raw.carrying is not None else "-"
            before = step.info["state_key"]
            assert before == f"{raw.hash()}|{held}"
            assert env.state_key() == before
            checked += 1
            changed += before != result.info["state_key"]
            grid_changes += raw.grid.encode().tobytes() != grid_before
            actions = step.info["available_actions"]
            if step.done or step.truncated:
                break
    assert checked > 500 and changed > 100 and grid_changes > 20
