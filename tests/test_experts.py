"""Expert recording never hangs: minigrid's BabyAIBot loops forever on some BabyAI levels (the
cause of a recording that printed nothing on the GPU machine); the bounded subgoal
stack and the per-action deadline end such an episode as failed, leave every other episode's
actions unchanged (against the raw bot), and the recorder's worker processes write what one
process writes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time

import pytest

from agentrl_jax.agent.experts import ExpertBackend, ExpertTimeout, call_with_deadline
from environments.babyai.expert import BabyAIExpertPolicy, BoundedSubgoalStack
from environments.core.base import ExpertStuck
from agentrl_jax.agent.trajectory import Trajectory
from agentrl_jax.rollout.contract import RolloutError

pytestmark = pytest.mark.timeout(300)

# a train task on which the raw bot never returns (found by scanning 1,500 sampled train tasks:
# 12 such tasks, all of this level)
STUCK_TASK = "BabyAI-UnlockToUnlock-v0/seed=340"


def test_bounded_stack_limits_length_and_reads():
    s = BoundedSubgoalStack([1, 2], max_len=3, max_reads=4)
    s.append(3)
    with pytest.raises(ExpertStuck, match="3 subgoals"):
        s.append(4)
    assert list(s) == [1, 2, 3]
    assert [s[-1] for _ in range(4)] == [3, 3, 3, 3]
    with pytest.raises(ExpertStuck, match="4 times"):
        _ = s[-1]
    s.reset()
    assert s[0] == 1 and s.pop() == 3 and len(s) == 2
    with pytest.raises(ValueError):
        BoundedSubgoalStack([], max_len=0)


def test_deadline_interrupts_a_python_loop_and_restores_the_handler():
    before = signal.getsignal(signal.SIGALRM)
    assert call_with_deadline(lambda: 7, 1.0) == 7

    def spin():
        while True:
            pass

    t0 = time.monotonic()
    with pytest.raises(ExpertTimeout):
        call_with_deadline(spin, 0.2)
    assert 0.15 < time.monotonic() - t0 < 2.0
    assert signal.getsignal(signal.SIGALRM) is before


@pytest.mark.timeout(30)
def test_deadline_fires_again_when_its_timeout_is_swallowed():
    """Python drops an exception raised in a finaliser; the call must still end: the first
    ExpertTimeout is caught here (as a finaliser would lose it), the repeated signal ends it."""
    from agentrl_jax.agent.experts import DEADLINE_RETRY_S

    swallowed = []

    def spin() -> None:
        while True:
            try:
                while True:
                    pass
            except ExpertTimeout:
                if swallowed:
                    raise
                swallowed.append(time.monotonic())

    t0 = time.monotonic()
    with pytest.raises(ExpertTimeout):
        call_with_deadline(spin, 0.2)
    assert len(swallowed) == 1
    assert time.monotonic() - t0 < 0.2 + DEADLINE_RETRY_S + 1.0


def test_deadline_keeps_an_outer_timer():
    """A pending outer SIGALRM timer (pytest-timeout uses one) keeps its due time: re-armed
    with what is left when the call ends first, its own handler run when it is due first."""
    class Outer(Exception):
        pass

    def outer(signum, frame):
        raise Outer()

    before = signal.signal(signal.SIGALRM, outer)
    old = signal.setitimer(signal.ITIMER_REAL, 30.0)
    try:
        assert call_with_deadline(lambda: time.sleep(0.1) or 5, 1.0) == 5
        left = signal.getitimer(signal.ITIMER_REAL)[0]
        assert 29.0 < left <= 29.95
        assert signal.getsignal(signal.SIGALRM) is outer
        signal.setitimer(signal.ITIMER_REAL, 0.2)

        def spin():
            while True:
                pass

        with pytest.raises(Outer):
            call_with_deadline(spin, 5.0)
        # the one-shot outer timer was spent by its own handler: nothing is left armed (a
        # re-armed 1 ms remainder fired a second Outer into the caller: a flaky CI failure)
        assert signal.getitimer(signal.ITIMER_REAL)[0] == 0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
        if old[0]:
            signal.setitimer(signal.ITIMER_REAL, *old)
    # off the main thread there is no SIGALRM: the call runs without a limit
    out = []
    th = threading.Thread(target=lambda: out.append(call_with_deadline(lambda: 3, 0.01)))
    th.start()
    th.join()
    assert out == [3]


def test_raw_bot_hangs_and_bounded_policy_fails_fast(startup_heap_frozen):
    """The raw bot does not return within 3 s on STUCK_TASK (its plan grows without end); the
    policy with the bounded stack raises ExpertStuck in well under a second."""
    from environments.babyai.expert import BabyAIBotExpert

    raw = BabyAIBotExpert(STUCK_TASK)
    with pytest.raises(ExpertTimeout):
        for turn in range(20):
            call_with_deadline(raw.act, 3.0)
            raw.mirror()
    assert len(raw.bot.stack) > 1000

    policy = BabyAIExpertPolicy(STUCK_TASK)
    t0 = time.monotonic()
    with pytest.raises(ExpertStuck):
        for _ in range(20):
            policy.act("")
    assert time.monotonic() - t0 < 1.0
    assert len(policy.stack) <= policy.stack.max_len


def test_bounded_policy_acts_like_the_raw_bot():
    """On 48 sampled train tasks (every level family the bot can do), the bounded policy's
    action sequence equals the raw bot's (independent loop over BabyAIBotExpert)."""
    from environments.babyai.catalog import BabyAICatalog
    from environments.babyai.expert import BOT_UNSOLVABLE, BabyAIBotExpert
    from agentrl_jax.training.jobs.record_experts import sample_tasks

    ids = list(BabyAICatalog().task_ids("train"))
    tasks = [t for t in sample_tasks(ids, 60, seed=3)
             if t.split("/")[0] not in BOT_UNSOLVABLE | {"BabyAI-UnlockToUnlock-v0"}][:48]
    for task in tasks:
        raw = BabyAIBotExpert(task)
        expected = []
        for _ in range(20):
            a = call_with_deadline(raw.act, 5.0)
            expected.append(a)
            if a is None or any(raw.mirror()[1:]):
                break
        policy = BabyAIExpertPolicy(task)
        got = [policy.act("") for _ in expected]
        assert got == expected, task


