"""Attention for packed learner rows: forward + backward time of each implementation on one
shape, side by side in one process (GPU).

    python benchmarks/contenders/packed_attention.py                      # SmolLM2 heads, 8 x 3072, bf16
    python benchmarks/contenders/packed_attention.py --batch 8 --length 4096 --heads 9 --kv-heads 3

Rows: ``cudnn_causal`` (jax.nn.dot_product_attention, cuDNN, causal, no segments: the
unpacked learner's attention, a lower bound), ``xla_masked`` (XLA with a [B, 1, T, T] segment
mask), ``chunked`` / ``chunked512`` (models/attention.py, pure JAX blockwise, blocks of 128 /
512), ``pallas`` (kernels/flash_attention.py, JAX's Triton flash attention with segment ids),
``pallas_segments`` (kernels/segment_attention.py: ours, skipping the blocks between packed
sequences). Each row packs four sequences per row (``--segments``). Times: median of ``--repeats`` calls after a warm-up, synchronised.
Each row also reports its largest absolute difference from ``xla_masked`` computed in float32 at
``HIGHEST`` matmul precision (output and the three gradients of the benchmark's loss), so a
kernel that is fast but wrong on the device shows it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--length", type=int, default=3072)
    p.add_argument("--heads", type=int, default=9)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--impls", default="cudnn_causal,xla_masked,chunked,chunked512,pallas,"
                   "pallas_segments")
    p.add_argument("--segments", type=int, default=4, help="packed sequences per row")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"),
                   help="q, k, v dtype (the learner's packed pass runs in its param dtype)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    import jax
    import jax.numpy as jnp
    import numpy as np

    from agentrl_jax.models.attention import chunked_causal_attention
    from agentrl_jax.kernels.flash_attention import pallas_causal_attention
    from agentrl_jax.kernels.segment_attention import segment_causal_attention

    b, t, h, kh, d = args.batch, args.length, args.heads, args.kv_heads, args.head_dim
    rng = np.random.default_rng(0)
    dtype = jnp.dtype(args.dtype)
    q = jnp.asarray(rng.normal(size=(b, t, h, d)), dtype)
    k = jnp.asarray(rng.normal(size=(b, t, kh, d)), dtype)
    v = jnp.asarray(rng.normal(size=(b, t, kh, d)), dtype)
    n = args.segments
    seg = jnp.asarray(np.repeat(np.arange(1, n + 1), -(-t // n))[:t][None].repeat(b, 0),
                      jnp.int32)

    def xla_masked(q, k, v):
        mask = jnp.tril(jnp.ones((t, t), jnp.bool_))[None, None] & (
            seg[:, None, :, None] == seg[:, None, None, :])
        return jax.nn.dot_product_attention(q, k, v, mask=mask)

    impls = {
        "cudnn_causal": lambda q, k, v: jax.nn.dot_product_attention(
            q, k, v, is_causal=True, implementation="cudnn"),
        "xla_masked": xla_masked,
        "chunked": lambda q, k, v: chunked_causal_attention(q, k, v, segment_ids=seg,
                                                            block_size=128),
        "chunked512": lambda q, k, v: chunked_causal_attention(q, k, v, segment_ids=seg,
                                                               block_size=512),
        "pallas": lambda q, k, v: pallas_causal_attention(q, k, v, seg),
        "pallas_segments": lambda q, k, v: segment_causal_attention(q, k, v, seg),
    }
    def loss_and_grads(fn):
        return jax.jit(jax.value_and_grad(
            lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32) ** 2), argnums=(0, 1, 2)))

    with jax.default_matmul_precision("highest"):  # the reference: float32, full precision
        f32 = [x.astype(jnp.float32) for x in (q, k, v)]
        ref_out = jax.jit(xla_masked)(*f32)
        ref_grads = loss_and_grads(xla_masked)(*f32)[1]
    rows, errors = {}, {}
    print(f"device {jax.devices()[0].device_kind}; q [{b}, {t}, {h}, {d}] {args.dtype}, "
          f"kv heads {kh}, {n} sequences a row", flush=True)
    for name in args.impls.split(","):
        fn = impls[name]
        step = loss_and_grads(fn)
        try:
            out = jax.jit(fn)(q, k, v).astype(jnp.float32)
            grads = step(q, k, v)[1]
            errors[name] = {"out": float(jnp.max(jnp.abs(out - ref_out))),
                            **{f"d{x}": float(jnp.max(jnp.abs(g.astype(jnp.float32) - r)))
                               for x, g, r in zip("qkv", grads, ref_grads)}}
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                jax.block_until_ready(step(q, k, v))
                times.append(time.perf_counter() - t0)
            rows[name] = statistics.median(times) * 1e3
            err = errors[name]
            print(f"{name:15s} fwd+bwd {rows[name]:8.2f} ms; max |diff| from the f32 reference: "
                  + ", ".join(f"{k} {v:.2e}" for k, v in err.items()), flush=True)
        except Exception as e:  # noqa: BLE001 -- report and go on with the other rows
            rows[name] = None
            errors.setdefault(name, None)
            print(f"{name:14s} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": jax.devices()[0].device_kind, "shape": [b, t, h, kh, d],
                       "dtype": args.dtype, "segments": n, "ms": rows,
                       "max_abs_diff_from_f32_reference": errors}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
