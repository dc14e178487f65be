"""Host cost of the rollout path without a model: the real actor pool against real BabyAI env
servers, with an instant fake backend.

    python benchmarks/speed/actor_host.py --episodes 256 --turns 6 --env-servers 1
    python benchmarks/speed/actor_host.py --profile /tmp/actor.prof      # + cProfile of the pool
    python benchmarks/speed/actor_host.py --compare-ref b44ee01 --repeats 3   # before / after
    python benchmarks/speed/actor_host.py --episodes 256 --samples 8   # 32 tasks x 8, as GRPO

``--compare-ref REF`` measures the code of git revision ``REF`` (extracted with ``git archive``
into a temporary directory, this script copied in) and the working tree alternately, ``--repeats``
times each, in fresh processes with the same arguments, and reports the medians: the box's other
load changes from minute to minute, so before / after are only comparable interleaved.

The backend (``InstantBackend``) answers every ``generate`` at once with a fixed-format reply:
the tokens of `` <action>`` + EOS, the action picked from the turn's sampling seed (turn left /
turn right / move forward / a macro over a made-up object / a garbage action), logprobs a
function of the position. Everything else is what a training run does: ``ActorPool.collect``,
``Episode`` with the SmolLM2 chat template (``ChatFormatter``), the ``action`` prompt style
with ``response_prefix = "Action:"``, ``EnvClient`` over HTTP to ``--env-servers`` BabyAI
server processes.

Reported per mode: agent turns / s (wall), the actor process's CPU seconds per turn, the env
servers' CPU seconds per turn (from ``/proc``), and a per-stage split of the actor process's
synchronous work (chat formatting + tokenisation, decode + parse, trajectory bookkeeping,
backend call) measured with timers around each stage. The awaits on the environment (client +
server) are wall time that overlaps with other episodes; their CPU shows up in the actor's
"other" share (aiohttp, asyncio) and in the servers' CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from typing import Any, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from agentrl_jax.rollout.contract import GenerateResult, RolloutBackend, SamplingParams  # noqa: E402

ACTIONS = ("turn left", "move forward", "turn right", "move forward", "go to red ball 1",
           "dance wildly")


class InstantBackend(RolloutBackend):
    """Answers at once: `` <action>`` + EOS, deterministic in the request's sampling seed.

    output_ids: the tokens of ``" " + action`` then EOS; output_logprobs[i] = -0.01 * (i + 1)
    - (seed % 97) / 1000 (distinct per turn, so a test can tell turns apart).
    """

    name = "instant"

    def __init__(self, tokenizer: Any, eos_id: int | None = None):
        eos = tokenizer.eos_token_id if eos_id is None else eos_id
        self.replies = [list(tokenizer.encode(" " + a, add_special_tokens=False)) + [eos]
                        for a in ACTIONS]
        self.calls = 0

    async def generate(self, input_ids: Sequence[int], sampling: SamplingParams | None = None,
                       session_id: str | None = None, rid: str | None = None) -> GenerateResult:
        self.calls += 1
        seed = (sampling.seed if sampling is not None and sampling.seed is not None
                else len(input_ids))
        ids = self.replies[seed % len(self.replies)]
        bias = (seed % 97) / 1000.0
        return GenerateResult(output_ids=list(ids),
                              output_logprobs=[-0.01 * (i + 1) - bias for i in range(len(ids))],
                              finish_reason="stop", matched_stop=ids[-1],
                              prompt_tokens=len(input_ids))

    async def update_weights(self, params=None, *, path=None, version=None):
        return None

    async def health(self) -> bool:
        return True

    async def aclose(self) -> None:
        return None


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (and its waited-for children) from /proc, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return sum(int(x) for x in fields[11:15]) / ticks


class StageTimers:
    """Wall-clock accumulators for synchronous stages (no await inside a timed section)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._depth = 0  # nested timed sections (prompt_ids -> encode_text) count once

    @contextlib.contextmanager
    def time(self, stage: str):
        self._depth += 1
        t0 = time.thread_time()  # CPU time: other processes on the host do not inflate it
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self.seconds[stage] = self.seconds.get(stage, 0.0) + time.thread_time() - t0
                self.calls[stage] = self.calls.get(stage, 0) + 1

    def wrap(self, obj: Any, method: str, stage: str) -> None:
        fn = getattr(obj, method)

        def timed(*a, **k):
            with self.time(stage):
                return fn(*a, **k)

        setattr(obj, method, timed)


