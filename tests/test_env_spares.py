"""Reused environment instances (``Family.reuse_instances``, environments/core/spares.py): a
closed session's instance serves the next ``/create``, never beyond ``max_sessions`` instances,
never after one of its calls failed, and every instance is closed on shutdown or when idle."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp.test_utils import TestServer

from environments.core.base import InvalidTaskError, ResetResult, StepResult, TaskCatalog, TextEnvironment
from environments.core.client import EnvClient, EnvServerError
from environments.core.server import build_app
from environments.core.spares import SpareInstances
from environments.registry import Family

pytestmark = pytest.mark.timeout(60)


class _CountedEnv(TextEnvironment):
    """Records every instance made, the tasks each was reset onto and whether it was closed."""

    name = "counted"
    made: list["_CountedEnv"] = []

    def __init__(self) -> None:
        self.tasks: list[str] = []
        self.closed = False
        _CountedEnv.made.append(self)

    def reset(self, task_id: str, seed: int | None = None) -> ResetResult:
        if self.closed:
            raise RuntimeError("reset of a closed instance")
        if task_id not in {"a", "b"}:
            raise InvalidTaskError(f"no task {task_id!r}")
        self.tasks.append(task_id)
        return ResetResult(f"start {task_id}", {"task_id": task_id, "max_steps": 5, "instructions": "go"})

    def step(self, action: str) -> StepResult:
        if action == "crash":
            raise RuntimeError("boom")
        return StepResult("ok", 1.0, action == "finish", False, {})

    def close(self) -> None:
        self.closed = True


class _Catalog(TaskCatalog):
    def task_ids(self, split: str):
        return ["a", "b"]


REUSING = Family(name="counted", env_factory=_CountedEnv, catalog_factory=_Catalog, reuse_instances=True)
CLOSING = Family(name="counted", env_factory=_CountedEnv, catalog_factory=_Catalog)


@pytest.fixture(autouse=True)
def _fresh_counts():
    _CountedEnv.made.clear()
    yield
    _CountedEnv.made.clear()


def test_spare_pool_order_limit_expiry_and_drain():
    now = [0.0]
    pool = SpareInstances(2, clock=lambda: now[0])
    first, second, third = object(), object(), object()
    assert pool.take() is None
    assert pool.offer(first) and pool.offer(second)
    assert not pool.offer(third) and len(pool) == 2  # full: the caller closes it
    assert pool.take() is second  # the most recently released first
    pool.offer(third)
    now[0] = 10.0
    assert pool.expired(idle_timeout=20.0) == [] and len(pool) == 2
    now[0] = 25.0
    assert pool.take() is third and pool.offer(third)  # released again at 25: not expired at 30
    now[0] = 30.0
    assert pool.expired(idle_timeout=20.0) == [first]  # released at 0
    assert pool.drain() == [third] and len(pool) == 0
    assert SpareInstances(0).offer(first) is False
    with pytest.raises(ValueError):
        SpareInstances(-1)


async def test_closed_session_instance_serves_the_next_create():
    async with TestServer(build_app(REUSING)) as test_server:
        async with EnvClient(str(test_server.make_url(""))) as client:
            one = await client.create(task_id="a")
            await client.step(one.env_id, "finish")
            await client.close(one.env_id)
            two = await client.create(task_id="b")
            assert two.observation == "start b" and two.env_id != one.env_id
            assert len(_CountedEnv.made) == 1 and _CountedEnv.made[0].tasks == ["a", "b"]
            assert not _CountedEnv.made[0].closed
            stats = await client.stats()
            assert stats["sessions_reused"] == 1 and stats["sessions_created"] == 2
            with pytest.raises(EnvServerError) as error:  # the old id stays unknown
                await client.step(one.env_id, "x")
            assert error.value.status == 404
            await client.close(two.env_id)
    assert [env.closed for env in _CountedEnv.made] == [True]  # the spare is closed on shutdown


@pytest.mark.parametrize("family, override", [(CLOSING, None), (REUSING, False)], ids=["family", "no-reuse"])
async def test_without_reuse_each_instance_is_closed(family, override):
    async with TestServer(build_app(family, reuse_instances=override)) as test_server:
        async with EnvClient(str(test_server.make_url(""))) as client:
            for task in ("a", "b"):
                await client.close((await client.create(task_id=task)).env_id)
                assert _CountedEnv.made[-1].closed
            assert (await client.stats())["sessions_reused"] == 0
    assert len(_CountedEnv.made) == 2


async def test_instances_never_exceed_max_sessions():
    async with TestServer(build_app(REUSING, max_sessions=2)) as test_server:
        async with EnvClient(str(test_server.make_url("")), retries=0) as client:
            ids = [(await client.create(task_id="a")).env_id for _ in range(2)]
            with pytest.raises(EnvServerError) as error:
                await client.create(task_id="a")
            assert error.value.status == 503
            for round_ in range(3):  # close one, create one: always a spare, never a third instance
                await client.close(ids.pop(0))
                ids.append((await client.create(task_id="b")).env_id)
            assert len(_CountedEnv.made) == 2
            assert (await client.stats())["sessions_reused"] == 3


async def test_an_instance_whose_call_failed_is_closed_not_reused():
    async with TestServer(build_app(REUSING)) as test_server:
        async with EnvClient(str(test_server.make_url(""))) as client:
            env_id = (await client.create(task_id="a")).env_id
            with pytest.raises(EnvServerError) as error:
                await client.step(env_id, "crash")
            assert error.value.status == 500
            await client.close(env_id)
            assert _CountedEnv.made[0].closed
            await client.create(task_id="a")
            assert len(_CountedEnv.made) == 2 and (await client.stats())["sessions_reused"] == 0


async def test_a_failed_reset_of_a_spare_closes_it():
    async with TestServer(build_app(REUSING)) as test_server:
        async with EnvClient(str(test_server.make_url(""))) as client:
            await client.close((await client.create(task_id="a")).env_id)
            with pytest.raises(EnvServerError) as error:
                await client.create(task_id="missing")
            assert error.value.status == 404 and _CountedEnv.made[0].closed
            await client.create(task_id="b")
            assert len(_CountedEnv.made) == 2 and _CountedEnv.made[1].tasks == ["b"]


async def test_idle_spares_are_closed():
    async with TestServer(build_app(REUSING, idle_timeout=0.3)) as test_server:
        async with EnvClient(str(test_server.make_url(""))) as client:
            await client.close((await client.create(task_id="a")).env_id)
            assert not _CountedEnv.made[0].closed
            for _ in range(40):
                if _CountedEnv.made[0].closed:
                    break
                await asyncio.sleep(0.05)
            assert _CountedEnv.made[0].closed
            await client.create(task_id="a")
            assert len(_CountedEnv.made) == 2


async def test_a_spare_that_broke_while_idle_is_replaced_and_the_create_succeeds():
    """A kept instance whose reset fails (not for a bad task: its browser died while idle) is
    closed, and a new instance serves the same /create; the client sees no error."""
    async with TestServer(build_app(REUSING)) as test_server:
        async with EnvClient(str(test_server.make_url("")), retries=0) as client:
            await client.close((await client.create(task_id="a")).env_id)
            broken = _CountedEnv.made[0]
            broken.reset = lambda task_id, seed=None: (_ for _ in ()).throw(ConnectionRefusedError("driver gone"))
            created = await client.create(task_id="b")
            assert created.observation == "start b"
            assert broken.closed and len(_CountedEnv.made) == 2 and _CountedEnv.made[1].tasks == ["b"]
            stats = await client.stats()
            assert stats["spares_replaced"] == 1 and stats["sessions_reused"] == 0 and stats["errors_total"] == 0
            assert (await client.step(created.env_id, "finish")).done
