"""Time to create a sharded random model (``init_model(cfg, seed, mesh=...)``) over all local devices.

    python benchmarks/speed/init_compile.py --shape qwen2.5-7b --variants init_host
    python benchmarks/speed/init_compile.py --shape qwen2.5-1.5b --variants constant_seed,key_argument,init_host

Compile only (nothing allocated or run): ``constant_seed``, the seed closed over by the jitted
initialiser (``init_model(..., initialise_on="device")``; the Qwen2.5-7B shape's compile time:
docs/PERFORMANCE.md, "Not run"); ``key_argument``, the PRNG key passed as an argument instead.
Whole calls, until every parameter is on its devices: ``init_device`` and ``init_host``
(``init_model(..., initialise_on=...)``: drawn under jit in the sharding, or on the host CPU
then placed slice by slice).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

def shapes() -> dict[str, dict]:
    """The shapes of benchmarks/speed/engine.py and the paper-scale experiment's 7B."""
    from benchmarks.speed.engine import SHAPES
    from experiments.babyai import QWEN25_7B

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
              "seconds": {}}
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
        elif variant in ("init_device", "init_host"):
            from agentrl_jax.models.llama import init_model

            model = init_model(cfg, 0, mesh, initialise_on=variant.removeprefix("init_"))
            jax.block_until_ready(nnx.state(model))
            del model
        else:
            raise SystemExit(f"unknown variant {variant!r}")
        report["seconds"][variant] = time.perf_counter() - t0
        what = "created" if variant.startswith("init_") else "compiled"
        print(f"{args.shape} {variant}: {what} in {report['seconds'][variant]:.1f} s on "
              f"{report['device']}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
