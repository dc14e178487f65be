"""Rollout throughput on 1, 2, 4 ... local accelerators: one engine replica per device.

    python benchmarks/speed/rollout_scaling.py --shape smollm2-135m --gpus 1,2,4 --json out.json
    python benchmarks/speed/rollout_scaling.py --small          # CPU smoke run (virtual devices)

For each device count ``n`` the same workload per device (weak scaling: ``--episodes-per-device``
episodes on each device, so 4 devices run 4x the episodes) is run twice:

* ``engine``: the replicas alone -- every episode's prompt submitted at once, ``--new-tokens``
  tokens generated each (EOS ignored); generated tokens / wall s.
* ``actor_pool``: the whole rollout path -- the actor pool playing BabyAI episodes of
  ``--turns`` turns on real environment servers (``--env-servers-per-device`` replicas each;
  ``--actor-workers-per-device`` worker processes play the episodes, 0 = this process),
  each turn one generation of up to ``--turn-tokens`` tokens (stop at a line break, as the
  default answer format does) through the replicas with sticky sessions; generated tokens /
  wall s and turns / s.

Weights are random (the shapes of ``benchmarks/speed/engine.py``), so actions are rarely valid and
every episode runs its whole horizon; the SmolLM2 tokenizer formats the chat. Reported:
throughput per device count and the speed-up over one device. ``--replicas processes`` runs
each device's engine in its own rollout-server process (``EngineServers``) instead of a thread
of this process, and also times one weight sync (export + every server loading it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks.speed.engine import SHAPES, model_config  # noqa: E402


def run_in_loop(coro, backend):
    """``asyncio.run(coro)``, closing ``backend``'s HTTP session (rollout-server clients)
    before the loop ends: the backend is used from several successive loops here."""
    async def main():
        try:
            return await coro
        finally:
            if hasattr(backend, "close_http"):
                await backend.close_http()
    return asyncio.run(main())


def engine_throughput(backend, n_prompts: int, prompt_len: int, new_tokens: int,
                      vocab: int) -> dict[str, Any]:
    import numpy as np

    from agentrl_jax.rollout.contract import SamplingParams

    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, vocab, size=prompt_len).tolist() for _ in range(n_prompts)]
    sampling = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, ignore_eos=True)
    warm = SamplingParams(max_new_tokens=4, temperature=1.0, ignore_eos=True)

    async def run(params) -> tuple[float, int]:
        t0 = time.perf_counter()
        results = await asyncio.gather(*(backend.generate(p, params) for p in prompts))
        return time.perf_counter() - t0, sum(len(r.output_ids) for r in results)

    run_in_loop(run(warm), backend)
    wall, tokens = run_in_loop(run(sampling), backend)
    return {"tokens_per_s": tokens / wall, "wall_s": wall, "generated_tokens": tokens}


def actor_pool_throughput(backend, tokenizer, episodes: int, turns: int, turn_tokens: int,
                          env_servers: int, max_context: int, workers: int = 0,
                          direct_workers: bool = True
                          ) -> dict[str, Any]:
    from agentrl_jax.agent.actor_pool import ActorPool, TaskRef
    from agentrl_jax.agent.chat import ChatFormatter
    from agentrl_jax.agent.parsing import get_parser
    from agentrl_jax.rollout.contract import SamplingParams
    from environments.core.client import EnvClient
    from agentrl_common.processes import start_env_server

    servers = [start_env_server("babyai") for _ in range(env_servers)]
    try:
        async def run() -> dict[str, Any]:
            async with EnvClient([s.url for s in servers],
                                 max_connections=4 * episodes) as client:
                ids = list(await client.tasks("train"))
                tasks = [TaskRef("babyai", ids[i % len(ids)]) for i in range(episodes)]
                pool = ActorPool(backend, {"babyai": client}, ChatFormatter(tokenizer),
                                 SamplingParams(max_new_tokens=turn_tokens, temperature=1.0,
                                                stop=["\n"]),
                                 max_context=max_context, max_concurrency=episodes,
                                 parser=get_parser("react"), prompt_style="action",
                                 response_prefix="Action:", history_turns=0, history_stride=1,
                                 option_limits=False, shuffle_options=False, workers=workers,
                                 direct_workers=direct_workers)
                try:
                    # warm-up (also starts the worker processes)
                    await pool.collect(tasks[:max(8, episodes // 16)], 1, 2)
                    t0 = time.perf_counter()
                    trajectories, stats = await pool.collect(tasks, 1, turns)
                    wall = time.perf_counter() - t0
                finally:
                    pool.close()
                n_turns = sum(t.num_turns for t in trajectories)
                errors = sorted({t.error for t in trajectories if t.error})
                if errors:
                    print(f"episode errors: {errors[:3]}", flush=True)
                generated = sum(t.num_generated for t in trajectories)
                return {"tokens_per_s": generated / wall, "wall_s": wall,
                        "generated_tokens": generated, "turns": n_turns,
                        "turns_per_s": n_turns / wall, "episodes": stats.episodes,
                        "dropped": stats.dropped, "actor_workers": workers,
                        "env_servers": env_servers,
                        "env_batches": getattr(client, "batches_sent", None)}
        return run_in_loop(run(), backend)
    finally:
        for s in servers:
            s.stop()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default=None)
    p.add_argument("--small", action="store_true",
                   help="CPU smoke run: tiny shape, 4 virtual devices, few episodes")
    p.add_argument("--gpus", default="1,2,4", help="device counts to run")
    p.add_argument("--episodes-per-device", type=int, default=256)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--turn-tokens", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--max-context", type=int, default=2048)
    p.add_argument("--env-servers-per-device", type=int, default=2)
    p.add_argument("--actor-workers-per-device", type=int, default=0,
                   help="actor pool worker processes per device (ActorPool(workers=...)); "
                        "0 = the pool runs in this process")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    p.add_argument("--decode-attention", default="auto", choices=["auto", "ragged", "dense"])
    p.add_argument("--skip", default="", help="comma list of: engine,actor_pool")
    p.add_argument("--prefill-kv-buckets", default="auto",
                   help="auto (the engine's default: powers of two from 512), whole (every "
                        "prefill attends over the whole row: the previous engine) or a comma "
                        "list of lengths")
    p.add_argument("--replicas", default="threads", choices=["threads", "processes"],
                   help="threads: one engine thread per device in this process "
                        "(EngineReplicas); processes: one rollout-server process per device "
                        "(EngineServers, rollout.backend='engine_servers')")
    p.add_argument("--relay-workers", action="store_true",
                   help="with --replicas processes: actor workers relay every request through "
                        "this process (the default: they post to the engine servers directly)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.small:
        os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        # the chat is tokenized by SmolLM2's tokenizer: the model needs its vocabulary
        args.shape = args.shape or "smollm2-135m"
        args.dtype = "float32"
        args.episodes_per_device, args.turns, args.turn_tokens = 4, 2, 4
        args.prompt_len, args.new_tokens, args.max_context = 32, 8, 1024
        args.env_servers_per_device = 1
    args.shape = args.shape or "smollm2-135m"
    skip = {s for s in args.skip.split(",") if s}

    import jax

    from agentrl_jax.models.llama import init_model
    from agentrl_jax.models.pretrained import resolve_model_path
    from agentrl_jax.models.tokenizer import load_tokenizer
    from agentrl_jax.rollout.engine.engine import EngineConfig
    from agentrl_jax.rollout.backends.engine_servers import EngineServers
    from agentrl_jax.rollout.engine.replicas import EngineReplicas
    from agentrl_jax.rollout.engine.requests import merge_stats

    cfg = model_config(args.shape, args.dtype)
    if cfg.vocab_size < 49152:
        raise SystemExit(f"--shape {args.shape}: the SmolLM2 tokenizer needs a vocabulary of "
                         ">= 49152 ids")
    if args.replicas == "processes":  # the weights are only exported from here
        with jax.default_device(jax.devices("cpu")[0]):
            model = init_model(cfg, seed=0)
    else:
        model = init_model(cfg, seed=0)
    tokenizer = load_tokenizer(resolve_model_path("smollm2"))
    devices = jax.local_devices()
    report: dict[str, Any] = {"shape": args.shape, "settings": vars(args),
                              "device": f"{devices[0].platform}:{devices[0].device_kind}",
                              "local_devices": len(devices), "runs": {}}
    print(f"# {args.shape}: {cfg.num_parameters / 1e6:.1f}M params, {args.dtype}, "
          f"{args.episodes_per_device} episodes per device, on {report['device']} "
          f"x {len(devices)}", flush=True)
    for n in [int(x) for x in args.gpus.split(",")]:
        if n > len(devices):
            print(f"{n} devices: not run (this host has {len(devices)})", flush=True)
            report["runs"][str(n)] = {"not_run": f"only {len(devices)} local devices"}
            continue
        episodes = n * args.episodes_per_device
        max_length = max(args.max_context, args.prompt_len + args.new_tokens)
        config = EngineConfig(max_batch=args.episodes_per_device, max_length=max_length,
                              dtype=args.dtype, weights_dtype=args.dtype,
                              prefill_chunks=(64, 256, 1024), prefill_tokens=8192,
                              decode_attention=args.decode_attention,
                              prefill_kv_buckets=("" if args.prefill_kv_buckets == "whole"
                                                  else args.prefill_kv_buckets))
        t0 = time.perf_counter()
        if args.replicas == "processes":
            backend = EngineServers(model, config, [[i] for i in range(n)],
                                    devices[0].platform, tokenizer=tokenizer)
        else:
            backend = EngineReplicas(model, config, tokenizer=tokenizer, devices=devices[:n])
        run: dict[str, Any] = {"start_s": time.perf_counter() - t0, "episodes": episodes,
                               "replicas": args.replicas}
        try:
            if "engine" not in skip:
                run["engine"] = engine_throughput(backend, episodes, args.prompt_len,
                                                  args.new_tokens, cfg.vocab_size)
                print(f"{n} devices, engine only: {run['engine']['tokens_per_s']:,.0f} tok/s",
                      flush=True)
            if "actor_pool" not in skip:
                run["actor_pool"] = actor_pool_throughput(
                    backend, tokenizer, episodes, args.turns, args.turn_tokens,
                    n * args.env_servers_per_device, args.max_context,
                    workers=n * args.actor_workers_per_device,
                    direct_workers=not args.relay_workers)
                a = run["actor_pool"]
                print(f"{n} devices, actor pool + BabyAI: {a['tokens_per_s']:,.0f} tok/s, "
                      f"{a['turns_per_s']:,.0f} turns/s ({a['episodes']} episodes, "
                      f"{a['turns']} turns, {a['wall_s']:.1f} s)", flush=True)
            if args.replicas == "processes":
                per_server = run_in_loop(backend.server_stats(), backend)
                run["engine_stats"] = merge_stats(per_server)
                run["engine_stats_per_replica"] = per_server
                run["sessions_placed"] = backend.sessions_placed()
                run["pinned_sessions"] = backend.pinned_sessions()  # not ended: 0 after a rollout
                t1 = time.perf_counter()
                run_in_loop(backend.update_weights(model), backend)
                run["weight_sync_s"] = time.perf_counter() - t1
                print(f"{n} devices: weight sync to every server {run['weight_sync_s']:.2f} s",
                      flush=True)
            else:
                run["engine_stats"] = backend.stats_dict
                run["engine_stats_per_replica"] = [r.stats.as_dict() for r in backend.replicas]
        finally:
            backend.close()
        report["runs"][str(n)] = run
    base = report["runs"].get("1", {})
    for n, run in report["runs"].items():
        for kind in ("engine", "actor_pool"):
            if kind in run and kind in base and base[kind]["tokens_per_s"] > 0:
                run[kind]["speedup_vs_1"] = run[kind]["tokens_per_s"] / base[kind]["tokens_per_s"]
    print("\n| devices | engine tok/s | x | actor pool tok/s | turns/s | x |")
    print("|---|---|---|---|---|---|")
    for n, run in report["runs"].items():
        e, a = run.get("engine", {}), run.get("actor_pool", {})
        if "not_run" in run:
            print(f"| {n} | not run | | | | |")
            continue
        print(f"| {n} | {e.get('tokens_per_s', 0):,.0f} | {e.get('speedup_vs_1', 0):.2f} | "
              f"{a.get('tokens_per_s', 0):,.0f} | {a.get('turns_per_s', 0):,.0f} | "
              f"{a.get('speedup_vs_1', 0):.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return report


if __name__ == "__main__":
    main()
