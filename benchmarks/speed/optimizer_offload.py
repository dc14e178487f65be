"""Optimizer-state offload (``learner.offload_optimizer_state``): device memory and time of one
optimiser step with the AdamW moments on the device vs in pinned host memory.

    python benchmarks/speed/optimizer_offload.py                 # one GPU: ~1.9 B float32 parameters
    python benchmarks/speed/optimizer_offload.py --div 64        # CPU smoke run (no memory stats)

A synthetic parameter tree shaped like a Qwen2.5-7B's largest leaves (a 152064 x 3584
embedding and LM head, twelve 3584 x 18944 MLP matrices, twelve norms: ~1.9 B parameters;
``--div k`` divides the large dimensions), float32, on one device. Each setting runs in its own
subprocess (so the device's peak-memory counter is its own): the state is created
(``offload.init_opt_state``), then ``--steps`` full optimiser steps (global-norm clip + AdamW,
``offload.make_update_fn``: one jitted program without offload, a host loop of per-leaf jitted
calls with it) run on fresh gradients and are timed. Printed per setting, as one JSON line:
the device's ``peak_bytes_in_use``, the step times, the state's memory kinds, and the expected
peak for ``N`` parameters (without offload: parameters + gradients + moments, ``16 N`` bytes;
with offload: parameters + gradients, ``8 N``, + twice the largest leaf's moments, ``16 x``
its size: the moments copied in and the updated ones going back).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def shapes(div: int) -> dict[str, tuple[int, ...]]:
    """The synthetic tree's leaf shapes."""
    out: dict[str, tuple[int, ...]] = {"embed": (152064 // div, 3584),
                                       "head": (3584, 152064 // div)}
    out.update({f"mlp{i}": (3584, 18944 // div) for i in range(12)})
    out.update({f"norm{i}": (3584,) for i in range(12)})
    return out


def run_setting(offload: bool, div: int, steps: int) -> dict:
    """One setting in this process: create the state, time ``steps`` optimiser steps."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from agentrl_jax.learner import LearnerConfig
    from agentrl_jax.learner.offload import host_shardings, init_opt_state, make_update_fn
    from agentrl_jax.learner.optim import make_optimizer, optimizer_parts

    device = NamedSharding(Mesh(np.array(jax.devices()[:1]), ("x",)), P())
    leaf_shapes = shapes(div)
    param_shardings = {k: device for k in leaf_shapes}
    make = jax.jit(lambda: {k: jnp.full(s, 0.01, jnp.float32) for k, s in leaf_shapes.items()},
                   out_shardings=param_shardings)
    params = make()
    config = LearnerConfig(dtype="bfloat16", kl_coef=0.0, entropy_coef=0.0, weight_decay=0.01,
                           offload_optimizer_state=offload)
    tx, _ = make_optimizer(config)
    parts = optimizer_parts(config) if offload else None
    opt_shardings = jax.tree.map(lambda _: device, jax.eval_shape(tx.init, params))
    if offload:
        opt_shardings = host_shardings(opt_shardings)
    state = init_opt_state(tx, parts, params, opt_shardings)
    update = make_update_fn(tx, parts, param_shardings, opt_shardings)  # donates all three
    times = []
    for _ in range(steps):
        grads = make()
        jax.block_until_ready(grads)
        start = time.perf_counter()
        params, state, norm = update(params, state, grads)
        jax.block_until_ready((params, state, norm))
        times.append(time.perf_counter() - start)
    n = sum(int(np.prod(s)) for s in leaf_shapes.values())
    largest = max(int(np.prod(s)) for s in leaf_shapes.values())
    stats = jax.devices()[0].memory_stats() or {}
    result = {"offload": offload, "device": str(jax.devices()[0].device_kind),
              "params_B": n / 1e9, "state_kinds": sorted({x.sharding.memory_kind
                                                          for x in jax.tree.leaves(state)}),
              "peak_GiB": stats.get("peak_bytes_in_use", 0) / 2 ** 30,
              "in_use_GiB": stats.get("bytes_in_use", 0) / 2 ** 30, "step_s": times,
              "expected_peak_GiB": (8 * n + (16 * largest if offload else 8 * n)) / 2 ** 30}
    if offload:
        result.update(leaf_calls=update.leaf_calls, leaf_executables=update.executables())
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--div", type=int, default=1, help="divide the large dimensions by this")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--setting", choices=["0", "1"], default=None,
                   help="(internal) run one setting in this process: 1 = offload")
    p.add_argument("--json", default=None, help="write both settings' results here")
    args = p.parse_args()
    if args.setting is not None:
        print(json.dumps(run_setting(args.setting == "1", args.div, args.steps)))
        return
    results = []
    for setting in ("0", "1"):
        proc = subprocess.run([sys.executable, __file__, "--setting", setting, "--div",
                               str(args.div), "--steps", str(args.steps)],
                              capture_output=True, text=True)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode != 0 or not lines:
            raise SystemExit(f"setting offload={setting} failed:\n{proc.stderr[-3000:]}")
        results.append(json.loads(lines[-1]))
        print(lines[-1], flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