def instrument(pool: Any, timers: StageTimers) -> None:
    """Time the pool's synchronous stages by wrapping the objects it uses (not the code)."""
    fmt = pool.formatter
    for m in ("prompt_ids", "observation_ids", "encode_text"):
        if hasattr(fmt, m):
            timers.wrap(fmt, m, "format+tokenize")
    timers.wrap(fmt, "decode", "decode+parse")
    parser = pool.parser

    def parse(text: str):
        with timers.time("decode+parse"):
            return parser(text)

    pool.parser = parse
    backend = pool.backend
    gen = backend.generate

    async def generate(*a, **k):
        t0 = time.thread_time()
        out = await gen(*a, **k)  # instant: no suspension inside
        dt = time.thread_time() - t0
        timers.seconds["backend call"] = timers.seconds.get("backend call", 0.0) + dt
        timers.calls["backend call"] = timers.calls.get("backend call", 0) + 1
        return out

    backend.generate = generate


async def run_pool(mode: str, tokenizer: Any, urls: list[str], episodes: int, turns: int,
                   concurrency: int, seed: int, timers: StageTimers | None,
                   profile: str | None = None, workers: int = 0,
                   samples: int = 1) -> tuple[list, dict]:
    """One measured ``collect`` (after a short warm-up) in ``mode``; returns trajectories and
    numbers. ``episodes // samples`` tasks, ``samples`` episodes each (a GRPO group)."""
    from agentrl_jax.agent.actor_pool import ActorPool, TaskRef
    from agentrl_jax.agent.chat import ChatFormatter
    from agentrl_jax.agent.parsing import get_parser
    from environments.core.client import EnvClient

    async with EnvClient(urls, max_connections=2 * concurrency) as client:
        ids = list(await client.tasks("train"))
        tasks = [TaskRef("babyai", ids[(i * 7919) % len(ids)])
                 for i in range(max(episodes // samples, 1))]
        backend = InstantBackend(tokenizer)
        extra = {"workers": workers} if workers else {}  # older revisions have no workers
        pool = ActorPool(backend, {"babyai": client}, ChatFormatter(tokenizer),
                         SamplingParams(max_new_tokens=64, temperature=1.0, stop=["\n"]),
                         max_context=2048, max_concurrency=concurrency,
                         parser=get_parser("react"), prompt_style="action",
                         response_prefix="Action:", history_turns=0, history_stride=1,
                         option_limits=False, shuffle_options=False, **extra)
        await pool.collect(tasks[:8], 1, 2, seed=seed + 1)  # warm-up (connections, caches)
        worker_pids = [p.pid for p in pool._group._processes] if workers else []
        w0 = sum(cpu_seconds(pid) for pid in worker_pids)
        if timers is not None and not workers:
            instrument(pool, timers)
        profiler = None
        if profile:
            import cProfile
            profiler = cProfile.Profile()
            profiler.enable()
        t0, c0 = time.perf_counter(), time.process_time()
        trajectories, stats = await pool.collect(tasks, samples, turns, seed=seed)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        cpu += sum(cpu_seconds(pid) for pid in worker_pids) - w0  # actor CPU of all processes
        if workers:
            pool.close()
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(profile)
        batches = getattr(client, "batches_sent", None)
    n_turns = sum(t.num_turns for t in trajectories)
    return trajectories, {"mode": mode, "env_batches": batches, "wall_s": wall, "actor_cpu_s": cpu, "turns": n_turns,
                          "turns_per_s": n_turns / wall, "episodes": stats.episodes,
                          "dropped": stats.dropped, "statuses": stats.statuses}


def measure(args: argparse.Namespace, mode: str, tokenizer: Any, servers: list) -> dict:
    timers = StageTimers() if args.stages else None
    s0 = sum(cpu_seconds(s.pid) for s in servers)
    _, out = asyncio.run(run_pool(mode, tokenizer, [s.url for s in servers], args.episodes,
                                  args.turns, args.concurrency, args.seed, timers,
                                  args.profile, args.workers, args.samples))
    server_cpu = sum(cpu_seconds(s.pid) for s in servers) - s0
    n = max(out["turns"], 1)
    out["actor_cpu_ms_per_turn"] = 1000 * out["actor_cpu_s"] / n
    out["server_cpu_ms_per_turn"] = 1000 * server_cpu / n
    if timers is not None:
        out["stages_ms_per_turn"] = {k: 1000 * v / n for k, v in timers.seconds.items()}
        other = out["actor_cpu_ms_per_turn"] - sum(out["stages_ms_per_turn"].values())
        out["stages_ms_per_turn"]["other (asyncio, aiohttp client, episode logic)"] = other
    return out


def print_profile(path: str, top: int) -> None:
    import pstats
    stats = pstats.Stats(path)
    stats.sort_stats("tottime").print_stats(top)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--episodes", type=int, default=256)
    p.add_argument("--samples", type=int, default=1,
                   help="episodes per task (a GRPO group: the recipe's 8); episodes // samples "
                        "tasks")
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--env-servers", type=int, default=1)
    p.add_argument("--workers", type=int, default=0,
                   help="actor worker processes (ActorPool(workers=N)); 0 = in-process")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--modes", default="baseline")
    p.add_argument("--no-stages", dest="stages", action="store_false",
                   help="skip the per-stage timers (they cost a little)")
    p.add_argument("--profile", default=None, help="write a cProfile of the measured collect")
    p.add_argument("--profile-top", type=int, default=30)
    p.add_argument("--json", default=None)
    p.add_argument("--compare-ref", default=None,
                   help="git revision to compare with (runs both, interleaved)")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    if args.compare_ref:
        return compare(args, argv if argv is not None else sys.argv[1:])

    from agentrl_jax.models.pretrained import resolve_model_path
    from agentrl_jax.models.tokenizer import load_tokenizer
    from agentrl_common.processes import start_env_server

    tokenizer = load_tokenizer(resolve_model_path("smollm2"))
    servers = [start_env_server("babyai") for _ in range(args.env_servers)]
    report: dict[str, Any] = {"settings": vars(args), "nproc": os.cpu_count(), "runs": []}
    try:
        for mode in args.modes.split(","):
            out = measure(args, mode, tokenizer, servers)
            report["runs"].append(out)
            print(f"{mode}: {out['turns_per_s']:,.0f} turns/s ({out['turns']} turns, "
                  f"{out['wall_s']:.2f} s wall), actor CPU {out['actor_cpu_ms_per_turn']:.3f} "
                  f"ms/turn, env servers CPU {out['server_cpu_ms_per_turn']:.3f} ms/turn, "
                  f"statuses {out['statuses']}", flush=True)
            for k, v in out.get("stages_ms_per_turn", {}).items():
                print(f"    {k:<50} {v:7.3f} ms/turn", flush=True)
    finally:
        for s in servers:
            s.stop()
    if args.profile:
        print_profile(args.profile, args.profile_top)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return report


def _strip(argv: list[str], flags: dict[str, bool]) -> list[str]:
    """``argv`` without the given flags (value: whether the flag takes a value)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        name = a.split("=", 1)[0]
        if name in flags:
            skip = flags[name] and "=" not in a
            continue
        out.append(a)
    return out


def compare(args: argparse.Namespace, argv: list[str]) -> dict:
    """Run revision ``args.compare_ref`` and the working tree alternately; report medians."""
    import shutil
    import statistics
    import subprocess
    import tempfile

    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sha = subprocess.run(["git", "rev-parse", "--short", args.compare_ref], cwd=here, check=True,
                         capture_output=True, text=True).stdout.strip()
    rest = _strip(argv, {"--compare-ref": True, "--repeats": True, "--json": True,
                         "--profile": True, "--modes": True, "--workers": True})
    new_only = ["--workers", str(args.workers)] if args.workers else []
    results: dict[str, list[dict]] = {f"ref {sha}": [], "working tree": []}
    with tempfile.TemporaryDirectory(prefix="actor_host_ref_") as ref_dir:
        archive = subprocess.run(["git", "archive", sha], cwd=here, check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", ref_dir], input=archive, check=True)
        os.makedirs(os.path.join(ref_dir, "benchmarks", "speed"), exist_ok=True)  # an older layout
        shutil.copy(os.path.abspath(__file__), os.path.join(ref_dir, "benchmarks", "speed", "actor_host.py"))
        for r in range(args.repeats):
            for label, root, mode in ((f"ref {sha}", ref_dir, "before"),
                                      ("working tree", here, "after")):
                out_json = os.path.join(ref_dir, f"run_{r}_{mode}.json")
                env = dict(os.environ, PYTHONPATH=root)
                subprocess.run([sys.executable, os.path.join(root, "benchmarks", "speed", "actor_host.py"),
                                *rest, *(new_only if mode == "after" else []), "--modes", mode,
                                "--json", out_json], cwd=root, env=env, check=True)
                with open(out_json) as f:
                    results[label].append(json.load(f)["runs"][0])
    summary: dict[str, Any] = {"settings": vars(args), "nproc": os.cpu_count(), "ref": sha,
                               "runs": results, "median": {}}
    for label, runs in results.items():
        summary["median"][label] = {k: statistics.median(r[k] for r in runs) for k in
                                    ("turns_per_s", "actor_cpu_ms_per_turn",
                                     "server_cpu_ms_per_turn")}
    before, after = (summary["median"][k]["turns_per_s"] for k in results)
    summary["speedup"] = after / before
    print("\n| code | turns/s (median of %d) | actor CPU ms/turn | env server CPU ms/turn |"
          % args.repeats)
    print("|---|---|---|---|")
    for label, m in summary["median"].items():
        print(f"| {label} | {m['turns_per_s']:,.0f} | {m['actor_cpu_ms_per_turn']:.3f} | "
              f"{m['server_cpu_ms_per_turn']:.3f} |")
    print(f"speed-up: {summary['speedup']:.2f}x "
          f"(each run's turns/s: {[round(r['turns_per_s']) for r in results[f'ref {sha}']]} vs "
          f"{[round(r['turns_per_s']) for r in results['working tree']]})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    return summary


if __name__ == "__main__":
    main()
