"""The sampler's log-sum-exp + max + argmax over ``[B, V]`` float32 logits: one variadic
reduction (``sampling.logsumexp_and_argmax``, what GPU engines use) vs XLA's separate reductions
(``sampling.logsumexp_and_argmax_separate``, what CPU engines keep), side by side on the
default JAX device.

    python3 benchmarks/contenders/sampler_reduction.py                      # V = 49152 (SmolLM2)
    python3 benchmarks/contenders/sampler_reduction.py --vocab 151936 --batches 256

Reported: milliseconds per jitted call (mean of ``--reps`` after one warm-up) and the ratio.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--batches", default="16,64,256")
    p.add_argument("--reps", type=int, default=50)
    args = p.parse_args(argv)

    import jax
    import jax.numpy as jnp

    from agentrl_jax.rollout.engine.sampling import logsumexp_and_argmax, logsumexp_and_argmax_separate

    one_pass = jax.jit(lambda x: logsumexp_and_argmax(x, x))
    separate = jax.jit(lambda x: logsumexp_and_argmax_separate(x, x))

    def timed(fn, x) -> float:
        jax.block_until_ready(fn(x))
        t0 = time.perf_counter()
        for _ in range(args.reps):
            out = fn(x)
        jax.block_until_ready(out)
        return (time.perf_counter() - t0) / args.reps * 1e3

    rows = []
    print(f"device {jax.devices()[0].device_kind}, vocab {args.vocab}")
    for b in (int(v) for v in args.batches.split(",")):
        x = jnp.asarray(np.random.default_rng(0).standard_normal((b, args.vocab), np.float32))
        one, sep = timed(one_pass, x), timed(separate, x)
        rows.append({"batch": b, "one_pass_ms": one, "separate_ms": sep})
        print(f"batch {b:4d}: one pass {one:8.3f} ms, separate {sep:8.3f} ms, "
              f"one pass / separate {one / sep:.2f}x")
    return rows


if __name__ == "__main__":
    main()
