"""The cheaper turn path gives the reference path's trajectories, bit for bit.

Reference: ``ChatFormatter(fast=False)`` (the template rendered and the tokenizer run on every
prompt and observation, as before) with ``EnvClient(batch=False)`` (one HTTP request per call).
Fast path: the piecewise cached encoder + ``POST /batch``. Both play the same seeded BabyAI
episodes on a real server with a deterministic backend; every content field of every trajectory
must match. Also: the piecewise encoder against the tokenizer on random texts with special
tokens, and ``/batch`` answers and errors call by call.
"""

from __future__ import annotations

import asyncio
import os
import random

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from fake_backends import QuietBackend
from agentrl_jax.agent.actor_pool import ActorPool, TaskRef
from agentrl_jax.agent.chat import ChatFormatter, SegmentEncoder
from agentrl_jax.agent.parsing import get_parser
from agentrl_jax.rollout.contract import GenerateResult, SamplingParams
from agentrl_jax.training.outputs.progress import OFF, EpisodeProgress, TurnCounter
from environments.core.client import EnvClient, EnvServerError

ACTIONS = ("turn left", "move forward", "turn right", "pickup", "go to red ball 1",
           "dance wildly", "toggle", "go through blue door 1")
CONTENT_FIELDS = ("env", "task_id", "group_id", "sample_index", "token_ids", "loss_mask",
                  "logprobs", "turn_ids", "prompt_length", "messages", "turn_rewards",
                  "turn_states", "reward", "success", "status", "num_turns", "invalid_actions",
                  "parse_failures", "horizon", "policy_version", "turn_versions", "error")


class SeededBackend(QuietBackend):
    """`` <action>`` + EOS (or, one turn in five, a reply without EOS or without an action),
    chosen by the request's sampling seed; logprobs a function of seed and position."""

    name = "seeded"

    def __init__(self, tokenizer):
        eos = tokenizer.eos_token_id
        self.replies = [tokenizer.encode(" " + a, add_special_tokens=False) + [eos]
                        for a in ACTIONS]
        self.replies.append(tokenizer.encode(" turn left", add_special_tokens=False))  # no EOS
        self.replies.append(tokenizer.encode("\n\n", add_special_tokens=False) + [eos])

    async def generate(self, input_ids, sampling=None, session_id=None, rid=None):
        await asyncio.sleep(0)
        ids = list(self.replies[sampling.seed % len(self.replies)])
        return GenerateResult(output_ids=ids,
                              output_logprobs=[-((sampling.seed >> i) % 1000) / 997.0
                                               for i in range(len(ids))],
                              finish_reason="stop", prompt_tokens=len(input_ids))


async def _collect(tokenizer, url, fast: bool, tasks, n_samples=2, horizon=7, seed=11):
    async with EnvClient(url, batch=None if fast else False) as client:
        pool = ActorPool(SeededBackend(tokenizer), {"babyai": client},
                         ChatFormatter(tokenizer, fast=fast),
                         SamplingParams(max_new_tokens=32, stop=["\n"]), max_context=1500,
                         max_concurrency=32, parser=get_parser("react"), prompt_style="action",
                         response_prefix="Action:", history_turns=0, history_stride=1,
                         option_limits=False, shuffle_options=False)
        trajectories, _ = await pool.collect(tasks, n_samples, horizon, seed=seed)
        return trajectories, client.batches_sent


async def test_fast_path_trajectories_equal_the_reference_path(tokenizer, babyai):
    async with EnvClient(babyai.url) as client:
        ids = await client.tasks("train")
    tasks = [TaskRef("babyai", ids[(i * 7919) % len(ids)]) for i in range(24)]
    reference, ref_batches = await _collect(tokenizer, babyai.url, False, tasks)
    fast, fast_batches = await _collect(tokenizer, babyai.url, True, tasks)
    assert ref_batches == 0 and fast_batches > 0  # the fast run really used POST /batch
    assert len(reference) == len(fast) == 48
    statuses = set()
    for a, b in zip(reference, fast):
        for field in CONTENT_FIELDS:
            assert getattr(a, field) == getattr(b, field), (a.task_id, field)
        statuses.add(a.status)
        # and both are the model's own chat template over the whole conversation
        rendered = tokenizer.apply_chat_template(a.messages, tokenize=False,
                                                 add_generation_prompt=False)
        full = tokenizer.encode(rendered, add_special_tokens=False)
        assert full[:len(a.token_ids)] == a.token_ids or a.status == "context_limit"
    assert {"max_turns", "context_limit"} & statuses
    assert sum(t.invalid_actions for t in reference) > 0


