"""Every turn records the weights version that generated it; the oldest turn decides staleness
(before: one trajectory could mix two policy versions when the weights changed mid-episode,
and only the version the episode started with was recorded).

A fake backend whose weights change after a given number of generate calls (as the embedded
engine's do when a weight sync lands during an overlapped rollout) and a fake environment that
never ends an episode before the horizon.
"""

from __future__ import annotations

import asyncio

from agentrl_jax.agent.actor_pool import ActorPool, TaskRef
from agentrl_jax.agent.chat import ChatFormatter
from agentrl_jax.agent.parsing import parse_react
from agentrl_jax.agent.trajectory import Trajectory
from agentrl_jax.rollout.contract import GenerateResult, SamplingParams
from agentrl_jax.training.rl.stages import fresh_trajectories
from fake_backends import QuietBackend
from environments.core.base import StepResult


class SwitchingBackend(QuietBackend):
    """Replies ``Action: go``; its weights go from ``version`` to ``version + 1`` after
    ``switch_after`` generate calls (the swap lands while a call is in flight)."""

    name = "switching"

    def __init__(self, tokenizer, version: int, switch_after: int):
        self.ids = tokenizer.encode(" go", add_special_tokens=False) + [tokenizer.eos_token_id]
        self.version, self.switch_after, self.calls = version, switch_after, 0

    async def generate(self, input_ids, sampling=None, session_id=None, rid=None):
        self.calls += 1
        await asyncio.sleep(0.001)
        if self.calls == self.switch_after:
            self.version += 1  # mid-call: this turn's later tokens come from the new weights
        return GenerateResult(output_ids=list(self.ids), output_logprobs=[-0.5] * len(self.ids),
                              finish_reason="stop", weight_version=str(self.version))


class EndlessEnv:
    """An environment client whose episodes only end at the horizon."""

    def __init__(self):
        self.n = 0

    async def create(self, task_id=None, seed=None):
        self.n += 1
        return f"e{self.n}", "You are in a room.", {"instructions": "Say go."}

    async def step(self, env_id, action):
        return StepResult(observation="Nothing happens.", reward=0.0, done=False,
                          truncated=False, info={})

    async def close(self, env_id):
        return True


def _collect(tokenizer, backend, n_episodes: int, horizon: int, start_version: int):
    pool = ActorPool(backend, {"fake": EndlessEnv()}, ChatFormatter(tokenizer),
                     SamplingParams(max_new_tokens=8), max_context=2048, max_concurrency=1,
                     parser=parse_react, prompt_style="action", response_prefix="Action:",
                     history_turns=0, history_stride=1, option_limits=False, shuffle_options=False)
    tasks = [TaskRef("fake", str(i)) for i in range(n_episodes)]
    trajectories, _ = asyncio.run(pool.collect(tasks, 1, horizon, policy_version=start_version,
                                               version_fn=lambda: backend.version))
    return trajectories


def test_weights_that_change_mid_episode_are_recorded_per_turn(tokenizer):
    # one episode at a time (max_concurrency=1), 4 turns each: the weights change during the
    # 6th generate call, i.e. the 2nd turn of the 2nd episode
    backend = SwitchingBackend(tokenizer, version=3, switch_after=6)
    first, second, third = _collect(tokenizer, backend, 3, horizon=4, start_version=3)
    assert first.turn_versions == [3, 3, 3, 3] and not first.mixed_versions
    # the 2nd turn started with version 3 and ended with version 4: it counts as 3 (its oldest
    # tokens); the turns after it are version 4
    assert second.turn_versions == [3, 3, 4, 4] and second.mixed_versions
    assert second.policy_version == 3 and second.oldest_version == 3
    assert third.turn_versions == [4, 4, 4, 4] and third.oldest_version == 4
    assert third.policy_version == 3  # the version the rollout started with
    assert all(len(t.turn_versions) == t.num_turns == 4 for t in (first, second, third))
    assert third.to_json(5)["turn_versions"] == [4, 4, 4, 4]  # logged with the trajectory


def test_the_oldest_turn_decides_staleness():
    def traj(versions: list[int], start: int) -> Trajectory:
        t = Trajectory(env="e", task_id="t", group_id=0, sample_index=0, policy_version=start)
        t.turn_versions, t.num_turns = list(versions), len(versions)
        return t

    mixed = traj([3, 3, 4, 4], start=3)
    newer = traj([4, 4], start=3)  # started before a sync, every turn after it
    untouched = traj([], start=3)  # failed before its first turn: the start version
    # update 4 (weights version 4 is the newest), on-policy: only all-version-4 turns
    assert fresh_trajectories([mixed, newer, untouched], 4, 0) == [newer]
    # update 5 with max_staleness=1: a turn of version 3 is 2 updates old, whatever its
    # later turns; the episode that started at 3 but generated only with 4 is fresh
    assert fresh_trajectories([mixed, newer, untouched], 5, 1) == [newer]
    assert fresh_trajectories([mixed, newer, untouched], 4, 1) == [mixed, newer, untouched]
    assert fresh_trajectories([mixed, newer], 6, 1) == []
