"""Environment server throughput and latency over HTTP.

For each family: start its server (``agentrl_common.processes``), then from a SEPARATE load process
(so the load generator and the server each get their own core) drive N sessions with a realistic
mix of actions and measure steps/s, p50/p99 step latency and the server's CPU time per step.

Two modes per session count:

* ``closed``: every session steps again as soon as its previous step is answered (saturation:
  the highest throughput; latency is then queueing, ~ sessions / throughput);
* ``paced``: the sessions together offer ``--rates`` steps/s (each session's steps arrive as a
  Poisson process, as agents waiting on an LLM do; a late answer is followed at once by the next
  due step) and we measure the latency each step sees at that load.

Drivers: ``raw`` (a minimal keep-alive HTTP/1.1 client on asyncio streams, to measure the server
rather than the client) or ``client`` (``environments.core.client.EnvClient``, what the actor pool
uses; it costs more CPU per request on the load side).

    python benchmarks/speed/envs.py --families babyai,textcraft --sessions 1,64,256 --rates 2000,5000 --duration 5
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import multiprocessing as mp
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from environments.core import jsonio  # noqa: E402
from agentrl_common.processes import start_env_server  # noqa: E402
from environments.registry import family_names, get_family  # noqa: E402

# ----------------------------------------------------------------------------------- action mixes

BABYAI_PRIMITIVES = ["turn left", "turn right", "move forward", "move forward", "pickup", "toggle", "drop"]


def babyai_action(rng: random.Random, state: dict[str, Any]) -> str:
    """45% primitive, 35% a listed macro (go to / pick up / go through), 10% check, 10% invalid."""
    r = rng.random()
    if r < 0.45:
        return rng.choice(BABYAI_PRIMITIVES)
    if r < 0.80:
        macros = [a for a in state.get("available_actions", []) if a.startswith(("go ", "pick up "))]
        return rng.choice(macros) if macros else "move forward"
    if r < 0.90:
        return "check available actions"
    return "jump over the wall"


def textcraft_action(rng: random.Random, state: dict[str, Any]) -> str:
    """40% a listed craft command, 35% get an ingredient, 15% inventory, 10% invalid."""
    commands = state.get("crafting_commands") or ["craft 1 stick using 2 planks"]
    r = rng.random()
    if r < 0.40:
        return rng.choice(commands)
    if r < 0.75:
        ingredients = rng.choice(commands).split(" using ", 1)[-1].split(", ")
        return "get " + rng.choice(ingredients)
    if r < 0.90:
        return "inventory"
    return "dig a hole"


def generic_action(rng: random.Random, state: dict[str, Any]) -> str:
    actions = state.get("available_actions") or ["look around", "inventory"]
    return rng.choice(actions)


ACTION_MIXES = {"babyai": babyai_action, "textcraft": textcraft_action}


def _remember(state: dict[str, Any], info: dict[str, Any]) -> None:
    for key in ("available_actions", "crafting_commands"):
        if key in info:
            state[key] = info[key]


# ----------------------------------------------------------------------------------------- drivers


class RawSession:
    """One keep-alive HTTP/1.1 connection speaking the protocol with no client library."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.env_id = ""

    async def call(self, path: str, payload: dict[str, Any]) -> tuple[int, Any]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        body = jsonio.dumps(payload)
        head = f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        self.writer.write(head.encode() + body)
        header = await self.reader.readuntil(b"\r\n\r\n")
        status = int(header[9:12])
        lower = header.lower()
        start = lower.index(b"content-length:") + 15
        length = int(lower[start : lower.index(b"\r\n", start)])
        return status, jsonio.loads(await self.reader.readexactly(length))

    async def create(self, index: int) -> dict[str, Any]:
        status, data = await self.call("/create", {"split": "train", "index": index})
        if status != 200:
            raise RuntimeError(f"create failed: {status} {data}")
        self.env_id = data["env_id"]
        return data["info"]

    async def step(self, action: str) -> dict[str, Any]:
        status, data = await self.call("/step", {"env_id": self.env_id, "action": action})
        if status != 200:
            raise RuntimeError(f"step failed: {status} {data}")
        return data

    async def reset(self) -> dict[str, Any]:
        status, data = await self.call("/reset", {"env_id": self.env_id})
        if status != 200:
            raise RuntimeError(f"reset failed: {status} {data}")
        return data["info"]

    async def close(self) -> None:
        await self.call("/close", {"env_id": self.env_id})
        self.writer.close()


