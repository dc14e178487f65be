"""The environment HTTP protocol: server core, client, launcher, registry.

Real server subprocesses (TextCraft: cheap to start and step) for the protocol and error cases,
and an in-process server over a fake thread-pool family for the concurrency rules of the core.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from agentrl_common.registry import UnknownNameError
from environments.core.base import InvalidTaskError, ResetResult, StepResult, TaskCatalog, TextEnvironment
from environments.core.client import EnvClient, EnvConnectionError, EnvServerError
from environments.core.server import build_app
from agentrl_common.processes import ServerStartError, free_port, start_env_server
from environments.registry import Family, family_names, get_family

pytestmark = pytest.mark.timeout(120)

# a TextCraft goal of depth 1 in the test split, and the two actions that craft it
QUICK_GOAL = "acacia_planks"
QUICK_SOLUTION = ["get 1 acacia logs", "craft 4 acacia planks using 1 acacia logs"]


# ------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def server():
    with start_env_server("textcraft", extra_args=["--max-sessions", "300", "--max-body", "65536"]) as proc:
        yield proc


@pytest.fixture(scope="module")
def replica():
    with start_env_server("textcraft") as proc:
        yield proc


@pytest.fixture(scope="module")
def small_server():
    with start_env_server("textcraft", extra_args=["--max-sessions", "3"]) as proc:
        yield proc


@pytest.fixture(scope="module")
def reaping_server():
    with start_env_server("textcraft", extra_args=["--idle-timeout", "0.4"]) as proc:
        yield proc


async def post(url: str, path: str, body: bytes | str | dict) -> tuple[int, dict, dict]:
    """Raw POST (no EnvClient), returning status, JSON answer and headers."""
    async with aiohttp.ClientSession() as http:
        kwargs = {"json": body} if isinstance(body, dict) else {"data": body, "headers": {"Content-Type": "application/json"}}
        async with http.post(url + path, **kwargs) as response:
            assert response.content_type == "application/json"
            return response.status, await response.json(), dict(response.headers)


# --------------------------------------------------------------------------- basic endpoints


async def test_health_tasks_and_stats(server):
    async with EnvClient(server.url) as client:
        assert (await client.health())["status"] == "ok"
        train, dev, test = [await client.tasks(s) for s in ("train", "dev", "test")]
        assert len(train) + len(dev) + len(test) == 544 and not set(train) & set(test)
        assert not set(dev) & (set(train) | set(test))
        stats = await client.stats()
        for key in ("live_sessions", "steps", "errors_total", "uptime_s", "invalid_actions", "sessions_reaped"):
            assert key in stats


async def test_create_by_id_and_by_split_index_step_reset_close(server):
    async with EnvClient(server.url) as client:
        test_ids = await client.tasks("test")
        env_id, observation, info = await client.create(split="test", index=0)
        assert info["task_id"] == test_ids[0] and "Goal: craft" in observation
        assert {"max_steps", "instructions"} <= set(info)
        env2, observation2, _ = await client.create(task_id=test_ids[0])
        assert observation2 == observation  # deterministic task content
        result = await client.step(env_id, "inventory")
        assert isinstance(result, StepResult) and result.reward == 0.0 and not result.done
        reset = await client.reset(env_id, task_id=QUICK_GOAL)
        assert reset.info["task_id"] == QUICK_GOAL
        assert await client.close(env_id) and await client.close(env2)
        assert not await client.close(env_id)  # already gone


# -------------------------------------------------------------------------------- error cases


async def test_unknown_env_id_is_404(server):
    for path, body in [("/step", {"env_id": "nope", "action": "inventory"}), ("/reset", {"env_id": "nope"}), ("/close", {"env_id": "nope"})]:
        status, data, _ = await post(server.url, path, body)
        assert status == 404 and "unknown env_id" in data["error"]
    async with EnvClient(server.url) as client:
        with pytest.raises(EnvServerError) as error:
            await client.step("nope", "inventory")
        assert error.value.status == 404


async def test_unknown_task_is_404(server):
    for body in [{"task_id": "no_such_item"}, {"split": "test", "index": 10**6}, {"split": "validation", "index": 0}, {"split": "test", "index": -1}]:
        status, data, _ = await post(server.url, "/create", body)
        assert status == 404, body
        assert data["error"]
    async with aiohttp.ClientSession() as http:
        async with http.get(server.url + "/tasks", params={"split": "validation"}) as response:
            assert response.status == 404 and "error" in await response.json()


async def test_malformed_json_is_400(server):
    for body in [b"{not json", b"[1, 2]", b"", b'"just a string"', b"\xff\xfe"]:
        status, data, _ = await post(server.url, "/create", body)
        assert status == 400 and data["error"], body


@pytest.mark.parametrize(
    "path, body",
    [
        ("/create", {}),
        ("/create", {"task_id": 5}),
        ("/create", {"split": "test"}),
        ("/create", {"split": "test", "index": "3"}),
        ("/create", {"split": "test", "index": True}),
        ("/create", {"split": "test", "index": 1.5}),
        ("/create", {"task_id": QUICK_GOAL, "seed": "7"}),
        ("/create", {"task_id": QUICK_GOAL, "split": "test", "index": 0}),
        ("/step", {"env_id": "x"}),
        ("/step", {"action": "inventory"}),
        ("/step", {"env_id": 12, "action": "inventory"}),
        ("/step", {"env_id": "x", "action": ["get", "1"]}),
        ("/reset", {}),
        ("/close", {"env_id": None}),
    ],
)
async def test_missing_or_wrongly_typed_fields_are_400(server, path, body):
    status, data, _ = await post(server.url, path, body)
    assert status == 400 and data["error"]


async def test_wrong_types_on_a_live_session_are_400(server):
    async with EnvClient(server.url) as client:
        env_id, _, _ = await client.create(task_id=QUICK_GOAL)
        status, data, _ = await post(server.url, "/step", {"env_id": env_id, "action": 3})
        assert status == 400 and "action" in data["error"]
        status, _, _ = await post(server.url, "/reset", {"env_id": env_id, "seed": "x"})
        assert status == 400
        assert (await client.step(env_id, "inventory")).observation.startswith("Inventory")
        await client.close(env_id)


async def test_oversized_body_is_413(server):
    async with EnvClient(server.url) as client:
        env_id, _, _ = await client.create(task_id=QUICK_GOAL)
        status, data, _ = await post(server.url, "/step", {"env_id": env_id, "action": "x" * 100_000})
        assert status == 413 and data["error"]
        assert (await client.step(env_id, "inventory")).observation  # the session is unharmed
        await client.close(env_id)


async def test_unknown_route_is_404_and_wrong_method_405_as_json(server):
    async with aiohttp.ClientSession() as http:
        async with http.get(server.url + "/nope") as response:
            assert response.status == 404 and "error" in await response.json()
        async with http.get(server.url + "/step") as response:
            assert response.status == 405 and "error" in await response.json()


async def test_step_after_episode_end_is_409_until_reset(server):
    async with EnvClient(server.url) as client:
        env_id, _, _ = await client.create(task_id=QUICK_GOAL)
        results = [await client.step(env_id, action) for action in QUICK_SOLUTION]
        assert results[-1].done and results[-1].reward == 1.0 and results[-1].info["success"]
        with pytest.raises(EnvServerError) as error:
            await client.step(env_id, "inventory")
        assert error.value.status == 409
        await client.reset(env_id)
        assert not (await client.step(env_id, "inventory")).done
        await client.close(env_id)


async def test_invalid_action_is_a_normal_step_and_counted(server):
    async with EnvClient(server.url) as client:
        before = (await client.stats())["invalid_actions"]
        env_id, _, _ = await client.create(task_id=QUICK_GOAL)
        result = await client.step(env_id, "dance wildly")
        assert result.info["invalid_action"] is True and not result.done and result.observation
        assert (await client.stats())["invalid_actions"] == before + 1
        await client.close(env_id)


async def test_capacity_is_503_with_retry_after(small_server):
    async with EnvClient(small_server.url, retries=0) as client:
        ids = [(await client.create(task_id=QUICK_GOAL)).env_id for _ in range(3)]
        status, data, headers = await post(small_server.url, "/create", {"task_id": QUICK_GOAL})
        assert status == 503 and "capacity" in data["error"] and int(headers["Retry-After"]) >= 1
        with pytest.raises(EnvServerError) as error:
            await client.create(task_id=QUICK_GOAL)
        assert error.value.status == 503 and error.value.retry_after is not None
        await client.close(ids[0])
        ids[0] = (await client.create(task_id=QUICK_GOAL)).env_id  # a freed slot is usable again
        for env_id in ids:
            await client.close(env_id)
        assert (await client.stats())["live_sessions"] == 0


async def test_idle_sessions_are_reaped(reaping_server):
    async with EnvClient(reaping_server.url) as client:
        env_id, _, _ = await client.create(task_id=QUICK_GOAL)
        await asyncio.sleep(1.2)
        with pytest.raises(EnvServerError) as error:
            await client.step(env_id, "inventory")
        assert error.value.status == 404
        stats = await client.stats()
        assert stats["sessions_reaped"] >= 1 and stats["live_sessions"] == 0


# ------------------------------------------------------------------------------- concurrency


async def test_256_concurrent_sessions_on_one_server(server):
    async with EnvClient(server.url, max_connections=256) as client:
        goals = await client.tasks("train")
        created = await asyncio.gather(*(client.create(task_id=goals[k % len(goals)]) for k in range(256)))
        assert len({c.env_id for c in created}) == 256
        assert (await client.stats())["live_sessions"] >= 256

        async def play(env_id: str, k: int) -> list[StepResult]:
            return [await client.step(env_id, action) for action in ("inventory", f"get {k % 5 + 1} stick", "inventory")]

        results = await asyncio.gather(*(play(c.env_id, k) for k, c in enumerate(created)))
        for k, steps in enumerate(results):
            assert [s.info["steps"] for s in steps] == [1, 2, 3]  # each session saw only its own steps
        await asyncio.gather(*(client.close(c.env_id) for c in created))
        assert (await client.stats())["live_sessions"] == 0


class _SlowEnv(TextEnvironment):
    """A thread-pool family: steps sleep, and overlapping calls on one instance are detected."""

    name = "slow"
    closed: list["_SlowEnv"] = []
    running = 0  # steps running now, over all instances
    most_running = 0  # the most steps that ran at once
    counter = threading.Lock()

    def __init__(self) -> None:
        self._busy = threading.Lock()
        self.n = 0

    def reset(self, task_id: str, seed: int | None = None) -> ResetResult:
        if task_id not in {"a", "b"}:
            raise InvalidTaskError(f"no task {task_id!r}")
        self.n = 0
        return ResetResult("start", {"task_id": task_id, "max_steps": 10, "instructions": "say anything"})

    def step(self, action: str) -> StepResult:
        if not self._busy.acquire(blocking=False):
            raise AssertionError("two calls ran at once on one instance")
        try:
            if action == "crash":
                raise RuntimeError("boom")
            with _SlowEnv.counter:
                _SlowEnv.running += 1
                _SlowEnv.most_running = max(_SlowEnv.most_running, _SlowEnv.running)
            try:
                time.sleep(0.1)
            finally:
                with _SlowEnv.counter:
                    _SlowEnv.running -= 1
            self.n += 1
            return StepResult(f"step {self.n}", 0.0, False, False, {"steps": self.n})
        finally:
            self._busy.release()

    def close(self) -> None:
        _SlowEnv.closed.append(self)


class _SlowCatalog(TaskCatalog):
    def task_ids(self, split: str):
        if split not in ("train", "test"):
            raise InvalidTaskError(split)
        return ["a"] if split == "train" else ["b"]


SLOW = Family(name="slow", env_factory=_SlowEnv, catalog_factory=_SlowCatalog)


async def test_core_serializes_one_instance_and_runs_instances_concurrently(startup_heap_frozen):
    async with TestServer(build_app(SLOW, workers=8)) as test_server:
        async with EnvClient(str(test_server.make_url(""))) as client:
            one = (await client.create(task_id="a")).env_id
            _SlowEnv.most_running = 0
            results = await asyncio.gather(*(client.step(one, "x") for _ in range(4)))
            assert sorted(r.info["steps"] for r in results) == [1, 2, 3, 4]
            assert _SlowEnv.most_running == 1  # one instance: one step at a time

            many = [(await client.create(task_id="b")).env_id for _ in range(4)]
            _SlowEnv.most_running = 0
            await asyncio.gather(*(client.step(env_id, "x") for env_id in many))
            # four instances: their steps overlapped (not one after the other)
            assert _SlowEnv.most_running >= 2, _SlowEnv.most_running


async def test_core_reports_environment_errors_as_500_and_keeps_serving():
    async with TestServer(build_app(SLOW)) as test_server:
        async with EnvClient(str(test_server.make_url(""))) as client:
            env_id = (await client.create(task_id="a")).env_id
            with pytest.raises(EnvServerError) as error:
                await client.step(env_id, "crash")
            assert error.value.status == 500 and "boom" in error.value.message
            assert (await client.step(env_id, "x")).info["steps"] == 1
            stats = await client.stats()
            assert stats["errors"].get("500") == 1


async def test_core_closes_every_instance_on_shutdown_and_after_failed_create():
    _SlowEnv.closed.clear()
    async with TestServer(build_app(SLOW)) as test_server:
        async with EnvClient(str(test_server.make_url(""))) as client:
            with pytest.raises(EnvServerError) as error:
                await client.create(task_id="missing")
            assert error.value.status == 404 and len(_SlowEnv.closed) == 1  # the instance made for it
            assert (await client.stats())["pending_creates"] == 0
            for _ in range(3):
                await client.create(task_id="a")
    assert len(_SlowEnv.closed) == 4


# ------------------------------------------------------------------------ client: replicas


async def test_client_spreads_creates_over_replicas_and_routes_back(server, replica):
    urls = [server.url, replica.url]
    async with EnvClient(urls) as client:
        live_before = [(await client.stats(replica=i))["live_sessions"] for i in range(2)]
        created = [await client.create(task_id=QUICK_GOAL) for _ in range(6)]
        owners = [client.replica_of(c.env_id) for c in created]
        assert owners.count(urls[0]) == 3 and owners.count(urls[1]) == 3
        live = [(await client.stats(replica=i))["live_sessions"] - live_before[i] for i in range(2)]
        assert live == [3, 3]
        # every env id goes back to the replica that holds it: a wrong route would be a 404
        for c in created:
            assert (await client.step(c.env_id, "inventory")).info["steps"] == 1
            await client.reset(c.env_id)
            assert await client.close(c.env_id)


async def test_client_fails_over_a_dead_replica_on_create_but_never_retries_a_step(server):
    dead = f"http://127.0.0.1:{free_port()}"
    async with EnvClient([dead, server.url], retries=2, backoff=0.01, timeout=5) as client:
        env_ids = [(await client.create(task_id=QUICK_GOAL)).env_id for _ in range(3)]
        assert all(client.replica_of(e) == server.url for e in env_ids)
        health = await client.health_all()
        assert health[0] is None and health[1]["status"] == "ok"
        for env_id in env_ids:
            await client.close(env_id)
        with pytest.raises(EnvConnectionError):
            await client.step("0:whatever", "inventory")
    async with EnvClient(dead, retries=1, backoff=0.01, timeout=5) as client:
        with pytest.raises(EnvConnectionError):
            await client.create(task_id=QUICK_GOAL)


# ----------------------------------------------------------------------- launcher, registry


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_launcher_stop_leaves_no_process_behind():
    proc = start_env_server("babyai")
    try:
        async with EnvClient(proc.url) as client:
            for k in range(3):
                await client.create(split="test", index=k)
        assert _group_alive(proc.pid)
    finally:
        code = proc.stop()
    assert code == 0  # SIGTERM -> graceful shutdown
    assert not _group_alive(proc.pid)
    log = proc.log_tail()
    assert "closed 3 sessions on shutdown" in log and "Sampling rejected" not in log


def _running(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_server_exits_when_the_launching_process_dies_without_stopping_it():
    code = "from agentrl_common.processes import start_env_server; import time; s = start_env_server('textcraft'); print(s.pid, flush=True); time.sleep(120)"
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        server_pid = int(parent.stdout.readline())
        assert _running(server_pid)
        parent.kill()  # SIGKILL: no chance to call stop()
        parent.wait()
        deadline = time.monotonic() + 10
        while _running(server_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _running(server_pid)
    finally:
        parent.kill()
        parent.stdout.close()


def test_launcher_reports_a_server_that_dies_at_startup():
    with pytest.raises(ServerStartError) as error:
        start_env_server("no_such_family", startup_timeout=30)
    assert "No module named environments.no_such_family" in str(error.value)  # the stderr tail
    with pytest.raises(ServerStartError) as error:
        start_env_server("textcraft", extra_args=["--max-sessions", "lots"], startup_timeout=30)
    assert "invalid int value: 'lots'" in str(error.value)


def test_registry_is_lazy_and_lists_the_families():
    assert {"babyai", "textcraft"} <= set(family_names())
    code = "import sys, environments.registry as r; r.family_names(); print('minigrid' in sys.modules, 'textcraft' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]
    assert get_family("textcraft").inline and get_family("babyai").name == "babyai"
    with pytest.raises(UnknownNameError, match=r"^unknown environment family 'no_such_family'; known: babyai, "):
        get_family("no_such_family")
    with pytest.raises(UnknownNameError, match=r"did you mean 'textcraft'\?$"):
        get_family("textcraf")


# ----------------------------------------------------------------- malformed input and limits


@pytest.fixture(scope="module")
def babyai_server():
    with start_env_server("babyai") as proc:
        yield proc


@pytest.fixture(scope="module")
def guarded_server():
    with start_env_server("textcraft", extra_args=["--read-timeout", "0.5", "--max-connections", "8"]) as proc:
        yield proc


@pytest.fixture(scope="module")
def keyed_server():
    with start_env_server("textcraft", extra_args=["--api-key", "sesame"]) as proc:
        yield proc


BABYAI_TASK = "BabyAI-GoToLocal-v0/seed=7"
HUGE = "9" * 5000  # int() of more than 4,300 digits raises ValueError


async def test_huge_integers_in_task_ids_and_actions_are_4xx(server, babyai_server):
    """Before: 'ValueError: Exceeds the limit (4300 digits)' was a 500."""
    for seed in (HUGE, "9" * 200):  # refused by the core (> 256 characters), by the family
        status, data, _ = await post(babyai_server.url, "/create", {"task_id": f"BabyAI-GoToLocal-v0/seed={seed}"})
        assert status in (400, 404), data
    for url, task, action in [(babyai_server.url, BABYAI_TASK, f"go to red ball {HUGE}"), (server.url, QUICK_GOAL, f"get {HUGE} acacia logs"),
                              (server.url, QUICK_GOAL, f"craft 4 acacia planks using {HUGE} acacia logs")]:
        async with EnvClient(url) as client:
            env_id, _, _ = await client.create(task_id=task)
            result = await client.step(env_id, action)  # a normal step, not understood
            assert result.info["invalid_action"] or result.observation.startswith("Wrong item format"), result
            await client.close(env_id)


@pytest.mark.parametrize("query", ["offset=" + "9" * 30, "offset=" + HUGE, "limit=" + "9" * 30, "offset=-1", "offset=%2B5", "offset=%205", "offset=5%0A", "offset=1_0", "offset=%D9%A5", "limit=x"])
async def test_tasks_paging_needs_canonical_integers(server, query):
    """Before: GET /tasks?offset=<huge> was a 500 (orjson cannot encode it)."""
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{server.url}/tasks?split=train&{query}") as response:
            assert response.status == 400, (query, await response.text())


async def test_tasks_paging_beyond_the_end_is_empty(server):
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{server.url}/tasks?split=train&offset=1000000&limit=5") as response:
            data = await response.json()
    assert response.status == 200 and data["task_ids"] == [] and data["offset"] == 1000000


@pytest.mark.parametrize("family, task", [
    ("babyai", BABYAI_TASK + "\n"), ("babyai", " " + BABYAI_TASK), ("babyai", "BabyAI-GoToLocal-v0/seed=\u0667"),
    ("babyai", "BabyAI-GoToLocal-v0/seed=07"), ("babyai", "BabyAI-GoToLocal-v0/seed=+7"), ("babyai", "BabyAI-GoToLocal-v\u0660/seed=7"),
    ("textcraft", QUICK_GOAL + "\n"), ("textcraft", " " + QUICK_GOAL), ("textcraft", "acacia planks"), ("textcraft", "minecraft:" + QUICK_GOAL),
    ("textcraft", "ACACIA_PLANKS"), ("textcraft", "x" * 300),
])  # fmt: skip
async def test_only_canonical_task_ids_are_accepted(server, babyai_server, family, task):
    """Before: a trailing newline, a leading space or non-ASCII digits named a task."""
    url = babyai_server.url if family == "babyai" else server.url
    status, data, _ = await post(url, "/create", {"task_id": task})
    assert status in (400, 404), (task, data)
    canonical = BABYAI_TASK if family == "babyai" else QUICK_GOAL
    async with EnvClient(url) as client:
        env_id, _, info = await client.create(task_id=canonical)
        assert info["task_id"] == canonical
        await client.close(env_id)


async def _open(url: str, payload: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(payload)
    await writer.drain()
    return reader, writer


async def test_slow_requests_time_out(guarded_server):
    """Before: 300 connections that sent headers and 8 bytes of body were open after 100 s."""
    head = b"POST /create HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"task_i"
    slow = [await _open(guarded_server.url, head) for _ in range(3)] + [await _open(guarded_server.url, head[:25]) for _ in range(2)]
    answers = await asyncio.gather(*(asyncio.wait_for(reader.read(), 10) for reader, _ in slow))
    assert all(a.startswith(b"HTTP/1.1 408") for a in answers[:3]), answers
    assert answers[3:] == [b"", b""]  # incomplete headers: closed without an answer
    for _, writer in slow:
        writer.close()
    stats = await EnvClient(guarded_server.url).stats()
    assert stats["errors"].get("408") >= 3


async def test_connection_limit(guarded_server):
    idle = [await _open(guarded_server.url, b"") for _ in range(11)]
    refused = await asyncio.gather(*(asyncio.wait_for(reader.read(), 5) for reader, _ in idle[8:]))
    assert all(a.startswith(b"HTTP/1.1 503") and b"too many connections" in a for a in refused), refused
    for _, writer in idle:
        writer.close()
    await asyncio.sleep(0.2)
    async with EnvClient(guarded_server.url) as client:  # the slots are free again
        assert (await client.health())["status"] == "ok"


async def test_api_key(keyed_server):
    async with aiohttp.ClientSession() as http:
        async with http.get(keyed_server.url + "/health") as response:
            assert response.status == 200  # open: launchers and load balancers probe it
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sesame"}):
            async with http.post(keyed_server.url + "/create", json={"task_id": QUICK_GOAL}, headers=headers) as response:
                assert response.status == 401 and "API key" in (await response.json())["error"]
            async with http.get(keyed_server.url + "/stats", headers=headers) as response:
                assert response.status == 401
    async with EnvClient(keyed_server.url, api_key="sesame") as client:
        env_id, _, _ = await client.create(task_id=QUICK_GOAL)
        assert await client.close(env_id)


def test_non_loopback_without_api_key_refuses_to_start():
    for host in ("0.0.0.0", "::"):
        done = subprocess.run([sys.executable, "-m", "environments.textcraft", "--host", host, "--port", str(free_port())],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode != 0 and "without an API key" in done.stderr, done.stderr
