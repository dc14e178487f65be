"""MiniWoB++ episodes through HTTP with and without reused instances (``Family.reuse_instances``).

Each arm starts its own MiniWoB++ server (``--no-reuse`` for the baseline), then ``--concurrency``
workers play the rule-based expert on the test tasks, one session per episode (create, steps,
close: what the actor pool does), ``--episodes`` episodes in all. Reported per arm: episodes per
second, the ``/create`` latency (p50 / p95: with reuse it is a reset of a spare instance onto
the task, without it a Chromium start), the episodes the expert solved (both arms play the same
tasks, so the same count is expected) and the server's ``sessions_reused``; then the ratio.
The arms run one after the other in this process, in the order given by ``--arms``::

    python benchmarks/speed/env_reuse.py --episodes 96 --concurrency 8 [--arms off,on] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


async def play(url: str, task_ids: list[str], concurrency: int) -> dict[str, Any]:
    """Play the expert on ``task_ids`` with ``concurrency`` workers; timings and outcomes."""
    from environments.core.client import EnvClient
    from environments.miniwob.catalog import parse_task_id
    from environments.miniwob.expert import MiniWoBExpert

    queue: asyncio.Queue[str] = asyncio.Queue()
    for task_id in task_ids:
        queue.put_nowait(task_id)
    creates: list[float] = []
    solved = 0

    async def worker(client: EnvClient) -> None:
        nonlocal solved
        while not queue.empty():
            task_id = queue.get_nowait()
            expert, task = MiniWoBExpert(), parse_task_id(task_id)[0]
            t0 = time.perf_counter()
            env_id, observation, info = await client.create(task_id=task_id)
            creates.append(time.perf_counter() - t0)
            try:
                for _ in range(int(info.get("max_steps", 15))):
                    result = await client.step(env_id, expert.act(task, observation))
                    observation = result.observation
                    if result.done or result.truncated:
                        solved += result.reward > 0
                        break
            finally:
                await client.close(env_id)

    async with EnvClient(url, max_connections=concurrency * 2, timeout=300.0) as client:
        started = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        wall = time.perf_counter() - started
        stats = await client.stats()
    ordered = sorted(creates)
    return {"episodes": len(task_ids), "wall_s": round(wall, 3),
            "episodes_per_s": round(len(task_ids) / wall, 3),
            "create_p50_ms": round(1000 * statistics.median(ordered), 1),
            "create_p95_ms": round(1000 * ordered[int(0.95 * (len(ordered) - 1))], 1),
            "solved": solved, "sessions_reused": stats.get("sessions_reused", 0)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--episodes", type=int, default=96)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--arms", default="off,on", help="reuse off / on, in this order")
    p.add_argument("--json", default="")
    args = p.parse_args()
    from agentrl_common.processes import start_env_server
    from environments.miniwob.catalog import MiniWoBCatalog

    tests = list(MiniWoBCatalog().task_ids("test"))
    task_ids = [tests[(i * len(tests)) // args.episodes] for i in range(args.episodes)]
    results: dict[str, Any] = {"episodes": args.episodes, "concurrency": args.concurrency}
    for arm in args.arms.split(","):
        if arm not in ("on", "off"):
            sys.exit(f"--arms: 'on' or 'off', got {arm!r}")
        extra = ["--max-sessions", str(args.concurrency)] + (["--no-reuse"] if arm == "off" else [])
        with start_env_server("miniwob", extra_args=extra) as server:
            results[arm] = asyncio.run(play(server.url, task_ids, args.concurrency))
        print(f"reuse {arm}: {json.dumps(results[arm])}", flush=True)
    if "on" in results and "off" in results:
        results["speedup"] = round(results["on"]["episodes_per_s"] / results["off"]["episodes_per_s"], 2)
        print(f"episodes/s with reuse / without: {results['speedup']}x")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
