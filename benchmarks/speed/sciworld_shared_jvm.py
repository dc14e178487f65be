"""Several ScienceWorld worlds in one JVM: do they stay correct, and what do they cost?

    python benchmarks/speed/sciworld_shared_jvm.py --json results/sciworld_shared_jvm/cpu.json

Three measurements (no model; ``environments/scienceworld/shared_jvm.py`` is what they back):

* **interleaved gold paths**: each task's gold path from a simulator of its own (the
  reference), then every task played in its own world of one JVM, one action of each in turn,
  one call at a time; reports each task's final score and completion flag.
* **concurrent, no lock**: the same actions chosen by a fixed rule from each state's sorted
  valid actions, first task by task in a fresh JVM (the reference trace), then in worlds of one
  JVM stepped from one thread each at once; reports the tasks whose trace (action, number of
  valid actions, score) differs from the reference. A second fresh JVM replays the reference
  to show the trace is reproducible; the worlds of one more JVM played one call at a time, a
  turn of each in turn (as ``shared_jvm`` runs them), show what interleaving alone changes.
* **memory**: the JVM's resident memory with 1, 4, 8 and 16 worlds loaded and stepped.
* **server load** (``--load POOL:WORLDS_PER_JVM:SESSIONS,...``): one ScienceWorld server per
  entry (``--pool-size POOL --worlds-per-jvm WORLDS_PER_JVM``) plays SESSIONS dev episodes at
  once, each ``--turns`` turns of "check valid actions" and a random listed action (no model),
  and reports the wall time: what the CPU side of a rollout costs at that concurrency;
  ``--rounds R`` plays R such rounds on the same server (its JVMs warming up), and
  ``--java-options`` sets the JVMs' ``JAVA_TOOL_OPTIONS``.

    python benchmarks/speed/sciworld_shared_jvm.py --skip-checks --turns 6 \
        --load 8:1:32,32:1:32,32:8:32,8:4:8,8:1:8 --json results/sciworld_shared_jvm/load_cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import sys
import random
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from environments.scienceworld.pool import java_pid, start_simulator, stop_simulator  # noqa: E402

TASKS = (("boil", 14), ("melt", 15), ("freeze", 16), ("chemistry-mix", 20),
         ("find-living-thing", 100), ("grow-plant", 70),
         ("measure-melting-point-known-substance", 300), ("power-component", 10),
         ("lifespan-longest-lived", 60), ("identify-life-stages-1", 8),
         ("inclined-plane-determine-angle", 40), ("test-conductivity", 400))
SKIP = ("connect", "disconnect", "look at", "read", "wait")


def new_world(jvm):
    return jvm._gateway.jvm.scienceworld.runtime.pythonapi.PythonInterface()


def rss_mb(jvm) -> int:
    with open(f"/proc/{java_pid(jvm)}/status") as fh:
        return int(fh.read().split("VmRSS:")[1].split()[0]) // 1024


def ruled_turn(server, task: str, turn: int) -> list:
    """One turn: the action picked from the sorted valid actions by a hash of (task, turn),
    played; returns [action, number of valid actions, score]."""
    valid = sorted(server.getValidActionObjectCombinations())
    useful = [a for a in valid if not a.startswith(SKIP)] or valid
    action = useful[int(hashlib.md5(f"{task}{turn}".encode()).hexdigest(), 16) % len(useful)]
    server.step(action)
    return [action, len(valid), round(server.getScore(), 3)]


def ruled_trace(server, task: str, variation: int, turns: int) -> list:
    """``turns`` ruled turns of ``task`` from its start."""
    server.load(task, variation, "", False)
    server.step("look around")
    return [ruled_turn(server, task, turn) for turn in range(turns)]


def interleaved_gold(tasks) -> dict:
    reference = start_simulator()
    try:
        paths = {}
        for task, variation in tasks:
            reference.load(task, variation, "", generateGoldPath=True)
            paths[(task, variation)] = list(reference.get_gold_action_sequence())
    finally:
        stop_simulator(reference)
    jvm = start_simulator()
    try:
        worlds = {key: new_world(jvm) for key in paths}
        for (task, variation), world in worlds.items():
            world.load(task, variation, "", False)
            world.step("look around")
        for turn in range(max(map(len, paths.values()))):
            for key, world in worlds.items():
                if turn < len(paths[key]):
                    world.getValidActionObjectCombinations()
                    world.step(paths[key][turn])
        return {f"{t}/var={v}": {"gold_actions": len(paths[(t, v)]),
                                 "score": round(100 * w.getScore()),
                                 "completed": bool(w.getCompleted())}
                for (t, v), w in worlds.items()}
    finally:
        stop_simulator(jvm)


def concurrent_unlocked(tasks, turns: int) -> dict:
    traces = []
    for _ in range(2):  # two fresh JVMs, task by task: the reference and its replay
        jvm = start_simulator()
        try:
            traces.append({f"{t}/var={v}": ruled_trace(jvm.server, t, v, turns) for t, v in tasks})
        finally:
            stop_simulator(jvm)
    jvm = start_simulator()
    shared, errors = {}, {}
    try:
        worlds = {f"{t}/var={v}": (new_world(jvm), t, v) for t, v in tasks}

        def play(key):
            world, task, variation = worlds[key]
            try:
                shared[key] = ruled_trace(world, task, variation, turns)
            except Exception as error:  # noqa: BLE001 (reported, not raised)
                errors[key] = repr(error)[:200]

        threads = [threading.Thread(target=play, args=(key,)) for key in worlds]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        stop_simulator(jvm)
    reference, replay = traces
    locked = interleaved_ruled(tasks, turns)
    return {"turns": turns,
            "replay_differs": sorted(k for k in reference if replay[k] != reference[k]),
            "interleaved_locked_differs": sorted(k for k in reference
                                                 if locked[k] != reference[k]),
            "interleaved_locked_scores_equal": sorted(
                k for k in reference if [r[2] for r in locked[k]] == [r[2] for r in reference[k]]),
            "concurrent_differs": sorted(k for k in reference if shared.get(k) != reference[k]),
            "concurrent_errors": errors}


def interleaved_ruled(tasks, turns: int) -> dict:
    """The ruled traces, the worlds of one JVM played one call at a time, one turn of each
    in turn (as ``shared_jvm`` runs them)."""
    jvm = start_simulator()
    try:
        worlds = {f"{t}/var={v}": new_world(jvm) for t, v in tasks}
        for (task, variation), world in zip(tasks, worlds.values()):
            world.load(task, variation, "", False)
            world.step("look around")
        traces = {key: [] for key in worlds}
        for turn in range(turns):
            for (task, _), (key, world) in zip(tasks, worlds.items()):
                traces[key].append(ruled_turn(world, task, turn))
        return traces
    finally:
        stop_simulator(jvm)


def memory(counts=(1, 4, 8, 16), steps: int = 10) -> dict:
    jvm = start_simulator()
    try:
        out, worlds = {}, []
        for i in range(max(counts)):
            task, variation = TASKS[i % 8]
            world = new_world(jvm)
            world.load(task, variation, "", False)
            world.step("look around")
            for _ in range(steps):
                world.getValidActionObjectCombinations()
                world.step("look around")
            worlds.append(world)
            if i + 1 in counts:
                out[str(i + 1)] = rss_mb(jvm)
        return {"steps_per_world": steps, "jvm_rss_mb_by_worlds": out}
    finally:
        stop_simulator(jvm)


async def server_load(pool: int, worlds_per_jvm: int, sessions: int, turns: int,
                      rounds: int = 1) -> dict:
    """One server; ``rounds`` times, ``sessions`` dev episodes at once (each round's own)."""
    from agentrl_common.processes import start_env_server
    from environments.core.client import EnvClient
    from environments.scienceworld.catalog import ScienceWorldCatalog

    server = start_env_server("scienceworld", extra_args=[
        "--pool-size", str(pool), "--worlds-per-jvm", str(worlds_per_jvm),
        "--workers", str(sessions + pool + 8)])
    task_ids = ScienceWorldCatalog().task_ids("dev")
    errors: list[str] = []
    steps = [0]
    seconds = []
    try:
        async with EnvClient(server.url, timeout=600) as client:
            async def episode(seed: int, task_id: str) -> None:
                rng = random.Random(seed)
                try:
                    env_id, _, _ = await client.create(task_id=task_id)
                    for _ in range(turns):
                        listed = await client.step(env_id, "check valid actions")
                        actions = listed.info.get("available_actions") or ["look around"]
                        result = await client.step(env_id, rng.choice(actions))
                        steps[0] += 1
                        if result.done:
                            break
                    await client.close(env_id)
                except Exception as error:  # noqa: BLE001 (reported)
                    errors.append(repr(error)[:200])

            for r in range(rounds):
                begin = time.monotonic()
                await asyncio.gather(*(
                    episode(1000 * r + i, task_ids[(37 * i + 11 * r) % len(task_ids)])
                    for i in range(sessions)))
                seconds.append(round(time.monotonic() - begin, 2))
    finally:
        server.stop()
    return {"pool": pool, "worlds_per_jvm": worlds_per_jvm, "sessions": sessions,
            "turns": turns, "steps": steps[0], "seconds": seconds[0],
            "seconds_by_round": seconds, "errors": errors,
            "java_tool_options": os.environ.get("JAVA_TOOL_OPTIONS", "")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--turns", type=int, default=12)
    p.add_argument("--load", default="", help="POOL:WORLDS_PER_JVM:SESSIONS,... (server load)")
    p.add_argument("--rounds", type=int, default=1, help="server load: rounds of SESSIONS")
    p.add_argument("--java-options", default="",
                   help="server load: JAVA_TOOL_OPTIONS for its JVMs (e.g. -XX:TieredStopAtLevel=1)")
    p.add_argument("--skip-checks", action="store_true", help="only the server load")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    result: dict = {"cpus": os.cpu_count()}
    for entry in filter(None, args.load.split(",")):
        pool, per_jvm, sessions = map(int, entry.split(":"))
        if args.java_options:
            os.environ["JAVA_TOOL_OPTIONS"] = args.java_options
        row = asyncio.run(server_load(pool, per_jvm, sessions, args.turns, args.rounds))
        result.setdefault("server_load", []).append(row)
        print(f"pool {pool}, {per_jvm} world(s) a JVM, {row['sessions']} sessions x "
              f"{args.turns} turns, by round: {row['seconds_by_round']} s "
              f"({len(row['errors'])} errors)")
    if not args.skip_checks:
        checks(args.turns, result)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)


def checks(turns: int, result: dict) -> None:
    result.update(interleaved_gold=interleaved_gold(TASKS),
                  concurrent_unlocked=concurrent_unlocked(TASKS[:8], turns), memory=memory())
    solved = sum(r["completed"] and r["score"] == 100 for r in result["interleaved_gold"].values())
    print(f"interleaved gold paths in one JVM: {solved} of {len(TASKS)} complete at score 100")
    c = result["concurrent_unlocked"]
    print(f"no lock, 8 worlds stepped at once: {len(c['concurrent_differs'])} of 8 traces differ "
          f"from a fresh JVM's ({len(c['replay_differs'])} differ on a replay in another fresh "
          f"JVM), {len(c['concurrent_errors'])} raised; one call at a time, interleaved: "
          f"{len(c['interleaved_locked_differs'])} of 8 differ")
    print("JVM RSS (MB) by worlds:", result["memory"]["jvm_rss_mb_by_worlds"])


if __name__ == "__main__":
    main()