def test_segment_encoder_equals_the_tokenizer_on_random_texts(tokenizer):
    encoder = SegmentEncoder.build(tokenizer)
    assert encoder is not None
    rng = random.Random(3)
    alphabet = list("ab cd\n\t  ,.'\"<>|_0123456789é中😀") + ["<|im_start|>", "<|im_end|>",
                                                          "<|endoftext|>", "<|im", "|>",
                                                          " Action:", "user\n", "\n\n"]
    for _ in range(400):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        assert encoder.encode(text) == tokenizer.encode(text, add_special_tokens=False), text
        assert encoder.encode(text) == tokenizer.encode(text, add_special_tokens=False)  # cached


def test_segment_encoder_cuts_lines_and_equals_the_tokenizer_on_line_rich_texts(tokenizer):
    """SmolLM2's pre-tokenizer is GPT-2's byte-level regex: the encoder caches lines. Texts of
    many short lines whose line breaks follow every kind of character (letters, digits,
    punctuation, spaces, tabs, carriage returns, non-ASCII) encode as the tokenizer does."""
    encoder = SegmentEncoder.build(tokenizer)
    assert encoder is not None and encoder.lines
    rng = random.Random(5)
    ends = list("a.Z9 \t\r'\",)>|_é中😀") + ["<|im_end|>", "", "  ", "'s", "\n"]
    words = ["You see", " a red ball", " 2 steps", "forward", "Action:", " go to", "'ll", "x"]
    for _ in range(400):
        lines = ["".join(rng.choice(words) for _ in range(rng.randint(0, 3))) + rng.choice(ends)
                 for _ in range(rng.randint(1, 8))]
        text = "\n".join(lines) + rng.choice(["", "\n", "\n\n", " \n"])
        expected = tokenizer.encode(text, add_special_tokens=False)
        assert encoder.encode(text) == expected, repr(text)
        assert encoder.encode(text) == expected  # from the cache


def test_line_cuts_are_refused_for_a_pretokenizer_that_joins_punctuation_and_line_breaks(
        tokenizer):
    """Llama-3's and Qwen2's pre-tokenizer regex keeps ``.`` and the line break after it in one
    pre-token, and their vocabularies have tokens for such pairs: here SmolLM2's tokenizer with
    that regex and one more token, ``.`` + line break. A text cut there would encode
    differently; the encoder does not cut lines for such a tokenizer, and still equals it."""
    import json

    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from agentrl_jax.agent.chat import cuts_before_line_breaks

    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    pattern = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated",
         "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
         "use_regex": False}]}
    spec["model"]["vocab"][".\u010a"] = len(spec["model"]["vocab"])  # "." + byte-level "\n"
    spec["model"]["merges"].insert(0, [".", "\u010a"])
    backend = Tokenizer.from_str(json.dumps(spec))
    joined = PreTrainedTokenizerFast(tokenizer_object=backend)
    text = "Your goal: go to the red ball.\nYou see a wall.\n"

    def encode(t):
        return joined.encode(t, add_special_tokens=False)

    cut = [i for part in ("Your goal: go to the red ball.", "\nYou see a wall.", "\n")
           for i in encode(part)]
    assert cut != encode(text)  # cutting at the line breaks would change the ids here
    assert not cuts_before_line_breaks(backend)
    assert cuts_before_line_breaks(tokenizer.backend_tokenizer)
    encoder = SegmentEncoder.build(joined)
    assert encoder is not None and not encoder.lines
    assert encoder.encode(text) == encode(text)


