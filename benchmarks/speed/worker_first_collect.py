"""The first collect of actor workers spawned ahead, against the collects after it: what a run
with ``rollout.actor_workers`` pays in its first rollout (or its step-0 evaluation) once the
workers were started beside the model load (``WorkerGroup.spawn``).

    python benchmarks/speed/worker_first_collect.py --workers 2 --json out.json

Spawns ``--workers`` processes, waits ``--wait`` seconds (the model load they overlap with),
then builds the actor pool on them and plays ``--collects`` collects of ``--tasks`` BabyAI
train tasks x ``--samples`` at ``--turns`` turns (a new sampling seed each) against a real
BabyAI server, with the SmolLM2 tokenizer and an instant backend
(``actor_host.InstantBackend``: no model, so the collects time the host work alone).
Reported: each collect's wall seconds; the first minus the median of the others is the
first-use cost. To compare two trees, copy this script into the other tree (``git archive``)
and run both alternately, each a fresh process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks.speed.actor_host import InstantBackend  # noqa: E402


async def collects(url: str, tokenizer: Any, args: argparse.Namespace) -> list[float]:
    from agentrl_jax.agent.actor_pool import ActorPool, TaskRef
    from agentrl_jax.agent.chat import ChatFormatter
    from agentrl_jax.agent.parsing import get_parser
    from agentrl_jax.agent.workers import WorkerGroup
    from agentrl_jax.rollout.contract import SamplingParams
    from environments.core.client import EnvClient

    async with EnvClient(url) as client:
        ids = await client.tasks("train")
    tasks = [TaskRef("babyai", ids[(i * 104729) % len(ids)]) for i in range(args.tasks)]
    group = WorkerGroup(args.workers)
    group.spawn()
    await asyncio.sleep(args.wait)
    walls = []
    async with EnvClient(url) as client:
        pool = ActorPool(InstantBackend(tokenizer), {"babyai": client}, ChatFormatter(tokenizer),
                         SamplingParams(max_new_tokens=32, stop=["\n"]), max_context=3072,
                         max_concurrency=args.tasks * args.samples, parser=get_parser("react"),
                         prompt_style="action", response_prefix="Action:", history_turns=0,
                         history_stride=1, option_limits=False, shuffle_options=False,
                         workers=args.workers, worker_group=group)
        try:
            for i in range(args.collects):
                t0 = time.perf_counter()
                await pool.collect(tasks, args.samples, args.turns, seed=11 + i)
                walls.append(time.perf_counter() - t0)
                print(f"collect {i}: {walls[-1]:.2f} s", flush=True)
        finally:
            pool.close()
    return walls


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--wait", type=float, default=25.0,
                   help="seconds between spawning the workers and the pool's first collect")
    p.add_argument("--collects", type=int, default=3)
    p.add_argument("--tasks", type=int, default=16)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--json", default=None, help="also write the numbers here")
    args = p.parse_args(argv)
    if args.workers < 1 or args.collects < 2:
        p.error("--workers >= 1 and --collects >= 2 (the first against the others)")
    from agentrl_common.processes import start_env_server
    from agentrl_jax.models.pretrained import resolve_model_path
    from agentrl_jax.models.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(resolve_model_path("smollm2"))
    with start_env_server("babyai") as server:
        walls = asyncio.run(collects(server.url, tokenizer, args))
    later = statistics.median(walls[1:])
    report = {"args": vars(args), "collect_s": walls, "first_s": walls[0], "later_median_s": later,
              "first_use_s": walls[0] - later}
    print(f"first collect {walls[0]:.2f} s, later median {later:.2f} s: first use "
          f"{walls[0] - later:+.2f} s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
