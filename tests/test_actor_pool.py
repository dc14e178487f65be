"""The actor pool against real environment servers (BabyAI, TextCraft).

References: transformers' chat-template rendering of the whole conversation (for token-exact
trajectories), the engine's own recorded outputs (for the loss mask and logprobs), and a killed
server (for failure handling).
"""

from __future__ import annotations

import asyncio
import dataclasses
import zlib

import jax
import pytest

from fake_backends import RecordingBackend, ScriptedBackend
from agentrl_jax.agent.actor_pool import ActorPool, TaskRef
from agentrl_jax.agent.chat import ChatFormatter
from agentrl_jax.agent.parsing import parse_react
from agentrl_jax.rollout.contract import SamplingParams
from environments.core.client import EnvClient
from agentrl_common.processes import start_env_server


@pytest.fixture(scope="module")
def servers():
    started = {name: start_env_server(name) for name in ("babyai", "textcraft")}
    yield started
    for server in started.values():
        server.stop()


def _pool(backend, clients, tokenizer, max_context=4096, max_new_tokens=64, concurrency=16):
    return ActorPool(backend, clients, ChatFormatter(tokenizer),
                     SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0),
                     max_context=max_context, max_concurrency=concurrency,
                     parser=parse_react, prompt_style="react", response_prefix="",
                     history_turns=0, history_stride=1, option_limits=False, shuffle_options=False)


@pytest.mark.parametrize("style, prefix, reply", [
    ("react", "", "Thought: I should look around.\nAction: turn left"),
    ("action", "Action:", " turn left"),
])
async def test_trajectories_are_token_exact_chat_renderings(servers, tokenizer, style, prefix,
                                                             reply):
    """ids == tokenizer(apply_chat_template(full conversation)); mask == generated spans.
    With a response prefix, the prefix ids open every assistant turn (mask 0)."""
    backend = ScriptedBackend(tokenizer, reply)
    async with EnvClient(servers["babyai"].url) as babyai, \
            EnvClient(servers["textcraft"].url) as textcraft:
        babyai_tasks = (await babyai.tasks("test"))[:2]
        textcraft_tasks = (await textcraft.tasks("test"))[:2]
        pool = _pool(backend, {"babyai": babyai, "textcraft": textcraft}, tokenizer)
        pool.prompt_style, pool.response_prefix = style, prefix
        tasks = [TaskRef("babyai", t) for t in babyai_tasks] + [TaskRef("textcraft", t)
                                                                for t in textcraft_tasks]
        trajectories, stats = await pool.collect(tasks, n_samples=2, horizon=3)
    assert stats.episodes == 8 and stats.dropped == 0
    for t in trajectories:
        assert t.status in ("max_turns", "done") and 1 <= t.num_turns <= 3
        rendered = tokenizer.apply_chat_template(t.messages, tokenize=False,
                                                 add_generation_prompt=False)
        reference = tokenizer.encode(rendered, add_special_tokens=False)
        # The template ends each assistant turn with "<|im_end|>\n"; the trajectory ends right
        # after the generated EOS.
        assert t.token_ids == reference[:len(t.token_ids)]
        assert tokenizer.decode(reference[len(t.token_ids):]) == "\n"
        generated = [i for i, m in zip(t.token_ids, t.loss_mask) if m]
        assert generated == backend.ids * t.num_turns
        assert all(lp == -0.25 for lp, m in zip(t.logprobs, t.loss_mask) if m)
        assert all(lp == 0.0 for lp, m in zip(t.logprobs, t.loss_mask) if not m)
        assert t.messages[2]["content"] == prefix + reply
        if t.env == "babyai":  # "turn left" is a BabyAI action (TextCraft rejects it: valid step)
            assert t.invalid_actions == 0
    # GRPO groups: two samples per task, same group id
    assert [t.group_id for t in trajectories] == [0, 0, 1, 1, 2, 2, 3, 3]


