"""Does a jitted call that donates a buffer still being written by the previous call block its
caller until that call is done? The engine's prefill and row-copy calls donate the KV cache,
often back to back within one admission pass, and in the GPU profiles their launches keep the
engine thread off the CPU for most of each call (docs/PERFORMANCE.md, "Actor workers in the RL
step, and the host changes at 20 turns": the GIL hand-offs of the call's arrays are not it). If the
launch waits for the donated buffer's producer, that wait is device time spent with the
thread idle, and host work could be moved before the launch.

One process, one jitted step over a KV-cache-like tuple of ``--layers`` arrays
``[slots, length, width]``: ``--matmuls`` chained ``[rows, dim] @ [dim, dim]`` products (the
device work), then the result's first ``width`` columns written into every array at a
position (``dynamic_update_slice``), returning the arrays and a scalar. Variants, each
``--calls`` times after a warm-up, alternated over ``--repeats`` rounds:

* ``donated_back_to_back``: call A, then at once call B on A's output arrays (donated);
* ``donated_after_sync``: the same with A's outputs ready before B is called;
* ``kept_back_to_back``: no donation (the step copies the arrays), B at once after A.

Per variant: the mean milliseconds B's call takes to return (its launch) and the calling
thread's CPU milliseconds in it, and A's device time (call to ready, alone). If the first
variant's launch is about A's device time and the others' a fraction of a millisecond, a
donated launch waits for its producer.

    python benchmarks/speed/donation_dispatch.py --json donation_dispatch.json
    python benchmarks/speed/donation_dispatch.py --layers 2 --slots 4 --length 64 \\
        --dim 64 --rows 64 --matmuls 2 --calls 3 --repeats 1    # a CPU smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

VARIANTS = ("donated_back_to_back", "donated_after_sync", "kept_back_to_back")


def make_step(matmuls: int, width: int, donate: bool) -> Any:
    """The jitted step: ``(kv, x, w, position) -> (kv', total)``, ``kv``: a tuple of
    ``[slots, length, width]`` arrays, ``x``: ``[rows, dim]``, ``w``: ``[dim, dim]``;
    ``y = tanh(... tanh(x @ w) ... @ w)`` (``matmuls`` products), ``y[:slots, :width]``
    written into every array at ``[0, position, 0]``; ``total = sum(y)``."""
    import jax
    import jax.numpy as jnp

    def step(kv, x, w, position):
        y = x
        for _ in range(matmuls):
            y = jnp.tanh(y @ w)
        block = y[:kv[0].shape[0], None, :width].astype(kv[0].dtype)
        new = tuple(jax.lax.dynamic_update_slice(a, block, (0, position, 0)) for a in kv)
        return new, jnp.sum(y.astype(jnp.float32))

    return jax.jit(step, donate_argnums=(0,) if donate else ())


def measure(variant: str, steps: dict[bool, Any], kv: tuple, x: Any, w: Any,
            calls: int) -> tuple[tuple, dict[str, float]]:
    """``calls`` pairs of calls A, B of ``variant``; the mean launch of B (wall and thread CPU
    ms) and A's mean device time (ms from its call to its outputs ready, measured on pairs
    where B follows after a sync)."""
    import jax
    import numpy as np

    step = steps[variant.startswith("donated")]
    launch, cpu, device = [], [], []
    for i in range(calls):
        position = np.int32(i % 8)
        t0 = time.perf_counter()
        kv, total_a = step(kv, x, w, position)
        if variant == "donated_after_sync":
            jax.block_until_ready((kv, total_a))
            device.append((time.perf_counter() - t0) * 1e3)
        c0, t1 = time.thread_time(), time.perf_counter()
        kv, total_b = step(kv, x, w, np.int32((i + 1) % 8))
        launch.append((time.perf_counter() - t1) * 1e3)
        cpu.append((time.thread_time() - c0) * 1e3)
        jax.block_until_ready((kv, total_b))
    result = {"launch_ms": statistics.mean(launch), "launch_cpu_ms": statistics.mean(cpu)}
    if device:
        result["device_ms_a"] = statistics.mean(device)
    return kv, result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=60, help="KV arrays (keys and values)")
    parser.add_argument("--slots", type=int, default=256)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--width", type=int, default=192, help="an array's last dimension")
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--dim", type=int, default=2048)
    parser.add_argument("--matmuls", type=int, default=100)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.width > args.dim or args.slots > args.rows or args.length < 9:
        parser.error("needs --width <= --dim, --slots <= --rows and --length >= 9")

    import jax
    import jax.numpy as jnp

    kv = tuple(jnp.zeros((args.slots, args.length, args.width), jnp.bfloat16)
               for _ in range(args.layers))
    key_x, key_w = jax.random.split(jax.random.PRNGKey(0))
    x = jax.random.normal(key_x, (args.rows, args.dim), jnp.bfloat16)
    w = (jax.random.normal(key_w, (args.dim, args.dim), jnp.float32)
         / args.dim ** 0.5).astype(jnp.bfloat16)
    steps = {donate: make_step(args.matmuls, args.width, donate) for donate in (True, False)}
    for variant in VARIANTS:  # warm-up: compiles both steps
        kv, _ = measure(variant, steps, kv, x, w, 2)
    rounds: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    for _ in range(args.repeats):
        for variant in VARIANTS:
            kv, result = measure(variant, steps, kv, x, w, args.calls)
            rounds[variant].append(result)
    summary = {v: {k: statistics.median(r[k] for r in rounds[v]) for k in rounds[v][0]}
               for v in VARIANTS}
    device = summary["donated_after_sync"]["device_ms_a"]
    print(f"device: {jax.devices()[0].device_kind}; step A alone: {device:.3f} ms on the device")
    print("| variant | B's launch (ms) | of it on a CPU (ms) |\n|---|---|---|")
    for variant in VARIANTS:
        s = summary[variant]
        print(f"| {variant} | {s['launch_ms']:.3f} | {s['launch_cpu_ms']:.3f} |")
    out = {"device": jax.devices()[0].device_kind, "args": vars(args), "summary": summary,
           "rounds": rounds}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
