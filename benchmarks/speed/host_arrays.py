"""A jitted call's host arrays and the GIL: the engine's prefill input as three NumPy arrays
(slot ids, tokens, positions) against the same values in one array
(``prefill_plan.PrefillRows``), side by side in one process, alone and beside a thread that
wants the GIL.

Each host array a jitted call receives is transferred with the GIL released, and so is the
launch; a thread that releases the GIL waits to get it back until the thread holding it gives
it up, at most the switch interval (5 ms) later. In a rollout the event loop is that other
thread (docs/PERFORMANCE.md, "The two host changes in a 20-turn rollout": the engine thread
off the CPU ~10 ms a prefill launch at 20 turns), in bursts: a decode call's ~50 results, each
a turn's Python. Here the other thread runs Python without pause (``busy``: the engine thread
launching during such a burst) or does not exist (``alone``); the call passes the engine's
weights as leaves (the model shape's ~270 arrays of one element, as ``dispatch.py``) and the
prefill's int32 inputs of one packed BabyAI call (64 rows x 64 tokens), and adds one element
of each array to a small one, so it measures the host side of a call (transfers and launch),
not a model.

    python benchmarks/speed/host_arrays.py --calls 200 --repeats 3

Per call: the mean wall milliseconds from the call to its return, and the calling thread's CPU
milliseconds in it (``time.thread_time``), over ``--calls`` calls; the medians of those over
``--repeats`` runs, the two layouts alternated. ``--json`` writes them. What a rollout gains
depends on how often a launch meets a burst: its profile on a GPU says
(``rollout_profile.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


class GilHolder:
    """A thread that runs Python without pause until stopped."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        x = 0
        while not self._stop.is_set():
            for i in range(1000):
                x += i

    def __enter__(self) -> "GilHolder":
        self._thread.start()
        time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def per_call(fn, calls: int) -> tuple[float, float]:
    """Mean wall ms and mean calling-thread CPU ms of ``fn()`` (its result made ready outside
    the timed span) over ``calls`` calls: means, since a rollout pays the sum of its waits."""
    import jax

    walls, cpus = [], []
    for _ in range(calls):
        t0, c0 = time.perf_counter(), time.thread_time()
        out = fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.thread_time() - c0)
        jax.block_until_ready(out)
    return statistics.fmean(walls) * 1e3, statistics.fmean(cpus) * 1e3


def measure(shape: str, rows: int, chunk: int, calls: int, repeats: int) -> dict:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from agentrl_jax.models.llama import abstract_model
    from agentrl_jax.rollout.engine.prefill_plan import pack_rows, split_rows
    from benchmarks.speed.engine import model_config

    _, abstract = nnx.split(abstract_model(model_config(shape, "bfloat16")))
    leaves = tuple(jnp.zeros((1,), a.dtype) for a in jax.tree.leaves(abstract))
    rng = np.random.default_rng(0)
    slot_ids = rng.integers(0, 256, rows).astype(np.int32)
    tokens = rng.integers(0, 49152, (rows, chunk)).astype(np.int32)
    positions = rng.integers(0, 3072, (rows, chunk)).astype(np.int32)
    packed = pack_rows(slot_ids, tokens, positions).packed

    def body(weights, acc, s, t, p):
        return acc + (s[0] + t[0, 0] + p[0, 0]).astype(jnp.float32) + weights[0][0]

    three = jax.jit(body, donate_argnums=(1,))
    one = jax.jit(lambda w, acc, rows_in: body(w, acc, *split_rows(rows_in, chunk)),
                  donate_argnums=(1,))
    acc = [jnp.zeros((4,), jnp.float32)]

    def call_three():
        acc[0] = three(leaves, acc[0], slot_ids, tokens, positions)
        return acc[0]

    def call_one():
        acc[0] = one(leaves, acc[0], packed)
        return acc[0]

    # compile both; what one call adds, from a fresh accumulator (the test checks it)
    acc[0] = jnp.zeros((4,), jnp.float32)
    added = {"three": float(jax.device_get(call_three())[0])}
    acc[0] = jnp.zeros((4,), jnp.float32)
    added["one"] = float(jax.device_get(call_one())[0])
    out: dict = {"shape": shape, "weights": len(leaves), "rows": rows, "chunk": chunk,
                 "calls": calls, "device": jax.devices()[0].platform,
                 "switch_interval_s": sys.getswitchinterval(), "per_call_value": added,
                 "settings": {}}
    for name in ("alone", "busy"):
        runs = []
        for _ in range(repeats):
            if name == "busy":
                with GilHolder():
                    runs.append((per_call(call_three, calls), per_call(call_one, calls)))
            else:
                runs.append((per_call(call_three, calls), per_call(call_one, calls)))
        med = {"three_wall_ms": statistics.median(r[0][0] for r in runs),
               "three_cpu_ms": statistics.median(r[0][1] for r in runs),
               "one_wall_ms": statistics.median(r[1][0] for r in runs),
               "one_cpu_ms": statistics.median(r[1][1] for r in runs)}
        med["wall_ratio"] = med["three_wall_ms"] / med["one_wall_ms"]
        out["settings"][name] = {"repeats": [{"three": list(a), "one": list(b)}
                                             for a, b in runs], "medians": med}
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="smollm2-135m", help="a shape of benchmarks/speed/engine.py")
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--chunk", type=int, default=64)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default=None, help="write the result here")
    args = p.parse_args(argv)
    out = measure(args.shape, args.rows, args.chunk, args.calls, args.repeats)
    print(f"{out['shape']} weights as {out['weights']} leaves, prefill input {args.rows} x "
          f"{args.chunk} ({out['device']}; switch interval {out['switch_interval_s'] * 1e3:g} ms)")
    for name, entry in out["settings"].items():
        m = entry["medians"]
        print(f"{name:>5}: three arrays {m['three_wall_ms']:.3f} ms (CPU {m['three_cpu_ms']:.3f}),"
              f" one array {m['one_wall_ms']:.3f} ms (CPU {m['one_cpu_ms']:.3f}): "
              f"{m['wall_ratio']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