def test_segment_encoder_is_refused_for_tokens_that_strip_whitespace(tokenizer):
    class Stripping:
        """An added token with ``lstrip``: matching it eats the whitespace before it."""

        content, lstrip, rstrip, single_word, normalized = "<x>", True, False, False, False

    class Wrapped:
        backend_tokenizer = tokenizer.backend_tokenizer
        added_tokens_decoder = {5: Stripping()}
        encode = tokenizer.encode

    assert SegmentEncoder.build(Wrapped()) is None


async def test_batch_answers_each_call_as_its_own_request(babyai):
    async with aiohttp.ClientSession() as http:
        async def post(path, body):
            async with http.post(babyai.url + path, json=body) as r:
                return r.status, await r.json()

        status, created = await post("/create", {"task_id": "BabyAI-GoToRedBallGrey-v0/seed=1"})
        assert status == 200
        env_id = created["env_id"]
        status, answer = await post("/batch", {"calls": [
            {"op": "step", "env_id": env_id, "action": "turn left"},
            {"op": "step", "env_id": "nope", "action": "turn left"},
            {"op": "jump"},
            7,
            {"op": "step", "env_id": env_id},
            {"op": "step", "env_id": env_id, "action": "turn right"},
            {"op": "create", "task_id": "no-such-level/seed=1"},
            {"op": "close", "env_id": env_id},
            {"op": "step", "env_id": env_id, "action": "turn left"}]})
        assert status == 200
        codes = [r["status"] for r in answer["results"]]
        assert codes == [200, 404, 400, 400, 400, 200, 404, 200, 404]
        first, second = answer["results"][0]["body"], answer["results"][5]["body"]
        assert first["info"]["steps"] == 1 and second["info"]["steps"] == 2
        assert "unknown env_id" in answer["results"][1]["body"]["error"]
        assert (await post("/batch", {"calls": "x"}))[0] == 400
        assert (await post("/batch", {"calls": [{}] * 1025}))[0] == 400
        async with http.get(babyai.url + "/health") as r:
            assert (await r.json())["batch"] is True


async def test_client_falls_back_to_single_calls_on_a_server_without_batch():
    """An older server (no /batch, 404) gets every call on its own, and nothing is lost."""
    steps: list[str] = []

    async def health(request):
        return web.json_response({"status": "ok", "batch": True})

    async def create(request):
        return web.json_response({"env_id": "e1", "observation": "o", "info": {}})

    async def step(request):
        body = await request.json()
        steps.append(body["action"])
        if body["action"] == "bad":
            return web.json_response({"error": "nope"}, status=409)
        return web.json_response({"observation": body["action"], "reward": 0.0, "done": False})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/create", create)
    app.router.add_post("/step", step)
    async with TestServer(app) as server:
        async with EnvClient(str(server.make_url(""))) as client:
            env_id = (await client.create(task_id="t")).env_id
            results = await asyncio.gather(*(client.step(env_id, a) for a in ("a", "b", "c")))
            assert [r.observation for r in results] == ["a", "b", "c"]
            assert client.batches_sent == 1 and client._batch_ok[0] is False
            with pytest.raises(EnvServerError) as error:
                await asyncio.gather(client.step(env_id, "bad"), client.step(env_id, "d"))
            assert error.value.status == 409
    assert sorted(steps) == ["a", "b", "bad", "c", "d"]


