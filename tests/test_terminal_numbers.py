"""What the terminal says matches what the run stores and does: the step numbers of
``[step k/n]`` are those of ``metrics.jsonl``, the train episodes and the checkpoints; a round's
turn count is exactly the turns its episodes append (another round running at the same time is
not mixed in); every compilation of an announced jitted function is announced."""

from __future__ import annotations

import asyncio
import re
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np

from agentrl_common.jsonl_files import read_records
from agentrl_jax import compile_notice
from agentrl_jax.agent.trajectory import Trajectory
from agentrl_jax.learner.learner import announced
from agentrl_jax.training.outputs.progress import OFF, EpisodeProgress, TurnCounter
from test_trainer_failed_step import (FailingPool, RecordingBackend, RecordingLearner,
                                      fake_loop_config, run_fake_loop)


def test_printed_steps_are_the_stored_steps(tmp_path, capsys):
    learner = RecordingLearner()
    run_fake_loop(fake_loop_config(3, save_every=2, trajectory_share=1.0), tmp_path, learner,
                  RecordingBackend(), FailingPool(failing=set()))
    printed = [int(k) for k in re.findall(r"^\[step (\d+)/3\]", capsys.readouterr().out, re.M)]
    assert printed == [1, 2, 3]
    assert [step for step, _ in learner.writer.rows] == printed  # metrics.jsonl's rows
    episodes = read_records(str(tmp_path / "trajectories_train.jsonl.gz"))
    assert [t["step"] for t in episodes] == [1] * 4 + [2] * 4 + [3] * 4  # was 0, 1, 2
    assert learner.saved == [2, 3]  # checkpoints: after update 2 and the last one


class SlowBackend:
    """``generate`` answers after a short sleep with ``n`` tokens; ``abort`` marks a call the
    engine aborted (an episode does not append it as a turn)."""

    def __init__(self):
        self.calls = 0

    async def generate(self, prompt, n: int, abort: bool = False):
        self.calls += 1
        await asyncio.sleep(0.001 * (self.calls % 3))
        return SimpleNamespace(output_ids=[1] * n, finish_reason="abort" if abort else "stop")


async def _episode(counter: TurnCounter, turns: list[int], abort_at: int | None) -> Trajectory:
    """An episode as ``agent/episode.py`` runs one: each answer that is not aborted becomes a
    turn of ``len(output_ids)`` generated tokens."""
    t = Trajectory(env="babyai", task_id="0", group_id=0, sample_index=0, horizon=len(turns))
    for i, n in enumerate(turns):
        result = await counter.generate([0], n, abort=i == abort_at)
        if result.finish_reason == "abort":
            break
        t.append(list(result.output_ids), generated=True, turn=t.num_turns)
        t.num_turns += 1
    return t


async def _round(counter, episodes, say):
    async with EpisodeProgress(len(episodes), "round", OFF, counter=counter) as progress:
        async def one(turns, abort_at):
            t = await _episode(counter, turns, abort_at)
            progress(t)
            return t
        trajectories = await asyncio.gather(*(one(*e) for e in episodes))
    return progress.turns(), trajectories


def test_turn_count_is_each_rounds_own_while_rounds_overlap():
    async def main():
        counter = TurnCounter(SlowBackend())
        a = asyncio.ensure_future(_round(counter, [([3, 4, 5], None), ([2, 2], 1)], None))
        b = asyncio.ensure_future(_round(counter, [([7] * 5, None), ([1], None)], None))
        return await a, await b
    (turns_a, trajs_a), (turns_b, trajs_b) = asyncio.run(main())
    # by hand: round a = 3 + 1 turns (the 2nd episode's 2nd answer was aborted), 12 + 2 tokens;
    # round b = 5 + 1 turns, 35 + 1 tokens
    assert turns_a == (4, 14) and turns_b == (6, 36)
    for turns, trajs in ((turns_a, trajs_a), (turns_b, trajs_b)):
        assert turns == (sum(t.num_turns for t in trajs), sum(t.num_generated for t in trajs))


