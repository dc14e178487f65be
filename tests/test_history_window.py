"""The bounded history window (``agent.history_turns``, ``agent.history_stride``): what each
prompt holds, that prompts stop growing, that every generated id is trained in exactly the
context the engine was given, that the episode's advantage is counted once per episode, and
that the config refuses the estimators and losses the chunked rows would get wrong.

References: the SmolLM2 chat template rendering hand-written message lists; the engine's recorded
inputs and outputs; a no-cache forward of the tiny model over each training row; GRPO computed by
hand in NumPy.
"""

from __future__ import annotations

import array
import asyncio
import dataclasses

import numpy as np
import pytest

from agentrl_jax.agent.actor_pool import ActorPool, TaskRef
from agentrl_jax.agent.chat import ChatFormatter
from agentrl_jax.agent.parsing import ParsedAction, parse_react
from agentrl_jax.agent.trajectory import Trajectory
from agentrl_jax.rollout.contract import SamplingParams
from agentrl_jax.training.rl.batching import assemble_batch, training_rows
from agentrl_jax.training.config.sections import RunConfig
from environments.core.base import StepResult
from fake_backends import RecordingBackend, ScriptedBackend

GOAL = "Goal: reach the red door."


class CountingEnv:
    """Episodes that end only at the horizon; step ``k`` of an episode answers
    ``"You took step k."``; an episode of task ``"win"`` earns reward 1 on its 3rd step."""

    def __init__(self):
        self.n, self.steps, self.tasks = 0, {}, {}

    async def create(self, task_id=None, seed=None):
        self.n += 1
        env_id = f"e{self.n}"
        self.steps[env_id], self.tasks[env_id] = 0, task_id
        return env_id, GOAL, {"instructions": "Say go."}

    async def step(self, env_id, action):
        self.steps[env_id] += 1
        k = self.steps[env_id]
        reward = 1.0 if self.tasks[env_id] == "win" and k == 3 else 0.0
        return StepResult(observation=f"You took step {k}.", reward=reward, done=False,
                          truncated=False, info={})

    async def close(self, env_id):
        return True


def _go_backend(tokenizer, takes_id_arrays: bool = False) -> ScriptedBackend:
    """Replies `` go`` + EOS; logprobs differ per call and position; records every call."""
    return ScriptedBackend(tokenizer, " go", logprob=lambda k, i: -(k + 1 + i / 10) / 100,
                           takes_id_arrays=takes_id_arrays)


def _collect(tokenizer, backend, history_turns: int, horizon: int, tasks=("t",), samples=1,
             max_context: int = 4096, formatter=None, history_stride: int = 1):
    pool = ActorPool(backend, {"fake": CountingEnv()},
                     formatter or ChatFormatter(tokenizer),
                     SamplingParams(max_new_tokens=8, seed=5), max_context=max_context,
                     max_concurrency=8, parser=parse_react, prompt_style="action",
                     response_prefix="Action:", history_turns=history_turns,
                     history_stride=history_stride, option_limits=False, shuffle_options=False)
    trajectories, _ = asyncio.run(pool.collect([TaskRef("fake", t) for t in tasks], samples,
                                               horizon))
    return trajectories