async def test_worker_processes_give_the_in_process_trajectories(tokenizer, babyai):
    """``ActorPool(workers=2)``: the same episodes played in two spawned processes, the backend
    here; every content field equals the in-process run's, versions come from ``version_fn``
    read here, and progress sees every episode."""
    async with EnvClient(babyai.url) as client:
        ids = await client.tasks("train")
    tasks = [TaskRef("babyai", ids[(i * 104729) % len(ids)]) for i in range(10)]
    reference, _ = await _collect(tokenizer, babyai.url, True, tasks, n_samples=3)
    calls = []
    async with EnvClient(babyai.url) as client:
        backend = SeededBackend(tokenizer)
        generate = backend.generate

        async def counted(*a, **k):
            calls.append(k.get("session_id"))
            return await generate(*a, **k)

        backend.generate = counted
        ended: list[str] = []
        backend.end_session = ended.append  # the parent ends each session the workers finish
        counter = TurnCounter(backend)  # the progress bar's turn count, as the trainer has it
        pool = ActorPool(counter, {"babyai": client}, ChatFormatter(tokenizer),
                         SamplingParams(max_new_tokens=32, stop=["\n"]), max_context=1500,
                         max_concurrency=32, parser=get_parser("react"), prompt_style="action",
                         response_prefix="Action:", history_turns=0, history_stride=1,
                         option_limits=False, shuffle_options=False, workers=2)
        seen = []
        try:
            async with EpisodeProgress(30, "first", OFF, counter=counter) as first:
                fast, stats = await pool.collect(tasks, 3, 7, seed=11,
                                                 progress=lambda t: (seen.append(t), first(t)))
            n_calls = len(calls)
            async with EpisodeProgress(6, "again", OFF, counter=counter) as second:
                again, _ = await pool.collect(tasks[:2], 3, 7, seed=11, policy_version=4,
                                              version_fn=lambda: 9, progress=second)
        finally:
            pool.close()
    for bar, trajectories in ((first, fast), (second, again)):  # exact: the episodes' own
        assert bar.turns() == (sum(t.num_turns for t in trajectories),
                               sum(t.num_generated for t in trajectories))
    assert len(fast) == len(reference) == 30 and len(seen) == 30 and stats.episodes == 30
    assert sum(t.num_turns for t in fast) == n_calls  # every turn went through this process
    assert sorted(ended) == sorted(t.episode_id for t in fast + again)  # each once
    for a, b in zip(reference, fast):
        for field in CONTENT_FIELDS:
            assert getattr(a, field) == getattr(b, field), (a.task_id, field)
    for a, b in zip(reference[:6], again):
        assert a.token_ids == b.token_ids and b.policy_version == 4
        assert b.turn_versions == [9] * b.num_turns


async def test_workers_post_straight_to_http_rollout_servers(tokenizer, babyai):
    """With an HTTP backend (``client_spec()``) the worker processes send their requests to
    the rollout servers themselves: nothing is relayed through this process, the trajectories
    equal an in-process run's over the same server, and turn versions follow ``version_fn``
    as it changes during the job."""
    from agentrl_jax.rollout.backends.sglang import SGLangBackend

    seeded = SeededBackend(tokenizer)
    state = {"requests": 0, "sessions": set(), "version": 0}

    async def generate(request: web.Request) -> web.Response:
        body = await request.json()
        state["requests"] += 1
        state["sessions"].add(body.get("session_id"))
        if state["requests"] == 60:
            state["version"] = 1  # new weights arrive mid-job
        (result,) = await seeded.generate_n(body["input_ids"], SamplingParams(
            seed=body["sampling_params"]["sampling_seed"]))
        return web.json_response({"output_ids": result.output_ids, "meta_info": {
            "id": body["rid"], "finish_reason": {"type": "stop"},
            "prompt_tokens": len(body["input_ids"]),
            "output_token_logprobs": [[lp, t, None] for lp, t in zip(result.output_logprobs,
                                                                      result.output_ids)]}})

    app = web.Application()
    app.router.add_post("/generate", generate)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    async with EnvClient(babyai.url) as client:
        ids = await client.tasks("train")
    tasks = [TaskRef("babyai", ids[(i * 7919) % len(ids)]) for i in range(8)]

    async def collect(workers: int):
        async with EnvClient(babyai.url) as client, \
                SGLangBackend([str(server.make_url("")).rstrip("/")], max_retries=0) as backend:
            pool = ActorPool(backend, {"babyai": client}, ChatFormatter(tokenizer),
                             SamplingParams(max_new_tokens=32, stop=["\n"]), max_context=1500,
                             max_concurrency=32, parser=get_parser("react"),
                             prompt_style="action", response_prefix="Action:", history_turns=0,
                             history_stride=1, option_limits=False, shuffle_options=False,
                             workers=workers)
            try:
                out, _ = await pool.collect(tasks, 2, 7, seed=11,
                                            version_fn=lambda: state["version"])
            finally:
                pool.close()
            return out, backend.servers[0].served, sum(backend.sessions_placed())

    try:
        reference, ref_served, _ = await collect(0)
        n_turns = sum(t.num_turns for t in reference)
        assert ref_served == state["requests"] == n_turns > 60
        state.update(requests=0, version=0, sessions=set())
        direct, served_here, placed_here = await collect(2)
    finally:
        await server.close()
    assert served_here == placed_here == 0  # nothing went through this process's client
    assert state["requests"] == n_turns and len(state["sessions"]) == 16  # all 16 episodes
    for a, b in zip(reference, direct):
        for field in CONTENT_FIELDS:
            if field != "turn_versions":
                assert getattr(a, field) == getattr(b, field), (a.task_id, field)
        assert b.turn_versions == sorted(b.turn_versions) and set(b.turn_versions) <= {0, 1}
    versions = [v for t in direct for v in t.turn_versions]
    assert len(versions) == n_turns and 0 in versions and 1 in versions