class ClientSession:
    """The same operations through ``EnvClient`` (shared connection pool)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.env_id = ""

    async def create(self, index: int) -> dict[str, Any]:
        self.env_id, _, info = await self.client.create(split="train", index=index)
        return info

    async def step(self, action: str) -> dict[str, Any]:
        r = await self.client.step(self.env_id, action)
        return {"done": r.done, "truncated": r.truncated, "info": r.info}

    async def reset(self) -> dict[str, Any]:
        return (await self.client.reset(self.env_id)).info

    async def close(self) -> None:
        await self.client.close(self.env_id)


# ------------------------------------------------------------------------------------ load process


@dataclasses.dataclass
class LoadSpec:
    family: str
    urls: list[str]  # replicas of one family server
    sessions: int
    duration: float
    driver: str
    rate: float | None  # None: closed loop
    seed: int = 0


async def _run_load(spec: LoadSpec, conn) -> dict[str, Any]:
    choose = ACTION_MIXES.get(spec.family, generic_action)
    addresses = [url.split("//", 1)[1].rsplit(":", 1) for url in spec.urls]
    client = None
    if spec.driver == "client":
        from environments.core.client import EnvClient

        client = EnvClient(spec.urls, max_connections=spec.sessions + 4, timeout=120)
        sessions = [ClientSession(client) for _ in range(spec.sessions)]
    else:
        # session k talks to replica k % R (what the client's least-loaded choice amounts to)
        sessions = [RawSession(addresses[k % len(addresses)][0], int(addresses[k % len(addresses)][1])) for k in range(spec.sessions)]
    states: list[dict[str, Any]] = [{} for _ in sessions]

    import urllib.request

    with urllib.request.urlopen(f"{spec.urls[0]}/tasks?split=train&limit=0") as response:
        n_tasks = jsonio.loads(response.read())["count"]

    async def create(k: int) -> None:
        _remember(states[k], await sessions[k].create((k * 7 + spec.seed) % n_tasks))

    await asyncio.gather(*(create(k) for k in range(len(sessions))))
    conn.send("ready")
    conn.recv()  # "go"

    latencies: list[float] = []
    counts = {"steps": 0, "resets": 0, "invalid": 0}
    stop = time.perf_counter() + spec.duration
    mean_think = spec.sessions / spec.rate if spec.rate else 0.0

    async def drive(k: int) -> None:
        rng = random.Random(spec.seed * 100003 + k)
        session, state = sessions[k], states[k]
        # paced: step k+1 is due an exponential interval after step k was due (Poisson arrivals
        # per session), so the sessions together offer spec.rate steps/s whatever the latency
        due = time.perf_counter() + (rng.uniform(0, mean_think) if mean_think else 0.0)
        while True:
            if mean_think:
                await asyncio.sleep(max(0.0, min(due, stop) - time.perf_counter()))
                due += rng.expovariate(1.0 / mean_think)
            if time.perf_counter() >= stop:
                return
            action = choose(rng, state)
            started = time.perf_counter()
            data = await session.step(action)
            latencies.append(time.perf_counter() - started)
            counts["steps"] += 1
            info = data["info"]
            counts["invalid"] += bool(info.get("invalid_action"))
            _remember(state, info)
            if data["done"] or data["truncated"]:
                _remember(state, await session.reset())
                counts["resets"] += 1

    started, cpu_started = time.perf_counter(), time.process_time()
    await asyncio.gather(*(drive(k) for k in range(len(sessions))))
    elapsed, load_cpu = time.perf_counter() - started, time.process_time() - cpu_started
    conn.send("done")
    await asyncio.gather(*(s.close() for s in sessions))
    if client is not None:
        await client.aclose()
    latencies.sort()
    n = len(latencies)
    return {
        **counts,
        "elapsed_s": elapsed,
        "steps_per_s": counts["steps"] / elapsed,
        "load_cpu_us_per_step": load_cpu / max(1, counts["steps"]) * 1e6,
        "p50_ms": latencies[n // 2] * 1e3 if n else float("nan"),
        "p99_ms": latencies[min(n - 1, int(n * 0.99))] * 1e3 if n else float("nan"),
    }


def _load_process(spec: LoadSpec, conn) -> None:
    try:
        import uvloop

        result = uvloop.run(_run_load(spec, conn))
    except ImportError:
        result = asyncio.run(_run_load(spec, conn))
    except Exception as error:  # report instead of hanging the parent
        conn.send({"error": f"{type(error).__name__}: {error}"})
        return
    conn.send(result)


# ------------------------------------------------------------------------------------------ parent


def _cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(spec: LoadSpec, server_pids: list[int]) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    process = ctx.Process(target=_load_process, args=(spec, child), daemon=True)
    process.start()
    message = parent.recv()
    if message != "ready":
        process.join()
        raise RuntimeError(f"load process failed during setup: {message}")
    cpu_before = sum(_cpu_seconds(pid) for pid in server_pids)
    parent.send("go")
    message = parent.recv()
    if message != "done":
        process.join()
        raise RuntimeError(f"load process failed: {message}")
    cpu = sum(_cpu_seconds(pid) for pid in server_pids) - cpu_before
    result = parent.recv()
    process.join()
    if "error" in result:
        raise RuntimeError(result["error"])
    result["server_cpu_us_per_step"] = cpu / max(1, result["steps"]) * 1e6
    result["server_cpu_util"] = cpu / result["elapsed_s"]  # in cores, summed over replicas
    return result


def importable_families() -> list[str]:
    names = []
    for name in family_names():
        try:
            get_family(name)
        except Exception:  # missing optional dependencies: skip by default
            continue
        names.append(name)
    return names


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default=None, help="comma-separated (default: every registered family that imports)")
    parser.add_argument("--sessions", default="1,64,256")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    parser.add_argument("--driver", default="raw", choices=["raw", "client", "both"])
    parser.add_argument("--rates", default="5000", help="comma-separated offered steps/s of the paced runs ('' or 0: none)")
    parser.add_argument(
        "--heavy-sessions", type=int, default=8, help="at most this many sessions for families that are not inline (a JVM / browser each)"
    )
    parser.add_argument("--replicas", type=int, default=1, help="server processes per family (the client spreads sessions)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per configuration; the median run (by steps/s) is shown")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args(argv)

    families = args.families.split(",") if args.families else importable_families()
    session_counts = [int(s) for s in args.sessions.split(",")]
    drivers = ["raw", "client"] if args.driver == "both" else [args.driver]
    rates = [float(r) for r in args.rates.split(",") if r.strip()]
    rows = []
    load = os.getloadavg()
    print(f"# {os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, families {families}", flush=True)
    print(f"# {args.replicas} server process(es) per family")
    print("| family | driver | sessions | mode | steps/s | p50 ms | p99 ms | server CPU us/step | server CPU util | load-side CPU us/step | resets |")
    print("|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    for family in families:
        counts = session_counts
        if not get_family(family).inline:  # heavy instances: keep the default run feasible
            counts = sorted({min(n, args.heavy_sessions) for n in session_counts})
        extra = ["--max-sessions", str(max(counts) + 16), "--log-level", "WARNING"]
        servers = []
        try:
            servers = [start_env_server(family, extra_args=extra) for _ in range(args.replicas)]
            for driver in drivers:
                for n in counts:
                    modes = [None] + ([r for r in rates if r > 0] if n > 1 else [])
                    for rate in modes:
                        spec = [family, [s.url for s in servers], n, args.duration, driver, rate]
                        runs = [measure(LoadSpec(*spec, seed=r), [s.pid for s in servers]) for r in range(args.repeat)]
                        runs.sort(key=lambda run: run["steps_per_s"])
                        result = runs[len(runs) // 2]
                        mode = "closed" if rate is None else f"paced {rate:.0f}/s"
                        row = {"family": family, "driver": driver, "sessions": n, "mode": mode, **result, "all_steps_per_s": [r["steps_per_s"] for r in runs]}
                        rows.append(row)
                        print(
                            f"| {family} | {driver} | {n} | {mode} | {result['steps_per_s']:.0f} | {result['p50_ms']:.2f} | "
                            f"{result['p99_ms']:.2f} | {result['server_cpu_us_per_step']:.0f} | {result['server_cpu_util']:.2f} | "
                            f"{result['load_cpu_us_per_step']:.0f} | {result['resets']} |",
                            flush=True,
                        )
        finally:
            for server in servers:
                server.stop()
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