class _Formatter:
    def encode_text(self, text: str) -> list[int]:
        return [ord(c) for c in text]


class _Spinner:
    def __init__(self, task_id: str):
        pass

    def act(self, observation: str) -> str | None:
        while True:
            pass


class _Echo:
    def __init__(self, task_id: str):
        self.task_id = task_id

    def act(self, observation: str) -> str | None:
        return f"go {self.task_id}"


def _session(backend: ExpertBackend, env: str, task: str, sid: str) -> None:
    t = Trajectory(env=env, task_id=task, group_id=0, sample_index=0, episode_id=sid)
    t.messages = [{"role": "user", "content": "observation"}]
    backend.sessions[sid] = t


def test_backend_turns_a_stuck_expert_into_a_failed_turn():
    backend = ExpertBackend(_Formatter(), "Action:", "\n", None,
                            policies={"spin": _Spinner, "echo": _Echo}, act_timeout_s=0.3)
    _session(backend, "spin", "x", "s1")
    _session(backend, "echo", "y", "s2")
    t0 = time.monotonic()
    with pytest.raises(RolloutError, match="ExpertTimeout"):
        asyncio.run(backend.generate([1, 2], session_id="s1"))
    assert time.monotonic() - t0 < 3.0
    out = asyncio.run(backend.generate([1, 2], session_id="s2"))
    assert out.output_ids == [ord(c) for c in " go y\n"] and out.finish_reason == "stop"
    assert dict(backend.failures) == {"ExpertTimeout": 1}
    # the BabyAI planner on a task it cannot solve: stuck, however long a busy machine takes to
    # plan each action (its own backend, with room for that: 0.3 s timed out under load in CI)
    planner = ExpertBackend(_Formatter(), "Action:", "\n", None,
                            policies={"babyai": BabyAIExpertPolicy}, act_timeout_s=60.0)
    _session(planner, "babyai", STUCK_TASK, "s3")
    with pytest.raises(RolloutError, match="ExpertStuck"):
        for _ in range(20):
            asyncio.run(planner.generate([1], session_id="s3"))
    assert dict(planner.failures) == {"ExpertStuck": 1}
    with pytest.raises(ValueError):
        ExpertBackend(_Formatter(), "", "\n", None, act_timeout_s=-1)


