"""ScienceWorld family: splits, pool, episode semantics, gold paths through HTTP, JVM cleanup,
several worlds to a JVM.

References are independent of the code under test: a separate simulator started here gives the
official splits, the gold action paths (``generateGoldPath``) and the valid-action lists.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
import time

import pytest
from waiting import wait_until

scienceworld = pytest.importorskip("scienceworld", reason="the scienceworld package is not installed")
if shutil.which("java") is None:
    pytest.skip("ScienceWorld needs Java (apt-get install openjdk-17-jre-headless)", allow_module_level=True)

from environments.core.base import InvalidTaskError  # noqa: E402
from environments.scienceworld.catalog import ScienceWorldCatalog, parse_task_id  # noqa: E402
from environments.scienceworld.env import ScienceWorldEnvironment  # noqa: E402
from environments.scienceworld.pool import (  # noqa: E402
    PoolBusyError,
    PoolClosedError,
    PoolTimeoutError,
    SimulatorPool,
    java_pid,
    start_simulator,
    stop_simulator,
)
from environments.scienceworld.shortlist import is_useful  # noqa: E402
from environments.scienceworld.splits import from_ranges, load_splits, query_simulator, to_ranges  # noqa: E402
from environments.scienceworld.valid_actions import copy_java_list, valid_action_list  # noqa: E402

# Tasks with short gold paths whose gold-path generation is fast (< 0.3 s).
GOLD_TASKS = ("lifespan-longest-lived", "find-non-living-thing", "chemistry-mix-paint-secondary-color")


def scienceworld_jvms(parent: int | None = None) -> set[int]:
    """Pids of live (non-zombie) JVMs running scienceworld.jar (only ``parent``'s children when
    given)."""
    pids = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmdline = fh.read().decode(errors="replace")
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read().decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if "scienceworld.jar" in cmdline and fields[0] != "Z" and parent in (None, int(fields[1])):
            pids.add(int(entry))
    return pids


@pytest.fixture(scope="module")
def reference():
    """A simulator owned by the test (not by the code under test)."""
    sim = start_simulator()
    yield sim
    stop_simulator(sim)


def gold_path(sim, task: str, variation: int) -> list[str]:
    sim.load(task, variation, "", generateGoldPath=True)
    return list(sim.get_gold_action_sequence())


# ----------------------------------------------------------------------------- catalog and splits


def check_splits(sim, tasks: list[str] | None) -> None:
    live = query_simulator(sim, tasks)
    stored = load_splits()
    assert list(live) == (tasks or list(stored))
    for name, entry in live.items():
        for split in ("train", "dev", "test"):
            assert from_ranges(entry[split]) == stored[name][split], (name, split)
        assert entry["max_variations"] == stored[name]["max_variations"]


def test_stored_splits_match_the_simulator_api_on_a_sample(reference):
    assert sorted(load_splits()) == sorted(reference.get_task_names())
    check_splits(reference, ["boil", "find-animal", "inclined-plane-friction-named-surfaces", "use-thermometer"])


@pytest.mark.slow
def test_stored_splits_match_the_simulator_api_for_all_tasks(reference):
    check_splits(reference, None)


def test_catalog_splits_are_disjoint_and_cover_all_variations():
    catalog = ScienceWorldCatalog()
    ids = {split: catalog.task_ids(split) for split in catalog.splits}
    assert catalog.splits == ("train", "dev", "test")
    assert sum(len(v) for v in ids.values()) == 7207
    assert len(set().union(*map(set, ids.values()))) == 7207
    assert ids["test"][0] == "boil/var=21"
    assert catalog.resolve("test", 0) == "boil/var=21"
    with pytest.raises(InvalidTaskError):
        catalog.task_ids("validation")
    with pytest.raises(InvalidTaskError):
        catalog.resolve("test", len(ids["test"]))


def test_task_id_parsing_accepts_package_aliases_and_rejects_unknowns():
    assert parse_task_id("boil/var=3") == ("boil", 3)
    assert parse_task_id("task-1-boil/var=3") == ("boil", 3)
    assert parse_task_id("1-1/var=3") == ("boil", 3)
    for bad in ("boil", "boil/var=30", "no-such-task/var=0", "boil/var=-1", ""):
        with pytest.raises(InvalidTaskError):
            parse_task_id(bad)


def test_ranges_roundtrip():
    values = [0, 1, 2, 5, 7, 8]
    assert to_ranges(values) == [[0, 3], [5, 6], [7, 9]]
    assert from_ranges(to_ranges(values)) == values


# ------------------------------------------------------------------------------------ the pool


class FakeSim:
    def __init__(self) -> None:
        self.stopped = False


def test_pool_is_bounded_blocks_and_reuses():
    started: list[FakeSim] = []

    def factory() -> FakeSim:
        started.append(FakeSim())
        return started[-1]

    pool = SimulatorPool(size=2, factory=factory, stopper=lambda s: setattr(s, "stopped", True))
    a, b = pool.acquire(), pool.acquire()
    assert a is not b and len(started) == 2
    with pytest.raises(PoolTimeoutError):
        pool.acquire(timeout=0.1)

    got: list[FakeSim] = []
    waiter = threading.Thread(target=lambda: got.append(pool.acquire(timeout=5)))
    waiter.start()
    time.sleep(0.2)
    assert not got and pool.stats()["waiting"] == 1
    pool.release(a)
    waiter.join(5)
    assert got == [a] and len(started) == 2  # reused, not a third simulator

    pool.release(b, broken=True)  # discarded and stopped
    assert b.stopped and pool.stats()["discarded"] == 1
    c = pool.acquire()
    assert c is not b and len(started) == 3
    with pytest.raises(ValueError):
        pool.release(FakeSim())
    pool.release(c)
    pool.shutdown()
    assert c.stopped and not a.stopped  # a is still lent: stopped when given back
    pool.release(a)
    assert a.stopped
    with pytest.raises(PoolClosedError):
        pool.acquire()


def test_pool_bounds_the_number_of_waiters():
    pool = SimulatorPool(size=1, factory=FakeSim, stopper=lambda s: None, max_waiting=1)
    held = pool.acquire()
    waiter = threading.Thread(target=lambda: pool.release(pool.acquire(timeout=5)))
    waiter.start()
    assert wait_until(lambda: pool.stats()["waiting"] == 1, 5)
    with pytest.raises(PoolBusyError):  # a second waiter would be one too many
        pool.acquire(timeout=5)
    pool.release(held)
    waiter.join(5)
    assert not waiter.is_alive() and pool.stats()["idle"] == 1


# ------------------------------------------------------------------------ in-process episodes


class TestInProcess:
    """One real JVM in a private pool, shared by the tests of this class."""

    @pytest.fixture(scope="class")
    def pool(self):
        pool = SimulatorPool(size=1)
        yield pool
        pool.shutdown()

    @pytest.fixture
    def env(self, pool):
        env = ScienceWorldEnvironment(pool_getter=lambda: pool)
        yield env
        env.close()

    def test_reset_observation_and_info(self, env, reference):
        result = env.reset("find-non-living-thing/var=225")
        reference.load("find-non-living-thing", 225, "")
        reference.reset()
        assert result.observation.startswith(reference.taskdescription().strip())
        assert "This room is called" in result.observation
        info = result.info
        assert info["task_id"] == "find-non-living-thing/var=225" and info["split"] == "test"
        assert info["max_steps"] == 100 and "focus on OBJ" in info["instructions"]
        assert "available_actions" not in info  # not computed unless asked
        assert set(info["action_templates"]) == set(reference.get_possible_actions())

    def test_gold_path_reaches_full_score_and_rewards_sum_to_one(self, env, reference):
        actions = gold_path(reference, "lifespan-longest-lived", 93)
        env.reset("lifespan-longest-lived/var=93")
        total = 0.0
        for action in actions:
            result = env.step(action)
            total += result.reward
            if result.done:
                break
        assert result.done and result.info["success"] and result.info["score"] == 100
        assert total == pytest.approx(1.0)
        assert env.simulator is None  # returned to the pool when the episode ended

    def test_valid_actions_only_on_request_and_equal_to_the_simulator(self, env, reference):
        env.reset("lifespan-longest-lived/var=93")
        plain = env.step("open door to outside")
        assert "available_actions" not in plain.info
        listed = env.step("check valid actions")
        reference.load("lifespan-longest-lived", 93, "")
        reference.reset()
        reference.step("open door to outside")
        expected = set(reference.get_valid_action_object_combinations())
        assert set(listed.info["available_actions"]) == expected
        assert listed.observation.startswith("Valid actions: ") and listed.reward == 0.0
        assert not listed.info["invalid_action"] and listed.info["steps"] == 2

    def test_valid_action_list_is_the_element_by_element_copy(self, reference):
        """copy_java_list joins a Java list in the JVM: the same actions in the same order as
        the package's element-by-element copy of that list, in a small room and in a kitchen
        of 2,000+ (two calls in one state may name objects differently, so one list is
        copied both ways)."""
        reference.load("boil", 0, "")
        reference.reset()
        for action in ("look around", "open door to kitchen", "go to kitchen"):
            reference.step(action)
            java_list = reference.server.getValidActionObjectCombinations()
            expected = list(java_list)
            assert copy_java_list(java_list, reference._gateway) == expected
        assert len(expected) > 2000
        assert len(valid_action_list(reference)) > 2000

    def test_short_list_is_valid_useful_and_puts_the_task_object_in_reach(self, env, reference):
        env.reset("power-component/var=15")  # "Your task is to turn on the electric motor. ..."
        listed = env.valid_actions()
        reference.load("power-component", 15, "")
        reference.reset()
        valid = set(reference.get_valid_action_object_combinations())
        assert set(listed) <= valid and len(listed) == len(set(listed))
        assert all(is_useful(a) for a in listed) and "reset task" not in listed
        assert len(valid) - len(listed) > 300  # the absurd combinations are dropped
        # the task's object is within a lettered agent's 26 (the order before 2026-12-05 put it
        # at 194 after the gold path's first step:
        # results/sciworld_options/test_before_walks.jsonl.gz)
        assert "focus on electric motor" in listed[:26]

    def test_invalid_action_is_a_normal_step_and_mistakes_fail(self, env):
        env.reset("lifespan-longest-lived/var=93")
        result = env.step("dance wildly")
        assert result.info["invalid_action"] and not result.done and result.reward == 0.0
        assert "No known action" in result.observation
        env.step("open door to outside")
        env.step("go to outside")
        result = env.step("focus on baby mouse")  # not the longest-lived animal
        assert result.done and not result.info["success"] and result.info["score"] < 0

    def test_step_limit_truncates(self, pool):
        env = ScienceWorldEnvironment(max_steps=2, pool_getter=lambda: pool)
        try:
            env.reset("find-non-living-thing/var=225")
            assert not env.step("look around").truncated
            last = env.step("look around")
            assert last.truncated and not last.done
        finally:
            env.close()

    def test_unknown_task_raises_before_borrowing(self, env, pool):
        with pytest.raises(InvalidTaskError):
            env.reset("boil/var=9999")
        assert pool.stats()["lent"] == 0

    def test_instances_share_one_jvm_and_queue_for_it(self, pool):
        first = ScienceWorldEnvironment(pool_getter=lambda: pool)
        second = ScienceWorldEnvironment(pool_getter=lambda: pool)
        first.reset("find-non-living-thing/var=225")
        pid = java_pid(first.simulator)
        done = threading.Event()
        worker = threading.Thread(target=lambda: (second.reset("lifespan-longest-lived/var=93"), done.set()))
        worker.start()
        assert not done.wait(1.0)  # blocked: the pool has one JVM and it is lent
        first.close()
        first.close()  # idempotent
        assert done.wait(30)
        worker.join()
        assert java_pid(second.simulator) == pid and pool.started == 1
        second.close()


# ------------------------------------------------------------------------------ through HTTP


class TestHTTP:
    @pytest.fixture(scope="class")
    def server(self, reference):  # after the reference JVM exists, so it is in `before`
        from agentrl_common.processes import start_env_server

        before = scienceworld_jvms()
        server = start_env_server("scienceworld", extra_args=["--pool-size", "1"])
        yield server, before
        server.stop()

    async def test_gold_paths_of_test_variations_reach_score_100(self, server, reference):
        from environments.core.client import EnvClient

        srv, _ = server
        catalog = ScienceWorldCatalog(GOLD_TASKS)
        test_ids = catalog.task_ids("test")
        # one test variation per task, fixed in advance (the 8th of each task's test split)
        chosen = [[t for t in test_ids if t.startswith(task + "/")][7] for task in GOLD_TASKS]
        async with EnvClient(srv.url, timeout=120) as client:
            assert len(await client.tasks("test")) == 1819
            successes = 0
            for task_id in chosen:
                name, variation = parse_task_id(task_id)
                actions = gold_path(reference, name, variation)
                env_id, _, info = await client.create(task_id=task_id)
                assert info["task_id"] == task_id
                for action in actions:
                    result = await client.step(env_id, action)
                    if result.done:
                        break
                successes += int(result.done and result.info["success"] and result.info["score"] == 100)
                await client.close(env_id)
            assert successes == len(chosen)

    async def test_bad_inputs_and_queueing_for_the_single_jvm(self, server):
        from environments.core.client import EnvClient, EnvServerError

        srv, before = server
        async with EnvClient(srv.url, timeout=120) as client:
            with pytest.raises(EnvServerError) as error:
                await client.create(task_id="no-such-task/var=0")
            assert error.value.status == 404
            with pytest.raises(EnvServerError) as error:
                await client.create(split="test", index=10**6)
            assert error.value.status == 404
            first, _, _ = await client.create(task_id="find-non-living-thing/var=225")
            step = await client.step(first, "xyzzy")
            assert step.info["invalid_action"] and not step.done
            queued = asyncio.create_task(client.create(task_id="lifespan-longest-lived/var=93"))
            await asyncio.sleep(1.0)
            assert not queued.done()  # waits for the only JVM instead of starting another
            assert len(scienceworld_jvms() - before) == 1
            await client.close(first)
            second, _, _ = await asyncio.wait_for(queued, 60)
            assert len(scienceworld_jvms() - before) == 1
            await client.close(second)

    async def test_no_jvm_survives_the_server(self, server):
        from environments.core.client import EnvClient

        srv, before = server
        async with EnvClient(srv.url, timeout=120) as client:  # (the JVM starts with a world)
            await client.create(task_id="find-non-living-thing/var=225")  # left open
        assert scienceworld_jvms() - before  # the server's JVM is alive while it runs
        srv.stop()
        assert wait_until(lambda: not (scienceworld_jvms() - before)), scienceworld_jvms() - before


# ------------------------------------------------------------- several worlds to a JVM (shared_jvm)

# short gold paths whose generation is fast (the tasks of GOLD_TASKS)
SHARED_GOLD = (("lifespan-longest-lived", 93), ("find-non-living-thing", 225),
               ("chemistry-mix-paint-secondary-color", 12))


def test_interleaved_episodes_in_one_jvm_solve_their_tasks_with_the_gold_paths():
    from environments.scienceworld.shared_jvm import SharedJvms

    reference = start_simulator()  # the test's own simulator: the gold paths
    try:
        paths = {}
        for task, variation in SHARED_GOLD:
            reference.load(task, variation, "", generateGoldPath=True)
            paths[f"{task}/var={variation}"] = list(reference.get_gold_action_sequence())
    finally:
        stop_simulator(reference)
    jvms = SharedJvms(len(paths), start_simulator, stop_simulator)
    pool = SimulatorPool(len(paths), factory=jvms.factory, stopper=jvms.stopper)
    envs = {task: ScienceWorldEnvironment(pool_getter=lambda: pool) for task in paths}
    try:
        for task, env in envs.items():
            env.reset(task)
        assert jvms.jvms_started == 1
        assert len({java_pid(env.simulator) for env in envs.values()}) == 1
        results = {}
        for turn in range(max(map(len, paths.values()))):  # one action of each episode in turn
            for task, env in envs.items():
                if task not in results and turn < len(paths[task]):
                    result = env.step(paths[task][turn])
                    if result.done:
                        results[task] = result.info
        assert sorted(results) == sorted(paths)
        assert all(info["success"] and info["score"] == 100 for info in results.values())
    finally:
        for env in envs.values():
            env.close()
        pool.shutdown()
    assert jvms.live_jvms() == 0


async def test_the_server_flag_puts_two_sessions_in_one_jvm_and_both_solve_their_tasks():
    from agentrl_common.processes import start_env_server
    from environments.core.client import EnvClient

    reference = start_simulator()
    try:
        paths = {}
        for task, variation in SHARED_GOLD[:2]:
            reference.load(task, variation, "", generateGoldPath=True)
            paths[f"{task}/var={variation}"] = list(reference.get_gold_action_sequence())
    finally:
        stop_simulator(reference)
    server = start_env_server("scienceworld", extra_args=["--pool-size", "2", "--worlds-per-jvm", "2"])
    try:
        async with EnvClient(server.url, timeout=120) as client:
            ids = {task: (await client.create(task_id=task))[0] for task in paths}
            assert len(scienceworld_jvms(server.pid)) == 1
            done = {}
            for turn in range(max(map(len, paths.values()))):
                for task, env_id in ids.items():
                    if task not in done and turn < len(paths[task]):
                        result = await client.step(env_id, paths[task][turn])
                        if result.done:
                            done[task] = result.info
            assert sorted(done) == sorted(paths)
            assert all(info["success"] and info["score"] == 100 for info in done.values())
    finally:
        server.stop()


def test_simulators_start_without_a_perf_data_file(monkeypatch):
    """py4j reads the gateway's port from the JVM's stdout, where a JVM that finds its
    ``/tmp/hsperfdata_<user>/<pid>`` file locked prints a warning first; the pool's JVMs keep no
    such file. Control: a JVM started with the option removed does keep one."""
    import getpass
    import tempfile

    from py4j.java_gateway import launch_gateway
    from scienceworld.constants import JAR_PATH

    from environments.scienceworld.pool import NO_PERF_DATA

    def perf_file(pid: int) -> bool:
        folder = os.path.join(tempfile.gettempdir(), f"hsperfdata_{getpass.getuser()}")
        return os.path.exists(os.path.join(folder, str(pid)))

    sim = start_simulator()
    try:
        assert NO_PERF_DATA in os.environ["JAVA_TOOL_OPTIONS"].split()
        assert not perf_file(java_pid(sim))
    finally:
        stop_simulator(sim)
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", "")
    _, process = launch_gateway(classpath=JAR_PATH, die_on_exit=True, return_proc=True)
    try:
        assert wait_until(lambda: perf_file(process.pid), 10)
    finally:
        process.stdin.write(b"\n")
        process.stdin.flush()
        process.wait(timeout=10)