def test_turns_generated_elsewhere_count_from_the_finished_episodes():
    """Generations that do not run in the round's tasks (actor worker processes) are counted
    from the episodes the round receives."""
    async def main():
        counter = TurnCounter(SlowBackend())
        outside = [asyncio.ensure_future(_episode(counter, [2, 3], None)) for _ in range(2)]
        trajs = await asyncio.gather(*outside)  # before the round: not in its context
        async with EpisodeProgress(2, "round", OFF, counter=counter) as progress:
            assert progress.turns() == (0, 0)
            for t in trajs:
                progress(t)
            return progress.turns()
    assert asyncio.run(main()) == (4, 10)


def test_every_new_shape_of_an_announced_function_is_announced():
    lines: list[str] = []
    fn = announced(jax.jit(lambda params, tokens, mask: (tokens * mask).sum() + params),
                   "the log-prob pass")
    compile_notice.set_announcer(lines.append)
    try:
        fn(1.0, jnp.ones((2, 8)), jnp.ones((2, 8)))
        fn(2.0, np.zeros((2, 8), np.float32), np.ones((2, 8), np.float32))  # compiled already
        assert len(lines) == 2
        assert lines[0] == "compiling the log-prob pass for length 8 ..."
        assert re.fullmatch(r"compiling the log-prob pass for length 8 \.\.\. done in "
                            r"\d+\.\d s", lines[1]), lines[1]
        fn(1.0, jnp.ones((2, 16)), jnp.ones((2, 16)))  # a new length bucket: a new compile
        assert lines[2] == "compiling the log-prob pass for length 16 ..." and len(lines) == 4
        with compile_notice.quiet():  # a phase announced as a whole
            fn(1.0, jnp.ones((2, 32)), jnp.ones((2, 32)))
        assert len(lines) == 4
        fn(1.0, jnp.ones((2, 32)), jnp.ones((2, 32)))  # compiled inside the quiet phase
        assert len(lines) == 4
        fn(1.0, jnp.ones((4, 32), jnp.int32), jnp.ones((4, 32), jnp.int32))  # rows and dtype
        assert lines[4] == "compiling the log-prob pass for length 32 ..."
    finally:
        compile_notice.set_announcer(None)
    fn(1.0, jnp.ones((2, 64)), jnp.ones((2, 64)))  # no announcer (a library user): silent
    assert len(lines) == 6


def test_a_trace_through_an_announced_function_is_no_compile():
    lines: list[str] = []
    fn = announced(jax.jit(lambda params, tokens, mask: tokens * mask + params), "the value pass")
    compile_notice.set_announcer(lines.append)
    try:
        jax.make_jaxpr(fn)(1.0, jnp.ones((2, 8)), jnp.ones((2, 8)))  # inspection: no compile
        assert lines == []
        fn(1.0, jnp.ones((2, 8)), jnp.ones((2, 8)))  # the real first call still is announced
        assert lines[0] == "compiling the value pass for length 8 ..."
    finally:
        compile_notice.set_announcer(None)


class _Writes:
    """A stdout that records each ``write`` call (a system call each, under PYTHONUNBUFFERED)."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def test_a_printed_line_is_one_write(monkeypatch):
    """The trainer's, SFT's and the recorder's lines reach stdout in one write, so another
    stream's line (absl's warnings on stderr, the same pipe) cannot land between a line and its
    newline, as it did in CI with PYTHONUNBUFFERED set ('... (0.6 s)W1129 ... died'). ``print``
    itself writes the text and the end separately (the reference)."""
    from agentrl_jax.training.jobs import record_experts
    from agentrl_jax.training.outputs.progress import say_line

    for args, kwargs in ((("step 2/4 rollout",), {}), (("a", 3), {"sep": ", "}),
                         (("announce ...",), {"end": ""}), ((), {})):
        reference = _Writes()
        print(*args, **kwargs, file=reference)
        assert len(reference.writes) > 1 or not args  # what goes wrong with print
        for say in (say_line, record_experts.say_flush):
            out = _Writes()
            monkeypatch.setattr("sys.stdout", out)
            say(*args, **kwargs)
            monkeypatch.undo()
            assert out.writes == ["".join(reference.writes)], (say, args, kwargs)
