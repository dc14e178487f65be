"""ScienceWorld's valid actions: the package's element-by-element copy against slices joined in
the JVM.

    python benchmarks/speed/sciworld_valid_actions.py --json results/sciworld_valid_actions/cpu.json

For a few states of dev tasks (each a task, a variation and the actions that lead there), one
simulator asks for the state's valid actions ``--reps`` times each way, alternating: ``copy``
is ``list(server.getValidActionObjectCombinations())`` (what
``ScienceWorldEnv.get_valid_action_object_combinations`` does: one py4j round trip per element)
and ``joined`` is ``environments/scienceworld/valid_actions.valid_action_list`` (the JVM joins
slices of the list into strings of under ``SLICE_CHARS`` characters). The median and minimum
of each and their ratio are reported per state, and the Java call alone (no copy) beside them. One Java
list is first copied both ways and the two copies must be equal (two calls in one state need
not be: the simulator names some objects differently from call to call).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from environments.scienceworld.pool import start_simulator, stop_simulator  # noqa: E402
from environments.scienceworld.valid_actions import copy_java_list, valid_action_list  # noqa: E402

#: (task, variation, actions from the start): a small room, a kitchen, outside
STATES = (("boil", 0, ()), ("boil", 0, ("open door to kitchen", "go to kitchen")),
          ("lifespan-longest-lived", 93, ("open door to outside", "go to outside")),
          ("power-component", 15, ()))


def timed(call: Callable[[], Any], reps: int) -> tuple[list[float], Any]:
    """``reps`` wall times of ``call()`` in seconds, and its last result."""
    times, result = [], None
    for _ in range(reps):
        start = time.perf_counter()
        result = call()
        times.append(time.perf_counter() - start)
    return times, result


def measure(sim: Any, state: tuple[str, int, tuple[str, ...]], reps: int,
            warmup: int) -> dict[str, Any]:
    task, variation, actions = state
    sim.load(task, variation, "", generateGoldPath=False)
    sim.server.reset()
    for action in ("look around", *actions):
        sim.server.step(action)
    ways: dict[str, Callable[[], Any]] = {
        "copy": lambda: list(sim.server.getValidActionObjectCombinations()),
        "joined": lambda: valid_action_list(sim),
        "java_call_only": lambda: sim.server.getValidActionObjectCombinations(),
    }
    java_list = sim.server.getValidActionObjectCombinations()  # one list, copied both ways
    if list(java_list) != copy_java_list(java_list, sim._gateway):
        raise SystemExit(f"{task}/{variation}: the joined list differs from the copy")
    for call in ways.values():  # the JVM compiles py4j's string and list paths as a run would
        timed(call, warmup)
    times: dict[str, list[float]] = {name: [] for name in ways}
    results: dict[str, Any] = {}
    for _ in range(reps):  # alternate, so a JIT warming up or a busy moment hits both
        for name, call in ways.items():
            spent, results[name] = timed(call, 1)
            times[name] += spent
    row: dict[str, Any] = {"task": task, "variation": variation, "actions": list(actions),
                           "valid_actions": len(results["copy"])}
    for name, spent in times.items():
        row[f"{name}_median_ms"] = round(1e3 * statistics.median(spent), 2)
        row[f"{name}_min_ms"] = round(1e3 * min(spent), 2)
    row["copy_over_joined"] = round(row["copy_median_ms"] / row["joined_median_ms"], 2)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=40, help="untimed calls each way first")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    sim = start_simulator()
    try:
        rows = [measure(sim, state, args.reps, args.warmup) for state in STATES]
    finally:
        stop_simulator(sim)
    for row in rows:
        print(f"{row['task']}/var={row['variation']} after {len(row['actions'])} moves: "
              f"{row['valid_actions']} actions; copy {row['copy_median_ms']} ms, joined "
              f"{row['joined_median_ms']} ms ({row['copy_over_joined']}x), Java call alone "
              f"{row['java_call_only_median_ms']} ms (medians of {args.reps})")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as fh:
            json.dump({"command": " ".join(sys.argv), "reps": args.reps, "warmup": args.warmup,
                       "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                       "date": time.strftime("%Y-%m-%d"), "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
