"""The host cost of calling a jitted function with the engine's weights as an ``nnx.State``
against the same weights as a flat list of arrays (the leaves, flattened once per weight
version), side by side in one process.

Every engine call (a prefill, a decode) passes the weights; jit flattens them on each call,
and an ``nnx.State`` flattens through Python where a list flattens in C++. The weights here are
the model shape's ~270 parameters with one element each, so the call measures dispatch alone
(no transfer, no compute): ``jit call`` is the whole host cost of calling a function that adds
one to a small array, ``flatten`` jax's pytree flatten of the weights alone.

    python benchmarks/speed/dispatch.py --shape smollm2-135m --calls 300 --repeats 3

Prints one line per repeat and the medians with their ratio; ``--json`` writes them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def per_call_ms(fn: Callable[[], object], calls: int) -> float:
    """Mean wall milliseconds of ``fn()`` over ``calls`` calls."""
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e3


def measure(shape: str, calls: int, repeats: int) -> dict:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from agentrl_jax.models.llama import abstract_model
    from benchmarks.speed.engine import model_config

    _, abstract = nnx.split(abstract_model(model_config(shape, "bfloat16")))
    state = jax.tree.map(lambda a: jnp.zeros((1,), a.dtype), abstract)
    leaves = jax.tree.leaves(state)
    x = jnp.zeros((4,), jnp.float32)
    add_one = jax.jit(lambda weights, v: v + 1)  # one program per weights structure
    jax.block_until_ready((add_one(state, x), add_one(leaves, x)))  # compile both
    rows = []
    for _ in range(repeats):  # alternated, so a busy machine slows both alike
        rows.append({"flatten_state_ms": per_call_ms(lambda: jax.tree.flatten(state), calls),
                     "flatten_leaves_ms": per_call_ms(lambda: jax.tree.flatten(leaves), calls),
                     "call_state_ms": per_call_ms(lambda: add_one(state, x), calls),
                     "call_leaves_ms": per_call_ms(lambda: add_one(leaves, x), calls)})
    medians = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    return {"shape": shape, "weights": len(leaves), "calls": calls, "repeats": rows,
            "medians": medians, "device": jax.devices()[0].platform,
            "call_ratio": medians["call_state_ms"] / medians["call_leaves_ms"]}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="smollm2-135m", help="a shape of benchmarks/speed/engine.py")
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default=None, help="write the result here")
    args = p.parse_args(argv)
    out = measure(args.shape, args.calls, args.repeats)
    for r in out["repeats"]:
        print(f"flatten: state {r['flatten_state_ms']:.3f} ms, leaves {r['flatten_leaves_ms']:.3f}"
              f" ms; jit call: state {r['call_state_ms']:.3f} ms, leaves "
              f"{r['call_leaves_ms']:.3f} ms")
    m = out["medians"]
    print(f"{out['shape']} ({out['weights']} weights, {out['device']}), medians: a jit call with "
          f"the nnx.State {m['call_state_ms']:.3f} ms, with the leaves {m['call_leaves_ms']:.3f}"
          f" ms ({out['call_ratio']:.1f}x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
