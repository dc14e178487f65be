"""Action lists kept out of the observation text (``"action_text": false``; the client's
``action_text``; ``agent.actions_in_observation``), for the lettered-choice prompt whose options
block is the only list it should show.

Against hand-written expected observations on a fake family (both server dispatch modes), the
real ``BabyAIEnv`` (its own "Available actions" line), a choice episode on a real BabyAI server
(the options appear once per user message), and the config path that turns it on.
"""

from __future__ import annotations

import pytest
from aiohttp.test_utils import TestServer
from fake_backends import GO_TO_RED_BALL, ScriptedBackend, choice_episode

from agentrl_jax.agent.parsing import options_block
from agentrl_jax.models.pretrained import resolve_model_path
from agentrl_jax.models.tokenizer import load_tokenizer
from agentrl_jax.training.config.experiment import to_run_config
from environments.babyai.env import BabyAIEnv
from environments.core.base import ResetResult, StepResult, TextEnvironment
from environments.core.client import EnvClient, EnvServerError
from environments.core.server import build_app
from environments.registry import Family
from tests.test_list_actions import _Catalog, _CountEnv

pytestmark = pytest.mark.timeout(120)


class _OwnListEnv(_CountEnv):
    """A family that writes its own list into the observation (as BabyAI does), unless told
    not to (``action_text``)."""

    lists_actions_in_observation = True

    def _text(self, head: str) -> str:
        return f"{head}\nMine: {', '.join(self.valid_actions())}" if self.action_text else head

    def reset(self, task_id: str, seed: int | None = None) -> ResetResult:
        result = super().reset(task_id, seed)
        return ResetResult(self._text(result.observation), result.info)

    def step(self, action: str) -> StepResult:
        r = super().step(action)
        return StepResult(self._text(r.observation), r.reward, r.done, r.truncated, r.info)


def _family(env: type[TextEnvironment], inline: bool, reuse: bool = False) -> Family:
    return Family(name="count", env_factory=env, catalog_factory=_Catalog, inline=inline,
                  reuse_instances=reuse)


@pytest.mark.parametrize("inline", [False, True])
async def test_the_listed_actions_come_in_info_only(inline):
    async with TestServer(build_app(_family(_CountEnv, inline))) as server:
        url = str(server.make_url(""))
        async with EnvClient(url, list_actions=4, action_text=False) as client:
            env_id, observation, info = await client.create(task_id="t")
            assert observation == "start" and info["listed_actions"] == ["a0", "a1", "a2"]
            step = await client.step(env_id, "x")
            assert step.observation == "step 1"
            assert step.info["listed_actions"] == ["a0", "a1", "a2", "a3"]
            again = await client.reset(env_id)  # the client asks again at every reset
            assert again.observation == "start" and again.info["listed_actions"] == ["a0", "a1", "a2"]
            # a reset may switch the text back on, and it stays on for the steps after it
            on = await client._call(0, "POST", "/reset", {"env_id": env_id, "action_text": True})
            assert on["observation"] == "start\nValid actions: a0, a1, a2."
            raw_id = client._decode(env_id)[1]
            step = await client._call(0, "POST", "/step", {"env_id": raw_id, "action": "x"})
            assert step["observation"] == "step 1\nValid actions: a0, a1, a2, a3."


@pytest.mark.parametrize("inline", [False, True])
async def test_a_family_that_lists_its_own_actions_leaves_them_out_and_a_reused_instance_follows_each_session(inline):
    async with TestServer(build_app(_family(_OwnListEnv, inline, reuse=True))) as server:
        url = str(server.make_url(""))
        async with EnvClient(url, action_text=False) as quiet, EnvClient(url) as loud:
            env_id, observation, _ = await quiet.create(task_id="t")
            assert observation == "start"
            assert (await quiet.step(env_id, "x")).observation == "step 1"
            await quiet.close(env_id)  # its instance becomes a spare ...
            env_id, observation, _ = await loud.create(task_id="t")  # ... reused here
            assert observation == "start\nMine: a0, a1, a2"
            assert (await loud.step(env_id, "x")).observation == "step 1\nMine: a0, a1, a2, a3"
            await loud.close(env_id)
            env_id, observation, _ = await quiet.create(task_id="t")
            assert observation == "start"
            assert (await quiet.stats())["sessions_reused"] == 2  # one instance served all three


@pytest.mark.parametrize("value", ["no", 0, 1, [], {}])
async def test_a_bad_action_text_is_400(value):
    async with TestServer(build_app(_family(_CountEnv, True))) as server:
        async with EnvClient(str(server.make_url(""))) as client:
            with pytest.raises(EnvServerError) as error:
                await client._call(0, "POST", "/create", {"task_id": "t", "action_text": value})
            assert error.value.status == 400 and "action_text" in error.value.message
            assert (await client.stats())["live_sessions"] == 0


def test_the_client_checks_and_passes_on_its_action_text():
    with pytest.raises(ValueError, match="action_text"):
        EnvClient("http://127.0.0.1:1", action_text="no")
    assert EnvClient("http://127.0.0.1:1", action_text=False).config()["action_text"] is False
    assert EnvClient("http://127.0.0.1:1").config()["action_text"] is True


def test_babyai_leaves_out_its_available_actions_line_but_keeps_them_in_info():
    shown, quiet = BabyAIEnv(), BabyAIEnv()
    quiet.action_text = False
    a, b = shown.reset(GO_TO_RED_BALL), quiet.reset(GO_TO_RED_BALL)
    line = "Available actions: " + ", ".join(a.info["available_actions"])
    assert a.observation.endswith("\n" + line)
    assert b.observation == a.observation[:-len("\n" + line)]
    assert b.info["available_actions"] == a.info["available_actions"]
    a, b = shown.step("turn left"), quiet.step("turn left")
    line = "Available actions: " + ", ".join(a.info["available_actions"])
    assert "Available actions" not in b.observation
    assert b.observation == a.observation[:-len("\n" + line)]


async def test_a_choice_episode_shows_each_action_list_once(babyai):
    reference = BabyAIEnv()
    reference.action_text = False
    first = reference.reset(GO_TO_RED_BALL)
    options0 = first.info["available_actions"]
    tokenizer = load_tokenizer(resolve_model_path("smollm2"))
    backend = ScriptedBackend(tokenizer, [" a"], logprob=-1.0)
    traj = await choice_episode(babyai.url, backend, tokenizer, horizon=1, max_new_tokens=1,
                                action_text=False)
    user = [m["content"] for m in traj.messages if m["role"] == "user"][0]
    assert user.endswith(first.observation + "\n" + options_block(options0))
    assert "Available actions" not in user
    assert user.count("go to red ball 1") == 1


def test_the_choice_recipes_turn_the_text_off_and_the_default_keeps_it():
    import experiments.babyai as babyai_exp
    import experiments.sciworld as sciworld_exp

    for module in (babyai_exp, sciworld_exp):
        assert to_run_config(module.choice_gpu()).agent.actions_in_observation is False
        assert to_run_config(module.grpo_gpu()).agent.actions_in_observation is True
