"""Weight sync to one engine replica per device: per-replica transfers vs one all-gather.

    python benchmarks/contenders/weight_sync.py --shape qwen2.5-1.5b
    python benchmarks/contenders/weight_sync.py --shape qwen2.5-7b --repeats 3 --json out.json

The learner's parameters (random, cast to bfloat16 as the engines keep them) are sharded FSDP over
all local devices; each device runs one single-device engine replica that needs a whole copy.
``transfers``: each replica ``jax.device_put``s the sharded state onto its device (what
``EngineReplicas.update_weights`` did, one thread per replica; JAX copies a sharded array onto
another single device through host memory); ``all_gather``: ``gather_to_replicas``, one
compiled all-gather over the devices. Both in the same process, alternating; the first call of
each is a warm-up (compilation); reports the median seconds and the ratio.
On CPU, ``XLA_FLAGS=--xla_force_host_platform_device_count=4`` gives 4 virtual devices (a
smoke test: both paths are host copies there).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", default="qwen2.5-1.5b")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default=None)
    args = p.parse_args()

    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from agentrl_jax.models.config import ModelConfig
    from agentrl_jax.models.llama import init_model
    from agentrl_jax.rollout.engine.replicas import gather_to_replicas
    from agentrl_jax.sharding.mesh import make_mesh
    from benchmarks.speed.init_compile import shapes

    devices = jax.local_devices()
    if len(devices) < 2:
        raise SystemExit("needs at least 2 local devices")
    cfg = ModelConfig(**shapes()[args.shape])
    model = init_model(cfg, 0, make_mesh(fsdp=len(devices), devices=devices))
    state = jax.tree.map(lambda x: x.astype(jnp.bfloat16), nnx.state(model, nnx.Param))
    del model
    jax.block_until_ready(state)
    nbytes = sum(x.nbytes for x in jax.tree.leaves(state))
    targets = [NamedSharding(Mesh(np.array([d], dtype=object), ("replica",)), PartitionSpec())
               for d in devices]
    pool = ThreadPoolExecutor(len(devices))

    def transfers():
        copies = list(pool.map(lambda s: jax.device_put(state, s), targets))
        jax.block_until_ready(copies)

    def all_gather():
        copies = gather_to_replicas(state, [[d] for d in devices], on_cpu=True)
        assert copies is not None
        jax.block_until_ready(copies)

    times: dict[str, list[float]] = {"transfers": [], "all_gather": []}
    for round_ in range(args.repeats + 1):
        for name, fn in (("transfers", transfers), ("all_gather", all_gather)):
            t0 = time.perf_counter()
            fn()
            if round_:
                times[name].append(time.perf_counter() - t0)
    median = {k: statistics.median(v) for k, v in times.items()}
    report = {"shape": args.shape, "device": f"{devices[0].device_kind} x {len(devices)}",
              "state_gib": nbytes / 2 ** 30, "seconds": median, "all": times,
              "speedup": median["transfers"] / median["all_gather"]}
    print(f"{args.shape} ({nbytes / 2 ** 30:.2f} GiB bf16) to {len(devices)} replicas on "
          f"{report['device']}: transfers {median['transfers']:.3f} s, all-gather "
          f"{median['all_gather']:.3f} s ({report['speedup']:.1f}x)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