async def test_loss_mask_and_logprobs_are_the_engines_outputs(servers, tokenizer):
    """With the real embedded engine (tiny random model), the masked ids and logprobs are
    exactly what the engine returned, turn by turn, and each turn's input is the trajectory
    so far (nothing decoded and re-encoded)."""
    from agentrl_jax.models.config import ModelConfig
    from agentrl_jax.models.llama import init_model
    from agentrl_jax.rollout.engine.engine import Engine, EngineConfig

    cfg = ModelConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                      num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                      eos_token_id=tokenizer.eos_token_id)
    engine = Engine(init_model(cfg, seed=1), EngineConfig(max_batch=8, max_length=1024,
                                                          decode_steps=4, prefill_chunks=(256,)),
                    tokenizer=tokenizer)
    backend = RecordingBackend(engine)
    try:
        async with EnvClient(servers["babyai"].url) as babyai:
            tasks = [TaskRef("babyai", t) for t in (await babyai.tasks("test"))[:2]]
            pool = _pool(backend, {"babyai": babyai}, tokenizer, max_context=1024,
                         max_new_tokens=12, concurrency=4)
            trajectories, _ = await pool.collect(tasks, n_samples=2, horizon=3, seed=0)
    finally:
        await engine.aclose()
    for t in trajectories:
        assert t.ok, t.error
        calls = backend.calls[t.episode_id]
        assert len(calls) == t.num_turns
        position = t.prompt_length
        for turn, (inputs, result) in enumerate(calls):
            assert inputs == t.token_ids[:len(inputs)]  # the turn saw the exact history
            n = len(result.output_ids)
            assert t.token_ids[len(inputs):len(inputs) + n] == result.output_ids
            assert t.loss_mask[len(inputs):len(inputs) + n] == [1] * n
            assert t.logprobs[len(inputs):len(inputs) + n] == pytest.approx(
                result.output_logprobs)
            position = len(inputs) + n
        assert sum(t.loss_mask) == sum(len(r.output_ids) for _, r in calls)
        assert position <= len(t.token_ids)


async def test_killed_env_server_gives_env_error_and_the_pool_goes_on(tokenizer):
    server = start_env_server("babyai")
    backend = ScriptedBackend(tokenizer, "Thought: go\nAction: move forward", delay=0.05)
    try:
        async with EnvClient(server.url, timeout=5.0, retries=1) as client:
            tasks = [TaskRef("babyai", t) for t in (await client.tasks("test"))[:6]]
            pool = _pool(backend, {"babyai": client}, tokenizer, concurrency=6)
            collect = asyncio.create_task(pool.collect(tasks, n_samples=2, horizon=40))
            await asyncio.sleep(1.0)
            server.stop(grace=1.0)
            trajectories, stats = await asyncio.wait_for(collect, timeout=60)
    finally:
        server.stop()
    statuses = stats.statuses
    assert statuses.get("env_error", 0) >= 1, statuses
    assert stats.dropped == statuses.get("env_error", 0)
    failed = [t for t in trajectories if not t.ok]
    assert all(t.error for t in failed)
    # a fresh server: the same pool configuration works again
    with start_env_server("babyai") as fresh:
        async with EnvClient(fresh.url) as client:
            pool = _pool(backend, {"babyai": client}, tokenizer)
            _, stats = await pool.collect(tasks[:2], n_samples=1, horizon=2)
    assert stats.dropped == 0


