"""Latency and memory of the ScienceWorld, MiniWoB++ and deep-search families.

In-process (the environment class) and through HTTP (launcher + ``EnvClient``, one session,
sequential calls). Run::

    python benchmarks/speed/envs_heavy.py [--families scienceworld,miniwob,deepsearch] [--episodes N] [--json out.json]

ScienceWorld plays gold paths of test variations (a reference simulator makes them); MiniWoB++
plays the rule-based expert on test seeds; deep search plays the retrieval oracle on the ``lookup`` task set's test questions
(``deepsearch_lookup``; the searching oracle of ``deepsearch``: ``benchmarks/checks/deepsearch_oracle.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def rss_mb(pids) -> float:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as fh:
                for line in fh:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def ms(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    return {
        "n": len(values),
        "mean_ms": round(1000 * statistics.fmean(values), 2),
        "p50_ms": round(1000 * values[len(values) // 2], 2),
        "p95_ms": round(1000 * values[min(len(values) - 1, int(0.95 * len(values)))], 2),
    }


def timed(fn: Callable[[], Any], sink: list[float]) -> Any:
    start = time.perf_counter()
    out = fn()
    sink.append(time.perf_counter() - start)
    return out


async def atimed(coro, sink: list[float]) -> Any:
    start = time.perf_counter()
    out = await coro
    sink.append(time.perf_counter() - start)
    return out


# ------------------------------------------------------------------------------------ episodes


def scienceworld_episodes(n: int) -> list[tuple[str, list[str]]]:
    """Gold paths of ``n`` test variations of short tasks (made by a separate simulator)."""
    from environments.scienceworld.catalog import ScienceWorldCatalog, parse_task_id
    from environments.scienceworld.pool import start_simulator, stop_simulator

    tasks = ["lifespan-longest-lived", "find-non-living-thing", "chemistry-mix-paint-secondary-color", "use-thermometer"]
    ids = ScienceWorldCatalog(tasks).task_ids("test")
    chosen = [ids[(i * 37) % len(ids)] for i in range(n)]
    sim = start_simulator()
    try:
        episodes = []
        for task_id in chosen:
            name, variation = parse_task_id(task_id)
            sim.load(name, variation, "", generateGoldPath=True)
            episodes.append((task_id, list(sim.get_gold_action_sequence())))
        return episodes
    finally:
        stop_simulator(sim)


def bench_scienceworld(episodes_n: int) -> dict[str, Any]:
    from environments.scienceworld.env import ScienceWorldEnvironment
    from environments.scienceworld.pool import SimulatorPool, java_pid

    episodes = scienceworld_episodes(episodes_n)
    pool = SimulatorPool(size=1)
    env = ScienceWorldEnvironment(pool_getter=lambda: pool)
    first, resets, steps, valid = [], [], [], []
    successes = 0
    try:
        timed(lambda: env.reset(episodes[0][0]), first)  # JVM start + first load
        rss = rss_mb([java_pid(env.simulator)])
        env.close()
        env = ScienceWorldEnvironment(pool_getter=lambda: pool)
        for task_id, actions in episodes:
            timed(lambda: env.reset(task_id), resets)
            timed(lambda: env.step("check valid actions"), valid)
            for action in actions:
                result = timed(lambda: env.step(action), steps)
                if result.done:
                    break
            successes += int(result.info["success"])
        rss = max(rss, rss_mb([p for p in [java_pid(s) for s in pool.idle_simulators()] if p]))
    finally:
        env.close()
        pool.shutdown()
    out = {
        "first_reset_s (JVM start + load)": round(first[0], 2),
        "reset": ms(resets),
        "step": ms(steps),
        "step 'check valid actions'": ms(valid),
        "jvm_rss_mb": round(rss),
        "gold_success": f"{successes}/{len(episodes)}",
    }
    out["http"] = asyncio.run(_http_gold("scienceworld", episodes, ["--pool-size", "1"]))
    return out


async def _http_gold(family: str, episodes, extra_args) -> dict[str, Any]:
    from environments.core.client import EnvClient
    from agentrl_common.processes import start_env_server

    start = time.perf_counter()
    server = start_env_server(family, extra_args=extra_args)
    started = time.perf_counter() - start
    creates, steps = [], []
    try:
        async with EnvClient(server.url, timeout=120) as client:
            for task_id, actions in episodes:
                env_id, _, _ = await atimed(client.create(task_id=task_id), creates)
                for action in actions:
                    result = await atimed(client.step(env_id, action), steps)
                    if result.done:
                        break
                await client.close(env_id)
    finally:
        server.stop()
    return {"server_start_s": round(started, 2), "create": ms(creates), "step": ms(steps)}


def bench_miniwob(episodes_n: int) -> dict[str, Any]:
    from environments.miniwob.catalog import SUPPORTED_TASKS, MiniWoBCatalog, parse_task_id
    from environments.miniwob.env import MiniWoBEnvironment
    from environments.miniwob.expert import MiniWoBExpert

    ids = list(MiniWoBCatalog().task_ids("test"))[:episodes_n]
    env = MiniWoBEnvironment()
    first, same_task, other_task, steps = [], [], [], []
    successes = 0
    try:
        timed(lambda: env.reset(ids[0]), first)  # Chromium start + page load
        rss = rss_mb(env.browser.pids)
        timed(lambda: env.reset(ids[0]), same_task)
        for task_id in ids:
            result = timed(lambda: env.reset(task_id), other_task)
            expert, task, observation = MiniWoBExpert(), parse_task_id(task_id)[0], result.observation
            for _ in range(15):
                step = timed(lambda: env.step(expert.act(task, observation)), steps)
                observation = step.observation
                if step.done or step.truncated:
                    break
            successes += int(step.info["success"])
        for _ in range(20):
            timed(lambda: env.reset(ids[0]), same_task)
        rss = max(rss, rss_mb(env.browser.pids))
    finally:
        env.close()
    out = {
        "first_reset_s (Chromium start + page)": round(first[0], 2),
        "reset (same task)": ms(same_task),
        "reset (task switch, page load)": ms(other_task),
        "step": ms(steps),
        "chromium_rss_mb (all processes)": round(rss),
        "expert_success": f"{successes}/{len(ids)} ({len(SUPPORTED_TASKS)} tasks)",
    }
    out["http"] = asyncio.run(_http_expert(ids))
    return out


async def _http_expert(ids: list[str]) -> dict[str, Any]:
    from environments.core.client import EnvClient
    from agentrl_common.processes import start_env_server
    from environments.miniwob.catalog import parse_task_id
    from environments.miniwob.expert import MiniWoBExpert

    start = time.perf_counter()
    server = start_env_server("miniwob")
    started = time.perf_counter() - start
    creates, resets, steps = [], [], []
    try:
        async with EnvClient(server.url, timeout=120) as client:
            env_id, observation, _ = await atimed(client.create(task_id=ids[0]), creates)
            for task_id in ids:
                observation = (await atimed(client.reset(env_id, task_id=task_id), resets)).observation
                expert, task = MiniWoBExpert(), parse_task_id(task_id)[0]
                for _ in range(15):
                    result = await atimed(client.step(env_id, expert.act(task, observation)), steps)
                    observation = result.observation
                    if result.done or result.truncated:
                        break
            await client.close(env_id)
    finally:
        server.stop()
    return {"server_start_s": round(started, 2), "create (Chromium start)": ms(creates), "reset": ms(resets), "step": ms(steps)}


def bench_deepsearch(episodes_n: int) -> dict[str, Any]:
    from environments.deepsearch.backend import BackendConfig, SearchBackend
    from environments.deepsearch.env import DeepSearchEnvironment
    from environments.deepsearch.expert import DeepSearchOracle

    rss0 = rss_mb([os.getpid()])
    build: list[float] = []
    backend = timed(lambda: SearchBackend(BackendConfig(), "lookup"), build)
    rss = rss_mb([os.getpid()]) - rss0
    env = DeepSearchEnvironment(backend_getter=lambda: backend)
    ids = list(backend.catalog.task_ids("test"))
    searches, answers = [], []
    successes = 0
    for task_id in ids:
        item = backend.question(task_id)
        observation = env.reset(task_id).observation
        oracle = DeepSearchOracle(item.question, item.golden_answers)
        observation = timed(lambda: env.step(oracle.act(observation)), searches).observation
        result = timed(lambda: env.step(oracle.act(observation)), answers)
        successes += int(result.info["success"])
    out = {
        "backend_build_s (load + QA + BM25 index)": round(build[0], 2),
        "backend_rss_mb": round(rss),
        "passages": len(backend.passages),
        "questions (train/test)": f"{len(backend.catalog.task_ids('train'))}/{len(ids)}",
        "step <search> (k=3)": ms(searches),
        "step <answer>": ms(answers),
        "oracle_success (test split)": f"{successes}/{len(ids)} = {successes / len(ids):.1%}",
    }
    out["http"] = asyncio.run(_http_oracle(backend, ids[:episodes_n]))
    return out


async def _http_oracle(backend, ids: list[str]) -> dict[str, Any]:
    from environments.core.client import EnvClient
    from environments.deepsearch.expert import DeepSearchOracle
    from agentrl_common.processes import start_env_server

    start = time.perf_counter()
    server = start_env_server("deepsearch_lookup")
    started = time.perf_counter() - start
    creates, steps = [], []
    try:
        async with EnvClient(server.url) as client:
            for task_id in ids:
                item = backend.question(task_id)
                env_id, observation, _ = await atimed(client.create(task_id=task_id), creates)
                oracle = DeepSearchOracle(item.question, item.golden_answers)
                for _ in range(2):
                    observation = (await atimed(client.step(env_id, oracle.act(observation)), steps)).observation
                await client.close(env_id)
    finally:
        server.stop()
    return {"server_start_s": round(started, 2), "create": ms(creates), "step": ms(steps)}


BENCHES = {"scienceworld": bench_scienceworld, "miniwob": bench_miniwob, "deepsearch": bench_deepsearch}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(BENCHES))
    parser.add_argument("--episodes", type=int, default=44, help="episodes per family (ScienceWorld: 8)")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    results = {}
    for family in args.families.split(","):
        n = min(args.episodes, 8) if family == "scienceworld" else args.episodes
        start = time.perf_counter()
        results[family] = BENCHES[family](n)
        results[family]["bench_wall_s"] = round(time.perf_counter() - start, 1)
        print(f"== {family}\n{json.dumps(results[family], indent=1)}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
