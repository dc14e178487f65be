"""How many agent turns per second the actor pool can feed to HTTP rollout servers: worker
processes that relay every request through the trainer's process vs workers that post to the
servers themselves (``ActorPool(workers=N, direct_workers=...)``).

    python benchmarks/speed/actor_feed.py --workers 2 --servers 2 --episodes 128 --turns 6

The rollout servers are stubs in their own processes that answer every ``/generate`` at once
(or after ``--gen-ms``) with a fixed BabyAI action, so what is measured is the client side: the
episodes' chat formatting, tokenising, environment steps (real BabyAI servers, started here)
and the HTTP requests -- the part that kept a 4-GPU host's engine servers' decode batches less
than half full for the SmolLM2 shape (docs/PERFORMANCE.md). Both modes run the same episodes,
alternating, ``--repeats`` times each after a warm-up; reports the median turns/s per mode and
the ratio direct / relay. Which mode is faster depends on the cores there are: relaying costs
the trainer's process an extra message hop per turn, a direct worker its own HTTP client.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_stub(port: int, reply_ids: list[int], gen_ms: float) -> None:
    """A rollout server that answers every /generate with ``reply_ids`` (SGLang's response)."""
    from aiohttp import web

    async def generate(request: web.Request) -> web.Response:
        body = await request.json()
        if gen_ms:
            await asyncio.sleep(gen_ms / 1000)
        return web.json_response({"output_ids": reply_ids, "meta_info": {
            "id": body.get("rid"), "finish_reason": {"type": "stop"},
            "prompt_tokens": len(body["input_ids"]),
            "output_token_logprobs": [[-0.5, t, None] for t in reply_ids]}})

    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/generate", generate)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


async def measure(args, urls: list[str], env_urls: list[str], tokenizer) -> dict:
    from agentrl_jax.agent.actor_pool import ActorPool, TaskRef
    from agentrl_jax.agent.chat import ChatFormatter
    from agentrl_jax.agent.parsing import get_parser
    from agentrl_jax.rollout.contract import SamplingParams
    from agentrl_jax.rollout.backends.sglang import SGLangBackend
    from environments.core.client import EnvClient

    async with EnvClient(env_urls) as client, SGLangBackend(urls) as backend:
        ids = await client.tasks("train")
        groups = max(1, args.episodes // args.samples)
        tasks = [TaskRef("babyai", ids[(i * 7919) % len(ids)]) for i in range(groups)]
        pools = {mode: ActorPool(backend, {"babyai": client}, ChatFormatter(tokenizer),
                                 SamplingParams(max_new_tokens=32, stop=["\n"]),
                                 max_context=4096, max_concurrency=args.episodes,
                                 parser=get_parser("react"), prompt_style="action",
                                 response_prefix="Action:", history_turns=0, history_stride=1,
                                 option_limits=False, shuffle_options=False,
                                 workers=args.workers,
                                 direct_workers=mode == "direct")
                 for mode in ("relay", "direct")}
        rates: dict[str, list[float]] = {mode: [] for mode in pools}
        try:
            for round_ in range(args.repeats + 1):  # round 0: workers start, warm-up
                for mode, pool in pools.items():
                    t0 = time.perf_counter()
                    out, _ = await pool.collect(tasks, args.samples, args.turns, seed=round_)
                    wall = time.perf_counter() - t0
                    turns = sum(t.num_turns for t in out)
                    if round_:
                        rates[mode].append(turns / wall)
                        print(f"round {round_} {mode}: {turns} turns in {wall:.2f} s = "
                              f"{turns / wall:,.0f} turns/s", flush=True)
        finally:
            for pool in pools.values():
                pool.close()
    return {mode: statistics.median(r) for mode, r in rates.items()} | {"all": rates}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, default=2, help="actor worker processes")
    p.add_argument("--servers", type=int, default=2, help="stub rollout servers")
    p.add_argument("--env-servers", type=int, default=2, help="BabyAI servers")
    p.add_argument("--episodes", type=int, default=128)
    p.add_argument("--samples", type=int, default=8, help="episodes per task")
    p.add_argument("--turns", type=int, default=6, help="horizon")
    p.add_argument("--gen-ms", type=float, default=0.0, help="stub server delay per request")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default=None)
    args = p.parse_args()

    from agentrl_jax.models.pretrained import resolve_model_path
    from agentrl_jax.models.tokenizer import load_tokenizer
    from agentrl_common.processes import start_env_server

    tokenizer = load_tokenizer(resolve_model_path("smollm2"))
    reply = tokenizer.encode(" turn left", add_special_tokens=False) + [tokenizer.eos_token_id]
    ctx = multiprocessing.get_context("spawn")
    ports = [_free_port() for _ in range(args.servers)]
    stubs = [ctx.Process(target=serve_stub, args=(port, reply, args.gen_ms), daemon=True)
             for port in ports]
    for s in stubs:
        s.start()
    envs = [start_env_server("babyai") for _ in range(args.env_servers)]
    try:
        urls = [f"http://127.0.0.1:{port}" for port in ports]
        for url in urls:  # wait until every stub listens
            host, port = url.rsplit(":", 1)
            for _ in range(200):
                try:
                    socket.create_connection(("127.0.0.1", int(port)), timeout=0.2).close()
                    break
                except OSError:
                    time.sleep(0.05)
        result = asyncio.run(measure(args, urls, [e.url for e in envs], tokenizer))
    finally:
        for e in envs:
            e.stop()
        for s in stubs:
            s.terminate()
    ratio = result["direct"] / result["relay"]
    report = {"settings": vars(args), "cpu_count": os.cpu_count(),
              "turns_per_s": {"relay": result["relay"], "direct": result["direct"]},
              "direct_over_relay": ratio, "rounds": result["all"]}
    print(f"median turns/s: relay {result['relay']:,.0f}, direct {result['direct']:,.0f} "
          f"({ratio:.2f}x) with {args.workers} workers, {args.servers} stub servers, "
          f"{os.cpu_count()} cores", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