async def test_async_pool_does_not_wait_for_slow_episodes(servers, tokenizer):
    """Async mode overlaps episodes; lock-step rounds are bounded by the slowest member.
    Each episode has exactly one slow turn (0.3 s; the others 0.02 s), at a turn that depends on
    the episode. The behaviour, not the wall time: async, episodes start later turns while
    another episode's slow earlier turn is still generating; lock-step, a turn never starts
    while a turn of an earlier round is in flight."""

    class VariableDelay(ScriptedBackend):
        turns: dict[str, int] = {}
        in_flight: dict[str, int] = {}  # session -> its turn being generated
        ahead = 0  # turns started while an earlier turn of another episode was generating

        async def generate(self, input_ids, sampling=None, session_id=None, rid=None):
            turn = self.turns[session_id] = self.turns.get(session_id, -1) + 1
            if any(t < turn for t in self.in_flight.values()):
                VariableDelay.ahead += 1
            self.in_flight[session_id] = turn
            slow = (zlib.crc32(session_id.encode()) + turn) % 4 == 0
            try:
                await asyncio.sleep(0.3 if slow else 0.02)
            finally:
                del self.in_flight[session_id]
            return await super().generate(input_ids, sampling, session_id, rid)

    backend = VariableDelay(tokenizer, "Thought: go\nAction: turn left")
    async with EnvClient(servers["babyai"].url) as client:
        tasks = [TaskRef("babyai", t) for t in (await client.tasks("test"))[:8]]
        pool = _pool(backend, {"babyai": client}, tokenizer, concurrency=16)
        _, async_stats = await pool.collect(tasks, n_samples=2, horizon=4)
        async_ahead, VariableDelay.ahead = VariableDelay.ahead, 0
        _, lock_stats = await pool.collect(tasks, n_samples=2, horizon=4, lockstep=True)
    assert async_stats.dropped == lock_stats.dropped == 0
    assert async_ahead > 0 and VariableDelay.ahead == 0, (async_ahead, VariableDelay.ahead)


async def test_every_finished_episode_ends_its_session_once(servers, tokenizer):
    """Each episode ends its session exactly once, after its last generation (so the backend
    may free the session's cached prefix and pin), failed or not, in async and lock-step."""

    class Ending(ScriptedBackend):
        def __init__(self, *a):
            super().__init__(*a)
            self.order: list[tuple[str, str]] = []

        async def generate(self, input_ids, sampling=None, session_id=None, rid=None):
            self.order.append(("generate", session_id))
            return await super().generate(input_ids, sampling, session_id, rid)

        def end_session(self, session_id):
            self.order.append(("end", session_id))

    backend = Ending(tokenizer, "Thought: go\nAction: turn left")
    async with EnvClient(servers["babyai"].url) as client:
        tasks = [TaskRef("babyai", t) for t in (await client.tasks("test"))[:3]]
        pool = _pool(backend, {"babyai": client}, tokenizer, concurrency=4)
        trajectories, _ = await pool.collect(tasks, n_samples=2, horizon=3)
        more, _ = await pool.collect(tasks[:1], n_samples=2, horizon=2, lockstep=True)
    episode_ids = [t.episode_id for t in trajectories + more]
    ended = [sid for what, sid in backend.order if what == "end"]
    assert sorted(ended) == sorted(episode_ids) and len(set(ended)) == 8
    for sid in episode_ids:
        events = [what for what, s in backend.order if s == sid]
        assert events[-1] == "end" and events.count("generate") >= 1


def test_jax_has_the_test_devices():
    assert len(jax.devices()) >= 1
    assert dataclasses.is_dataclass(SamplingParams)


async def test_every_turn_draws_fresh_randomness_and_runs_reproduce(servers, tokenizer):
    """Each generation call of an episode gets its own seed (one seed reused over a
    near-identical prompt makes the agent repeat its last turn), seeds differ across the
    samples of a group, and the same run seed gives the same seeds again."""

    async def seeds_of_run(seed):
        backend = ScriptedBackend(tokenizer, "Action: turn left")
        async with EnvClient(servers["babyai"].url) as client:
            tasks = [TaskRef("babyai", t) for t in (await client.tasks("test"))[:2]]
            pool = _pool(backend, {"babyai": client}, tokenizer)
            trajectories, _ = await pool.collect(tasks, n_samples=2, horizon=4, seed=seed)
        return [[c.sampling.seed for c in backend.log if c.session_id == t.episode_id]
                for t in trajectories]

    first = await seeds_of_run(7)
    assert all(len(s) == 4 for s in first)  # four turns each (turn left never ends BabyAI)
    flat = [x for s in first for x in s]
    assert None not in flat
    assert len(set(flat)) == len(flat)  # no two calls share a seed: turns, samples, groups
    assert await seeds_of_run(7) == first  # reproducible from the run seed
    other = [x for s in await seeds_of_run(8) for x in s]
    assert not set(other) & set(flat)
