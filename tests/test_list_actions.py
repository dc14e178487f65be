"""Valid actions listed after each observation: the servers' ``list_actions`` field, the client's
``list_actions`` argument, the ``agent.list_valid_actions`` option and ScienceWorld's order."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import TestServer
from ml_collections import ConfigDict

from agentrl_jax.training.config.experiment import base_config
from agentrl_jax.training.preflight.validate import ConfigError, check_config
from environments.core.base import ResetResult, StepResult, TaskCatalog, TextEnvironment
from environments.core.client import EnvClient, EnvServerError
from environments.core.server import build_app
from environments.registry import Family
from environments.scienceworld.shortlist import shortlist

pytestmark = pytest.mark.timeout(60)


class _CountEnv(TextEnvironment):
    """After n steps, the valid actions are ``a0 .. a(n+2)``; the episode ends at step 3."""

    name = "count"

    def __init__(self) -> None:
        self.n = 0

    def reset(self, task_id: str, seed: int | None = None) -> ResetResult:
        self.n = 0
        return ResetResult("start", {"task_id": task_id, "max_steps": 3, "instructions": "-"})

    def step(self, action: str) -> StepResult:
        self.n += 1
        return StepResult(f"step {self.n}", 0.0, self.n >= 3, False, {"steps": self.n})

    def valid_actions(self) -> list[str] | None:
        return [f"a{i}" for i in range(self.n + 3)]


class _ShownEnv(_CountEnv):
    lists_actions_in_observation = True


class _NoListEnv(_CountEnv):
    def valid_actions(self) -> list[str] | None:
        return None


class _Catalog(TaskCatalog):
    def task_ids(self, split: str):
        return ["t"]


def _family(env: type[TextEnvironment], inline: bool) -> Family:
    return Family(name="count", env_factory=env, catalog_factory=_Catalog, inline=inline)


@pytest.mark.parametrize("inline", [False, True])
async def test_listed_actions_follow_the_state_and_stop_at_the_end(inline):
    async with TestServer(build_app(_family(_CountEnv, inline))) as server:
        url = str(server.make_url(""))
        async with EnvClient(url, list_actions=4) as client:
            env_id, observation, info = await client.create(task_id="t")
            assert observation == "start\nValid actions: a0, a1, a2."
            assert info["listed_actions"] == ["a0", "a1", "a2"]
            step = await client.step(env_id, "x")
            assert step.observation == "step 1\nValid actions: a0, a1, a2, a3."
            step = await client.step(env_id, "x")  # 5 valid, 4 listed
            assert step.observation == "step 2\nValid actions: a0, a1, a2, a3 (and 1 more)."
            assert step.info["listed_actions"] == ["a0", "a1", "a2", "a3"]
            last = await client.step(env_id, "x")  # the episode ended: nothing to choose from
            assert last.done and last.observation == "step 3" and "listed_actions" not in last.info
            again = await client.reset(env_id)  # the client asks again at every reset
            assert again.observation == "start\nValid actions: a0, a1, a2."
        async with EnvClient(url) as plain:  # off by default
            env_id, observation, info = await plain.create(task_id="t")
            assert observation == "start" and "listed_actions" not in info
            assert (await plain.step(env_id, "x")).observation == "step 1"


async def test_reset_can_switch_the_list_off_and_families_without_a_list_are_unchanged():
    async with TestServer(build_app(_family(_CountEnv, False))) as server:
        async with EnvClient(str(server.make_url("")), list_actions=2) as client:
            env_id = (await client.create(task_id="t")).env_id
            off = await client._call(0, "POST", "/reset", {"env_id": env_id, "list_actions": 0})
            assert off["observation"] == "start"
            assert (await client.step(env_id, "x")).observation == "step 1"  # stays off
    for env in (_ShownEnv, _NoListEnv):
        async with TestServer(build_app(_family(env, True))) as server:
            async with EnvClient(str(server.make_url("")), list_actions=2) as client:
                env_id, observation, _ = await client.create(task_id="t")
                assert observation == "start"
                assert (await client.step(env_id, "x")).observation == "step 1"


@pytest.mark.parametrize("value", [-1, 201, "3", True, 2.0])
async def test_bad_list_actions_is_400(value):
    async with TestServer(build_app(_family(_CountEnv, True))) as server:
        async with EnvClient(str(server.make_url(""))) as client:
            with pytest.raises(EnvServerError) as error:
                await client._call(0, "POST", "/create", {"task_id": "t", "list_actions": value})
            assert error.value.status == 400 and "list_actions" in error.value.message
            assert (await client.stats())["live_sessions"] == 0


def test_client_and_config_reject_bad_values():
    with pytest.raises(ValueError):
        EnvClient("http://127.0.0.1:1", list_actions=-1)
    assert EnvClient("http://127.0.0.1:1", list_actions=7).config()["list_actions"] == 7
    config = base_config()
    assert config.agent.list_valid_actions == 0
    for bad in (-1, 201, "10", True):
        config.agent = ConfigDict({**config.agent.to_dict(), "list_valid_actions": bad})
        with pytest.raises(ConfigError, match="agent.list_valid_actions"):
            check_config(config)
    config.agent = ConfigDict({**config.agent.to_dict(), "list_valid_actions": 30})
    check_config(config)


def test_scienceworld_order_takes_turns_over_commands_fewest_first():
    actions = sorted([
        "connect a to b", "connect a terminal to b anode", "connect b cathode to c terminal",
        "focus on pot", "focus on air", "look around", "look at pot", "look at stove", "mix agent",
        "open door", "reset task", "task", "pick up pot", "inventory",
    ])
    # dropped: "connect a to b" (not a circuit), "focus on air", "mix agent", "reset task",
    # "task"; groups (no task words, no observations: alphabetical within): connect x2,
    # focus on [pot] (irreversible: last in each turn), inventory, look around, look at x2,
    # open, pick up
    assert shortlist(actions) == [
        "inventory", "look around", "open door", "pick up pot",
        "connect a terminal to b anode", "look at pot", "focus on pot",
        "connect b cathode to c terminal", "look at stove",
    ]


class _BrokenListEnv(_CountEnv):
    def valid_actions(self) -> list[str] | None:
        raise RuntimeError("no list")


async def test_a_failing_list_is_a_500_and_leaves_no_session_behind():
    async with TestServer(build_app(_family(_BrokenListEnv, False))) as server:
        async with EnvClient(str(server.make_url("")), list_actions=3, retries=0) as client:
            with pytest.raises(EnvServerError) as error:
                await client.create(task_id="t")
            assert error.value.status == 500 and "no list" in error.value.message
            stats = await client.stats()
            assert stats["live_sessions"] == 0 and stats["sessions_closed"] == 1