async def test_workers_spawned_ahead_serve_the_first_collect(tokenizer, babyai):
    """``WorkerGroup.spawn()`` before the pool exists (the trainer does it beside the model
    load): the processes are running before any setup is known, the pool's first collect
    connects those same processes (no new ones) and the trajectories equal an in-process
    run's; a pool refuses a group of another size or one already set up."""
    from agentrl_jax.agent.workers import WorkerGroup

    async with EnvClient(babyai.url) as client:
        ids = await client.tasks("train")
    tasks = [TaskRef("babyai", ids[(i * 104729) % len(ids)]) for i in range(4)]
    reference, _ = await _collect(tokenizer, babyai.url, True, tasks, n_samples=2)
    group = WorkerGroup(2)
    group.spawn()
    spawned = [p.pid for p in group._processes]
    assert len(spawned) == 2 and all(p.is_alive() for p in group._processes)
    group.spawn()  # running already: nothing more
    assert [p.pid for p in group._processes] == spawned
    settings = dict(max_context=1500, max_concurrency=32, parser=get_parser("react"),
                    prompt_style="action", response_prefix="Action:", history_turns=0,
                    history_stride=1, option_limits=False, shuffle_options=False)
    async with EnvClient(babyai.url) as client:
        backend = SeededBackend(tokenizer)
        with pytest.raises(ValueError, match="spawned ahead"):
            ActorPool(backend, {"babyai": client}, ChatFormatter(tokenizer),
                      SamplingParams(max_new_tokens=32, stop=["\n"]), workers=3,
                      worker_group=group, **settings)
        pool = ActorPool(backend, {"babyai": client}, ChatFormatter(tokenizer),
                         SamplingParams(max_new_tokens=32, stop=["\n"]), workers=2,
                         worker_group=group, **settings)
        try:
            ahead, _ = await pool.collect(tasks, 2, 7, seed=11)
            assert [p.pid for p in group._processes] == spawned
            assert len(group._writers) == 2
        finally:
            pool.close()
    assert not any(p.is_alive() for p in group._processes) and group._path is None
    assert len(ahead) == len(reference) == 8
    for a, b in zip(reference, ahead):
        for field in CONTENT_FIELDS:
            assert getattr(a, field) == getattr(b, field), (a.task_id, field)


