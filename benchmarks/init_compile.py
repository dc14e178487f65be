"""Compile time of the sharded random initialiser (``init_model(cfg, seed, mesh=...)``).

    python benchmarks/init_compile.py --shape qwen2.5-7b --variants key_argument
    python benchmarks/init_compile.py --shape qwen2.5-1.5b --variants constant_seed,key_argument

``constant_seed``: the seed closed over by the jitted initialiser (every input of the program is
a compile-time constant, so XLA may try to constant-fold the random draws: a Qwen2.5-7B shape
took 5 min 49 s to compile on an H200); ``key_argument``: the PRNG key passed as an argument (what
``init_model`` does). Only ``lower().compile()`` is timed: nothing is allocated or run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

def shapes() -> dict[str, dict]:
    """The shapes of benchmarks/engine.py and the paper-scale experiment's 7B."""
    from benchmarks.engine import SHAPES
    from experiments.paper_scale_7b import QWEN25_7B

    return {**SHAPES, "qwen2.5-7b": dict(QWEN25_7B)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", default="qwen2.5-1.5b", help=", ".join(sorted(shapes())))
    p.add_argument("--variants", default="constant_seed,key_argument")
    p.add_argument("--json", default=None)
    args = p.parse_args()

    import jax
    import numpy as np
    from flax import nnx
    from jax.sharding import Mesh

    from agentrl_jax.models.config import ModelConfig
    from agentrl_jax.models.llama import CausalLM, abstract_model
    from agentrl_jax.sharding.rules import DEFAULT_RULES, state_shardings

    cfg = ModelConfig(**shapes()[args.shape])
    devices = jax.local_devices()
    mesh = Mesh(np.array(devices).reshape(1, len(devices), 1), ("data", "fsdp", "tensor"))
    _, abstract_state = nnx.split(abstract_model(cfg))
    shardings = state_shardings(abstract_state, mesh, DEFAULT_RULES)
    report = {"shape": args.shape, "device": f"{devices[0].device_kind} x {len(devices)}",
              "compile_s": {}}
    for variant in args.variants.split(","):
        t0 = time.perf_counter()
        if variant == "constant_seed":
            fn = jax.jit(lambda: nnx.split(CausalLM(cfg, rngs=nnx.Rngs(0)))[1],
                         out_shardings=shardings)
            fn.lower().compile()
        elif variant == "key_argument":
            fn = jax.jit(lambda key: nnx.split(CausalLM(cfg, rngs=nnx.Rngs(key)))[1],
                         out_shardings=shardings)
            fn.lower(jax.random.key(0)).compile()
        else:
            raise SystemExit(f"unknown variant {variant!r}")
        report["compile_s"][variant] = time.perf_counter() - t0
        print(f"{args.shape} {variant}: compiled in {report['compile_s'][variant]:.1f} s on "
              f"{report['device']}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