def _rendered(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """The chat template's ids of ``messages`` with the generation prompt, then ``Action:``."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return (tokenizer.encode(text, add_special_tokens=False)
            + tokenizer.encode("Action:", add_special_tokens=False))


def test_windowed_prompts_hold_exactly_the_expected_messages(tokenizer):
    backend = _go_backend(tokenizer)
    (traj,) = _collect(tokenizer, backend, history_turns=2, horizon=5)
    (calls,) = backend.calls.values()
    assert traj.num_turns == 5 and len(calls) == 5
    system = traj.messages[0]["content"]
    s, a = {"role": "system", "content": system}, {"role": "assistant", "content": "Action: go"}

    def user(text):
        return {"role": "user", "content": text}

    expected = [
        [s, user(GOAL)],
        [s, user(GOAL), a, user("You took step 1.")],
        [s, user(GOAL), a, user("You took step 1."), a, user("You took step 2.")],
        # turn 3: turn 0 dropped, the last 2 (reply, observation) pairs kept
        [s, user(GOAL + "\n\n(1 earlier turn omitted)"), a, user("You took step 2."), a,
         user("You took step 3.")],
        [s, user(GOAL + "\n\n(2 earlier turns omitted)"), a, user("You took step 3."), a,
         user("You took step 4.")],
    ]
    for turn, (messages, (engine_input, _)) in enumerate(zip(expected, calls)):
        assert engine_input == _rendered(tokenizer, messages), turn
    # the record keeps the whole conversation; turns 0-2 are one chunk, 3 and 4 one each
    assert [m["content"] for m in traj.messages[1:]] == [
        GOAL, "Action: go", "You took step 1.", "Action: go", "You took step 2.", "Action: go",
        "You took step 3.", "Action: go", "You took step 4.", "Action: go"]
    assert len(traj.chunk_starts) == 3
    assert [traj.token_ids[a:b] for a, b in traj.chunk_bounds()] == [
        calls[2][0] + calls[2][1].output_ids, calls[3][0] + calls[3][1].output_ids,
        calls[4][0] + calls[4][1].output_ids]


def test_without_a_window_the_episode_is_one_growing_sequence(tokenizer):
    backend = _go_backend(tokenizer)
    (traj,) = _collect(tokenizer, backend, history_turns=0, horizon=5)
    (calls,) = backend.calls.values()
    assert traj.chunk_starts == [0]
    for (before, _), (after, _) in zip(calls, calls[1:]):
        assert after[:len(before)] == before  # each prompt extends the previous one


def test_prompt_length_stops_growing_with_the_turn_count(tokenizer):
    lengths = {}
    for window in (0, 3):
        backend = _go_backend(tokenizer)
        _collect(tokenizer, backend, history_turns=window, horizon=14)
        (calls,) = backend.calls.values()
        lengths[window] = [len(ids) for ids, _ in calls]
    full, windowed = lengths[0], lengths[3]
    assert all(b > a for a, b in zip(full, full[1:]))  # grows every turn
    assert windowed[:4] == full[:4]  # the window is not full yet: the same prompts
    tail = windowed[4:]
    # from turn 4 on: the same messages but for the numbers in them (SmolLM2 has one token
    # per digit: steps 10-13 in the 3 kept observations and 10 omitted turns add 4)
    assert max(tail) - min(tail) <= 4 and max(tail) < full[5] and tail[0] == tail[5]


def test_a_stride_drops_several_turns_at_once_and_extends_between_drops(tokenizer):
    # window 4, stride 3: turns 0-4 extend one sequence; turn 5 drops 3 pairs (keeps steps 4-5)
    # and turns 6-7 extend it; turn 8 drops 3 again (keeps steps 7-8) and turn 9 extends it
    backend = _go_backend(tokenizer)
    (traj,) = _collect(tokenizer, backend, history_turns=4, horizon=10, history_stride=3)
    (calls,) = backend.calls.values()
    assert traj.num_turns == 10 and len(calls) == 10
    s = {"role": "system", "content": traj.messages[0]["content"]}
    a = {"role": "assistant", "content": "Action: go"}

    def prompt(omitted: int, steps: range) -> list[dict[str, str]]:
        goal = GOAL + (f"\n\n({omitted} earlier turns omitted)" if omitted else "")
        pairs = [[a, {"role": "user", "content": f"You took step {k}."}] for k in steps]
        return [s, {"role": "user", "content": goal}] + [m for pair in pairs for m in pair]

    expected = ([prompt(0, range(1, t + 1)) for t in range(5)]
                + [prompt(3, range(4, t + 1)) for t in (5, 6, 7)]
                + [prompt(6, range(7, t + 1)) for t in (8, 9)])
    for turn, (messages, (engine_input, _)) in enumerate(zip(expected, calls)):
        assert engine_input == _rendered(tokenizer, messages), turn
    assert len(traj.chunk_starts) == 3  # a chunk starts at turns 0, 5 and 8
    assert [traj.token_ids[a:b] for a, b in traj.chunk_bounds()] == [
        calls[t][0] + calls[t][1].output_ids for t in (4, 7, 9)]


@pytest.mark.parametrize("history_turns", [0, 4])
def test_a_backend_that_takes_id_arrays_gets_the_same_contexts(tokenizer, history_turns):
    """The episode hands a backend that takes arrays its context as one ``array("i")`` kept up
    to date turn by turn (``agent/context_ids.py``), restarted with each new chunk of a
    window; call by call its ids equal the list a list backend gets."""
    runs = {}
    for arrays in (False, True):
        backend = _go_backend(tokenizer, takes_id_arrays=arrays)
        trajectories = _collect(tokenizer, backend, history_turns=history_turns, horizon=10,
                                tasks=("a", "b"), samples=2,
                                history_stride=3 if history_turns else 1)
        runs[arrays] = (backend, trajectories)
    (lists, list_trajs), (arrays, array_trajs) = runs[False], runs[True]
    assert set(lists.id_types) == {list} and set(arrays.id_types) == {array.array}
    assert sorted(c.input_ids for c in lists.log) == sorted(c.input_ids for c in arrays.log)
    assert len(lists.log) == 40
    for a, b in zip(list_trajs, array_trajs):
        assert (a.token_ids, a.chunk_starts) == (b.token_ids, b.chunk_starts)
    if history_turns:
        assert all(len(t.chunk_starts) == 3 for t in array_trajs)


def test_history_stride_is_checked(tokenizer):
    for turns, stride, needs in ((0, 2, "needs a history window"), (4, 5, "must be <= "
                                                                     "agent.history_turns=4")):
        config, problems = RunConfig.from_mapping(
            {"agent": {"history_turns": turns, "history_stride": stride}})
        assert config is None and [p for p in problems
                                   if p.startswith("agent.history_stride") and needs in p]
    config, problems = RunConfig.from_mapping({"agent": {"history_stride": 0}})
    assert config is None and [p for p in problems if p.startswith("agent.history_stride")]
    config, problems = RunConfig.from_mapping(
        {"agent": {"history_turns": 4, "history_stride": 4}})
    assert problems == [] and config.agent.history_stride == 4
    with pytest.raises(ValueError, match="history_stride must be an integer in 1..2"):
        _collect(tokenizer, _go_backend(tokenizer), history_turns=2, horizon=3,
                 history_stride=3)


@pytest.mark.parametrize("stride, chunks", [(1, 5), (2, 3)])
def test_every_generated_id_is_trained_in_the_context_the_engine_was_given(tokenizer, stride,
                                                                           chunks):
    # window 2 over 7 turns: stride 1 starts a chunk at turns 0, 3, 4, 5, 6; stride 2 at 0, 3, 5
    backend = _go_backend(tokenizer)
    trajectories = _collect(tokenizer, backend, history_turns=2, horizon=7,
                            tasks=("win", "t"), samples=2, history_stride=stride)
    batch = assemble_batch(trajectories, pad_id=2, episode_estimator="grpo")
    assert batch.tokens.shape[0] == sum(len(t.chunk_starts) for t in trajectories) == 4 * chunks
    owner = [i for i, _, _ in training_rows(trajectories)]  # the trajectory of each row
    total = 0
    for i, t in enumerate(trajectories):
        for engine_input, result in backend.calls[t.episode_id]:
            out = result.output_ids
            n, m = len(engine_input), len(out)
            rows = [r for r in range(batch.tokens.shape[0])
                    if owner[r] == i and list(batch.tokens[r, :n]) == engine_input
                    and list(batch.tokens[r, n:n + m]) == out
                    and batch.loss_mask[r, n:n + m].all()]
            assert len(rows) == 1  # the reply is trained once, after exactly the engine's input
            np.testing.assert_allclose(batch.rollout_logprobs[rows[0], n:n + m],
                                       np.float32(result.output_logprobs), rtol=0, atol=0)
            total += m
    assert batch.loss_mask.sum() == total  # and nothing else is trained


def _episode(reward: float, group: int, chunks: int, generated: int = 3) -> Trajectory:
    """A hand-built trajectory of ``chunks`` chunks, each a 4-id prompt and a reply."""
    t = Trajectory(env="e", task_id="x", group_id=group, sample_index=0, reward=reward)
    for c in range(chunks):
        if c:
            t.start_chunk([7, 7, 7, 7])
        else:
            t.append([5, 5, 5, 5], generated=False, turn=-1)
        t.append([9] * generated, generated=True, turn=c, logprobs=[-0.5] * generated)
    t.num_turns = chunks
    return t


def test_group_advantages_count_each_episode_once():
    # group 0: rewards 1, 0, 0 over 3, 1 and 2 chunks; group 1: 0.5 and 0.5 (flat)
    episodes = [_episode(1.0, 0, 3), _episode(0.0, 0, 1), _episode(0.0, 0, 2),
                _episode(0.5, 1, 2), _episode(0.5, 1, 1)]
    with pytest.raises(ValueError, match="several rows"):
        assemble_batch(episodes, pad_id=0)
    batch = assemble_batch(episodes, pad_id=0, episode_estimator="grpo")
    r = np.array([1.0, 0.0, 0.0])
    grpo = (r - r.mean()) / (r.std(ddof=1) + 1e-6)  # by hand, over the 3 episodes
    per_row = np.repeat(np.concatenate([grpo, [0.0, 0.0]]), [3, 1, 2, 2, 1])
    np.testing.assert_allclose(batch.advantages, per_row[:, None] * batch.loss_mask,
                               atol=1e-5)
    # rloo over the same episodes: n / (n - 1) * (R - mean)
    rloo = assemble_batch(episodes, pad_id=0, episode_estimator="rloo").advantages
    np.testing.assert_allclose(rloo[0, batch.loss_mask[0] > 0], 1.5 * (1 - 1 / 3), atol=1e-6)
    with pytest.raises(ValueError, match="one advantage per episode"):
        assemble_batch(episodes, pad_id=0, episode_estimator="reinforce_pp")


@pytest.mark.parametrize("learner, needs", [
    ({"advantage_estimator": "gae"}, "'gae'"),
    ({"advantage_estimator": "reinforce_pp"}, "'reinforce_pp'"),
    ({"advantage_estimator": "gigpo"}, "'gigpo'"),
    ({"kl_in_reward": True, "kl_coef": 0.01}, "kl_in_reward=False"),
    ({"loss_agg_mode": "seq_mean_token_mean"}, "token_mean"),
])
def test_config_refuses_what_the_window_would_train_wrongly(learner, needs):
    config, problems = RunConfig.from_mapping({"agent": {"history_turns": 4},
                                               "learner": learner})
    assert config is None
    assert [p for p in problems if p.startswith("agent.history_turns") and needs in p]
    for estimator in ("grpo", "dr_grpo", "rloo"):  # episode-level: accepted
        config, problems = RunConfig.from_mapping(
            {"agent": {"history_turns": 4}, "learner": {"advantage_estimator": estimator}})
        assert problems == [] and config.agent.history_turns == 4
    config, problems = RunConfig.from_mapping({"agent": {"history_turns": 0}, "learner": learner})
    assert not [p for p in problems if p.startswith("agent.history_turns")]


# ---------------------------------------------------------------- a real engine and model


def test_sampled_logprobs_equal_a_forward_over_each_training_row():
    """Windowed episodes of a tiny random model sampled at temperature 1 by the engine (prefix
    reuse on): each row's teacher-forced log-probs equal the sampled ones on its trained ids."""
    from rollout_helpers import TINY, byte_tokenizer, full_logprobs, make_engine, tiny_model

    tokenizer = byte_tokenizer(TINY.vocab_size)
    cfg = dataclasses.replace(TINY, max_position_embeddings=512)
    model = tiny_model(cfg=cfg, logit_scale=4.0)
    engine = make_engine(model, tokenizer, warmup=False, max_length=512,
                         prefill_chunks=(64, 512), prefill_tokens=512)
    try:
        backend = RecordingBackend(engine)
        pool = ActorPool(backend, {"fake": CountingEnv()}, ChatFormatter(tokenizer),
                         SamplingParams(max_new_tokens=6, temperature=1.0, seed=3),
                         max_context=512, max_concurrency=4,
                         parser=lambda text: ParsedAction(action=text.strip() or "x"),
                         prompt_style="action", response_prefix="A:", history_turns=1,
                         history_stride=1, option_limits=False, shuffle_options=False)
        trajectories, _ = asyncio.run(pool.collect([TaskRef("fake", "t")], 2, 4))
    finally:
        engine.close()
    assert all(t.num_turns == 4 and len(t.chunk_starts) == 3 for t in trajectories)
    batch = assemble_batch(trajectories, pad_id=0, episode_estimator="grpo")
    for r in range(batch.tokens.shape[0]):
        n = int(batch.attention_mask[r].sum())
        ids = [int(x) for x in batch.tokens[r, :n]]
        ref = full_logprobs(model, ids, length=512)
        trained = np.nonzero(batch.loss_mask[r, :n])[0]
        assert trained.size and trained[0] > 0
        np.testing.assert_allclose(batch.rollout_logprobs[r, trained],
                                   ref[trained - 1, np.asarray(ids)[trained]], atol=2e-4)


@pytest.mark.parametrize("takes_id_arrays", [False, True])
def test_worker_processes_relay_windowed_prompts_exactly(tokenizer, takes_id_arrays):
    """A windowed prompt is not an extension of the previous one: a worker process sends the
    parent the ids past their common prefix, and the parent's ids equal the worker's (the
    parent keeps them as a list, or as the array it hands a backend that takes arrays)."""
    backend = _go_backend(tokenizer, takes_id_arrays=takes_id_arrays)
    from environments.core.client import EnvClient
    from agentrl_common.processes import start_env_server

    server = start_env_server("babyai")  # workers need EnvClient-like clients (config())
    try:
        async def run():
            async with EnvClient(server.url) as client:
                ids = (await client.tasks("train"))[:2]
                tasks = [TaskRef("babyai", i) for i in ids]
                kwargs = dict(max_context=4096, max_concurrency=8, parser=parse_react,
                              prompt_style="action",
                              response_prefix="Action:", history_turns=2, history_stride=1,
                              option_limits=False, shuffle_options=False)
                here = ActorPool(_go_backend(tokenizer), {"babyai": client},
                                 ChatFormatter(tokenizer), SamplingParams(max_new_tokens=8),
                                 **kwargs)
                pool = ActorPool(backend, {"babyai": client}, ChatFormatter(tokenizer),
                                 SamplingParams(max_new_tokens=8), workers=1, **kwargs)
                try:
                    return (await here.collect(tasks, 1, 6, seed=1))[0], \
                        (await pool.collect(tasks, 1, 6, seed=1))[0]
                finally:
                    pool.close()
        in_process, workers = asyncio.run(run())
    finally:
        server.stop()
    assert any(len(t.chunk_starts) > 1 for t in workers)
    for a, b in zip(in_process, workers):
        assert (a.token_ids, a.chunk_starts, a.messages) == (b.token_ids, b.chunk_starts,
                                                             b.messages)
        # what the parent handed the backend for each turn is exactly the worker's chunk up to
        # that turn's reply
        for turn, (ids, _) in enumerate(backend.calls[b.episode_id]):
            first = next(i for i, (k, m) in enumerate(zip(b.turn_ids, b.loss_mask))
                         if k == turn and m)
            start = max(c for c in b.chunk_starts if c <= first)
            assert ids == b.token_ids[start:first], turn
    assert set(backend.id_types) == {array.array if takes_id_arrays else list}


@pytest.mark.slow
def test_smoke_run_with_the_window_ends_normally(tmp_path, compile_cache_env):
    """The smoke config with a one-turn window and 3-turn episodes: windowed episodes are
    trained (several chunks each) and the run finishes."""
    import os
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, **compile_cache_env)
    env.pop("XLA_FLAGS", None)
    workdir = str(tmp_path / "run")
    proc = subprocess.run(
        [sys.executable, "launch/run.py", "--config", "experiments/smoke.py", "--workdir",
         workdir, "--config.train.total_steps=2", "--config.agent.history_turns=1",
         "--config.horizon.type=fixed", "--config.horizon.turns=3"],
        cwd=repo, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[step 2/2]" in proc.stdout and "run finished" in proc.stdout
    from agentrl_common.jsonl_files import read_records, trajectory_files

    episodes = [e for path in trajectory_files(workdir, "train") for e in read_records(path)]
    assert len(episodes) == 8
    windowed = [e for e in episodes if len(e["chunk_starts"]) > 1]
    assert windowed and all(e["num_turns"] == 3 for e in windowed)
    for e in windowed:  # the 3rd turn's prompt dropped the 1st turn: a new chunk
        assert len(e["chunk_starts"]) == 2 and sum(e["loss_mask"]) > 0
