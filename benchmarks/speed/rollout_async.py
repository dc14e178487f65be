"""Asynchronous actor pool vs lock-step rounds under heavy-tailed environment latency.

    python benchmarks/speed/rollout_async.py --episodes 64 --turns 8

Both modes run the same episodes against a real BabyAI server (started here) in one process. Each
environment step gets an extra delay drawn from a Pareto distribution (heavy tail: most steps are
fast, a few take seconds, as with web pages or simulators) and each generation call a delay
standing in for the engine; the delays are seeded per (task, sample, turn), so both modes see
exactly the same latencies. Lock-step mode is the reference system's synchronous rounds (every
episode generates, then every episode steps; a round lasts as long as its slowest member); async
mode lets each episode proceed on its own. Reports wall time, episodes/s and the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import zlib

import numpy as np

from agentrl_jax.agent.actor_pool import ActorPool, TaskRef
from agentrl_jax.agent.chat import ChatFormatter
from agentrl_jax.agent.parsing import parse_react
from agentrl_jax.models.pretrained import resolve_model_path
from agentrl_jax.models.tokenizer import load_tokenizer
from agentrl_jax.rollout.contract import GenerateResult, RolloutBackend, SamplingParams
from environments.core.client import EnvClient
from agentrl_common.processes import start_env_server

ACTIONS = ["turn left", "turn right", "move forward", "toggle"]


def _delay(kind: str, key: str, turn: int, args) -> float:
    rng = np.random.default_rng(zlib.crc32(f"{kind}/{key}/{turn}".encode()))
    if kind == "env":
        # Pareto(alpha) with minimum env_min: mean = alpha*xm/(alpha-1); capped for sanity
        return float(min(args.env_min * (1 + rng.pareto(args.alpha)), args.env_cap))
    return float(args.gen_ms / 1000 * (0.8 + 0.4 * rng.random()))


class SlowEnv:
    """An EnvClient whose steps take an extra heavy-tailed delay."""

    def __init__(self, client: EnvClient, args):
        self.client, self.args = client, args
        self.keys: dict[str, tuple[str, int]] = {}

    async def create(self, task_id=None, seed=None, **kw):
        created = await self.client.create(task_id=task_id, seed=seed, **kw)
        self.keys[created.env_id] = (task_id, 0)
        return created

    async def step(self, env_id, action):
        task, turn = self.keys[env_id]
        self.keys[env_id] = (task, turn + 1)
        await asyncio.sleep(_delay("env", task, turn, self.args))
        return await self.client.step(env_id, action)

    async def close(self, env_id):
        self.keys.pop(env_id, None)
        return await self.client.close(env_id)


class TimedBackend(RolloutBackend):
    """Returns a fixed-format ReAct reply after a per-call delay (seeded by session and turn)."""

    name = "timed"

    def __init__(self, tokenizer, args):
        self.tok, self.args = tokenizer, args
        self.turns: dict[str, int] = {}
        self.replies = [tokenizer.encode(f"Thought: explore.\nAction: {a}",
                                         add_special_tokens=False) + [tokenizer.eos_token_id]
                        for a in ACTIONS]

    async def generate(self, input_ids, sampling=None, session_id=None, rid=None):
        turn = self.turns.get(session_id, 0)
        self.turns[session_id] = turn + 1
        # the delay key is the prompt (same task and sample in both modes), not the session id
        key = f"{len(input_ids)}/{sum(input_ids[:64])}/{turn}"
        await asyncio.sleep(_delay("gen", key, turn, self.args))
        ids = self.replies[turn % len(self.replies)]
        return GenerateResult(output_ids=list(ids), output_logprobs=[-1.0] * len(ids),
                              finish_reason="stop", prompt_tokens=len(input_ids))

    async def update_weights(self, params=None, *, path=None, version=None):
        pass

    async def health(self):
        return True

    async def aclose(self):
        pass


async def run(args) -> dict:
    tokenizer = load_tokenizer(resolve_model_path("smollm2"))
    server = start_env_server("babyai")
    try:
        async with EnvClient(server.url) as client:
            tasks = [TaskRef("babyai", t) for t in (await client.tasks("test"))[:args.episodes]]
            results = {}
            for mode in ("lockstep", "async"):
                env = SlowEnv(client, args)
                pool = ActorPool(TimedBackend(tokenizer, args), {"babyai": env},
                                 ChatFormatter(tokenizer), SamplingParams(max_new_tokens=32),
                                 max_context=8192, max_concurrency=args.concurrency,
                                 parser=parse_react, prompt_style="react",
                                 response_prefix="", history_turns=0, history_stride=1,
                                 option_limits=False, shuffle_options=False)
                trajectories, stats = await pool.collect(tasks, 1, args.turns,
                                                         lockstep=mode == "lockstep")
                results[mode] = {"wall_s": stats.wall_s, "episodes": stats.episodes,
                                 "dropped": stats.dropped, "turns": stats.mean_turns,
                                 "episodes_per_s": stats.episodes / stats.wall_s}
                print(f"{mode:>9}: {stats.wall_s:7.2f} s for {stats.episodes} episodes "
                      f"(mean {stats.mean_turns:.1f} turns, dropped {stats.dropped})", flush=True)
    finally:
        server.stop()
    results["speedup_async_over_lockstep"] = results["lockstep"]["wall_s"] / results["async"]["wall_s"]
    results["settings"] = vars(args)
    print(f"async / lock-step speed-up: {results['speedup_async_over_lockstep']:.2f}x")
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--alpha", type=float, default=1.5, help="Pareto tail index of env delays")
    ap.add_argument("--env-min", type=float, default=0.1, help="minimum env delay (s)")
    ap.add_argument("--env-cap", type=float, default=5.0, help="maximum env delay (s)")
    ap.add_argument("--gen-ms", type=float, default=200.0, help="mean generation delay (ms)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    results = asyncio.run(run(args))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