def test_shard_bounds_and_meta_merge():
    from agentrl_jax.training.jobs.record_experts import merge_shard_metas, shard_bounds

    assert shard_bounds(10, 3) == [(0, 3), (3, 6), (6, 10)]
    assert shard_bounds(2, 5) == [(0, 1), (1, 2)]
    with pytest.raises(ValueError):
        shard_bounds(0, 2)
    a = {"env": "babyai", "episodes": 4, "statuses": {"done": 3, "engine_error": 1},
         "successful": 3, "success_rate": 0.75, "mean_turns_successful": 2.0,
         "assistant_tokens_successful": 30, "tokens_successful": 300,
         "expert_failures": {"ExpertStuck": 1}, "shard": [0, 4], "seconds": 1.0}
    b = {"env": "babyai", "episodes": 2, "statuses": {"done": 1, "max_turns": 1},
         "successful": 1, "success_rate": 0.5, "mean_turns_successful": 6.0,
         "assistant_tokens_successful": 10, "tokens_successful": 90, "expert_failures": {},
         "shard": [4, 6], "seconds": 2.0}
    m = merge_shard_metas([a, b])
    assert m["episodes"] == 6 and m["successful"] == 4
    assert m["statuses"] == {"done": 4, "engine_error": 1, "max_turns": 1}
    assert m["success_rate"] == pytest.approx(4 / 6)
    assert m["mean_turns_successful"] == pytest.approx((3 * 2 + 6) / 4)
    assert (m["assistant_tokens_successful"], m["tokens_successful"]) == (40, 390)
    assert m["expert_failures"] == {"ExpertStuck": 1} and "shard" not in m


def test_workers_record_what_one_process_records(tmp_path):
    """2 worker processes and 1 process: the same TextCraft episodes in the same order (token
    ids equal), merged meta counts equal; progress lines come every N episodes."""
    from experiments.smoke import sft as get_config

    from agentrl_jax.training.config.experiment import to_run_config
    from agentrl_jax.training.jobs.record_experts import record_experts_parallel

    c = get_config()
    c.env.names = "textcraft"
    c.rollout.max_context = 1024
    c = to_run_config(c)
    lines: list[str] = []
    one = record_experts_parallel(c, "textcraft", 6, str(tmp_path / "one"), workers=1,
                                  horizon=12, progress_every=2,
                                  say=lambda m="", **k: lines.append(str(m)))
    two = record_experts_parallel(c, "textcraft", 6, str(tmp_path / "two"), workers=2,
                                  horizon=12, shard_timeout_s=240,
                                  say=lambda m="", **k: lines.append(str(m)))
    assert sum("experts: 2/6" in x or "experts: 4/6" in x or "experts: 6/6" in x
               for x in lines) == 3

    def read(d):
        with open(os.path.join(d, "textcraft.jsonl")) as f:
            return [json.loads(x) for x in f]

    a, b = read(str(tmp_path / "one")), read(str(tmp_path / "two"))
    assert [t["task_id"] for t in a] == [t["task_id"] for t in b] and len(a) == 6
    assert [t["token_ids"] for t in a] == [t["token_ids"] for t in b]
    for key in ("episodes", "successful", "statuses", "tokens_successful", "tokenizer"):
        assert one[key] == two[key], key
    assert two["workers"] == 2 and two["failed_shards"] == []
    with open(tmp_path / "two" / "textcraft.meta.json") as f:
        assert json.load(f)["episodes"] == 6
    assert not os.path.exists(tmp_path / "two" / ".textcraft.shards")