def test_a_group_spawned_ahead_and_never_used_closes_at_once():
    """Processes spawned ahead wait for a socket that never opens; ``close()`` terminates
    them first instead of giving each a 5-s join for a stop message it cannot get."""
    from agentrl_jax.agent.workers import WorkerGroup

    group = WorkerGroup(2)
    group.spawn()
    processes = list(group._processes)
    calls: list[tuple[str, int]] = []
    for process in processes:
        def spy(name, method, pid=process.pid):
            def call(*args, **kwargs):
                calls.append((name, pid))
                return method(*args, **kwargs)
            return call
        process.join = spy("join", process.join)
        process.terminate = spy("terminate", process.terminate)
    group.close()
    assert not any(p.is_alive() for p in processes)
    for process in processes:  # terminated, then reaped: no join came before the terminate
        assert [c for c, pid in calls if pid == process.pid] == ["terminate", "join"]
    assert group._processes == [] and group._path is None


def test_the_run_spawns_its_workers_ahead_and_hands_them_to_its_pool(tokenizer):
    """``services.spawn_actor_workers``: ``rollout.actor_workers`` processes running before the
    pool is made (none for in-process episodes), and ``make_actor_pool`` gives the pool that
    group rather than a new one."""
    from agentrl_jax.training.config.experiment import base_config, to_run_config
    from agentrl_jax.training.runtime import services

    config = base_config()
    assert services.spawn_actor_workers(to_run_config(config)) is None  # 0 by default
    config.rollout.actor_workers = 2
    run = to_run_config(config)
    group = services.spawn_actor_workers(run)
    try:
        assert group.n == 2 and all(p.is_alive() for p in group._processes)
        pool = services.make_actor_pool(run, object(), {}, tokenizer, worker_group=group)
        assert pool.workers == 2 and pool._group is group
    finally:
        group.close()
    assert group._processes == []


async def test_a_waiting_worker_gives_up_when_its_parent_is_gone(tmp_path):
    """A worker waiting for its group's socket returns once the pid it was spawned by is no
    longer its parent (here a pid that is not this process's parent), not waiting forever."""
    from agentrl_jax.agent.workers import _connect

    parent = os.getppid() + 1
    assert await asyncio.wait_for(_connect(str(tmp_path / "sock"), parent), 5) is None


def test_a_worker_imports_its_tokenizers_modules_before_it_waits(tokenizer):
    """Unpickling the setup's tokenizer imports ``transformers`` (seconds) unless it is in
    already: a worker imports the tokenizer's modules before it waits for the socket, so a
    group spawned ahead does not spend that in the first collect. In a fresh interpreter:
    the workers module alone leaves them out; after ``_import_tokenizer_modules`` every
    ``transformers`` module of the tokenizer's class and bases is in ``sys.modules``."""
    import subprocess
    import sys

    modules = sorted({c.__module__ for c in type(tokenizer).__mro__
                      if c.__module__.startswith("transformers")})
    assert modules
    code = ("import sys\nfrom agentrl_jax.agent import workers\n"
            f"m = {modules!r}\n"
            "before = [x for x in m if x in sys.modules]\n"
            "workers._import_tokenizer_modules()\n"
            "print(before, [x for x in m if x not in sys.modules])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=True).stdout.strip()
    assert out == "[] []", out


def test_worker_shares_keep_a_group_in_one_worker_and_balance_the_rest():
    """A collect's specs list each group's samples together; the workers get contiguous runs of
    sizes that differ by at most one (hand-computed), every episode exactly once."""
    from agentrl_jax.agent.workers import worker_shares

    assert worker_shares(256, 4) == [range(0, 64), range(64, 128), range(128, 192),
                                     range(192, 256)]
    specs = [(g, i) for g in range(32) for i in range(8)]  # 32 groups x 8 samples
    for share in worker_shares(len(specs), 4):
        groups = {specs[i][0] for i in share}
        assert all(sum(1 for i in share if specs[i][0] == g) == 8 for g in groups)
    assert worker_shares(10, 4) == [range(0, 2), range(2, 5), range(5, 7), range(7, 10)]
    assert worker_shares(2, 4) == [range(0, 0), range(0, 1), range(1, 1), range(1, 2)]
    for count in range(0, 40):
        for workers in range(1, 7):
            shares = worker_shares(count, workers)
            assert [i for s in shares for i in s] == list(range(count))
            assert max(map(len, shares)) - min(map(len, shares)) <= 1
