"""The ``deepsearch`` family's searching oracle over every question of a split, through the real
HTTP server: turns per episode and questions solved. Run::

    python benchmarks/checks/deepsearch_oracle.py [--split test] [--family deepsearch] [--json out.json]

The server is started with ``agentrl_common.processes.start_env_server`` (it reads the task set
from its cache, ``environments/deepsearch/task_cache.py``); the oracle
(``environments/deepsearch/expert.py``) runs in this process over the same task set and sends
each action through ``EnvClient``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import statistics
import time
from pathlib import Path
from typing import Any


async def play(family: str, split: str) -> dict[str, Any]:
    from agentrl_common.processes import start_env_server
    from environments.core.client import EnvClient
    from environments.registry import get_family

    expert = get_family(family).expert
    start = time.perf_counter()
    server = start_env_server(family)
    server_start_s = time.perf_counter() - start
    turns: list[int] = []
    solved = collections.Counter()
    by_kind: dict[str, list[int]] = collections.defaultdict(list)
    try:
        async with EnvClient(server.url) as client:
            ids = await client.tasks(split)
            for task_id in ids:
                created = await client.create(task_id=task_id)
                policy, observation, count = expert(task_id), created.observation, 0
                kind = getattr(getattr(policy.oracle, "item", None), "kind", "lookup")
                while True:
                    result = await client.step(created.env_id, policy.act(observation))
                    count += 1
                    observation = result.observation
                    if result.done or result.truncated:
                        break
                await client.close(created.env_id)
                turns.append(count)
                by_kind[kind].append(count)
                solved[kind] += int(result.info.get("success", False))
    finally:
        server.stop()
    return {
        "family": family, "split": split, "episodes": len(turns),
        "solved": sum(solved.values()), "turns_mean": round(statistics.mean(turns), 3),
        "turns_histogram": dict(sorted(collections.Counter(turns).items())),
        "by_kind": {k: {"episodes": len(v), "solved": solved[k], "turns_mean": round(statistics.mean(v), 3)}
                    for k, v in sorted(by_kind.items())},
        "server_start_s": round(server_start_s, 2),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="deepsearch", choices=["deepsearch", "deepsearch_lookup"])
    parser.add_argument("--split", default="test", choices=["train", "dev", "test"])
    parser.add_argument("--json", default=None, help="also write the result here")
    args = parser.parse_args()
    result = asyncio.run(play(args.family, args.split))
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
