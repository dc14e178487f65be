"""The actor pool's loop clocks (``agent/loop_times.py``) against known delays.

A backend that sleeps a fixed time per generation and reports a fixed engine latency, and an
environment client that sleeps a fixed time per call: each episode's generation, environment and
queueing seconds must match the delays (hand-computed), and the measured parts must add up to
the episode's wall time.
"""

from __future__ import annotations

import asyncio

import pytest

from agentrl_jax.agent.actor_pool import ActorPool, TaskRef
from agentrl_jax.agent.chat import ChatFormatter
from agentrl_jax.agent.parsing import parse_react
from agentrl_jax.rollout.contract import GenerateResult, SamplingParams
from fake_backends import QuietBackend
from environments.core.base import StepResult

GEN_S, ENGINE_S, ENV_S = 0.03, 0.02, 0.01
HORIZON = 3


class SleepyBackend(QuietBackend):
    """Answers " turn left" + EOS after ``GEN_S`` seconds, reporting ``ENGINE_S`` of latency."""

    name = "sleepy"

    def __init__(self, tokenizer):
        self.ids = tokenizer.encode(" turn left", add_special_tokens=False) + [
            tokenizer.eos_token_id]

    async def generate(self, input_ids, sampling=None, session_id=None, rid=None):
        await asyncio.sleep(GEN_S)
        return GenerateResult(output_ids=list(self.ids), output_logprobs=[-0.1] * len(self.ids),
                              finish_reason="stop", prompt_tokens=len(input_ids),
                              latency_s=ENGINE_S)


class SleepyEnv:
    """An environment client whose every call takes ``ENV_S`` seconds; never done."""

    def __init__(self):
        self.calls = 0

    async def create(self, task_id=None, seed=None):
        self.calls += 1
        await asyncio.sleep(ENV_S)
        return f"env-{self.calls}", "You see a wall.", {"instructions": "Reach the goal."}

    async def step(self, env_id, action):
        self.calls += 1
        await asyncio.sleep(ENV_S)
        return StepResult(observation="You see a door.", reward=0.0, done=False,
                          truncated=False, info={})

    async def close(self, env_id):
        self.calls += 1
        await asyncio.sleep(ENV_S)


async def test_loop_times_match_the_delays_and_add_up(tokenizer):
    env = SleepyEnv()
    pool = ActorPool(SleepyBackend(tokenizer), {"babyai": env}, ChatFormatter(tokenizer),
                     SamplingParams(max_new_tokens=16), max_context=4096, max_concurrency=2,
                     parser=parse_react, prompt_style="action", response_prefix="Action:",
                     history_turns=0, history_stride=1, option_limits=False, shuffle_options=False)
    trajectories, stats = await pool.collect([TaskRef("babyai", "t0"), TaskRef("babyai", "t1")],
                                             n_samples=2, horizon=HORIZON)
    times = pool.loop_times
    assert stats.episodes == 4 and stats.dropped == 0
    assert all(t.num_turns == HORIZON and t.invalid_actions == 0 for t in trajectories)
    assert times.episodes == 4 and times.turns == 4 * HORIZON
    # per episode: create + (horizon) steps + close
    assert times.env_calls == env.calls == 4 * (HORIZON + 2)
    assert times.engine_s == pytest.approx(4 * HORIZON * ENGINE_S)
    # sleeps last at least their delay; a loaded 2-core box may add up to a few ms each
    assert 4 * HORIZON * GEN_S <= times.gen_s < 4 * HORIZON * (GEN_S + 0.05)
    assert env.calls * ENV_S <= times.env_s < env.calls * (ENV_S + 0.05)
    # max_concurrency=2: the last two episodes wait for the first two to end
    one_episode = HORIZON * GEN_S + (HORIZON + 2) * ENV_S
    assert 2 * one_episode <= times.gate_s < 2 * one_episode + 0.5
    assert times.host_s > 0
    assert times.accounted_s == pytest.approx(times.wall_s, rel=0.05, abs=0.02)
    # the sum of the episodes' walls: two run at once, the other two queue behind them
    assert times.wall_s >= 4 * one_episode + 2 * one_episode
