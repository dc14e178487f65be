"""Decode-step attention kernel sweep: the ragged Pallas kernel's tiling against the dense XLA
attention, at the engine's decode shapes.

    python benchmarks/contenders/decode_attention.py --json out.json          # on a GPU
    python benchmarks/contenders/decode_attention.py --small                   # CPU smoke run (interpreter)

For each model shape (SmolLM2-135M: 3 KV heads x 3 query heads per group, head dim 64;
Qwen2.5-1.5B: 2 x 6, head dim 128), batch ``--batch`` slots whose lengths are drawn uniformly
from ``[--min-len, --max-len]`` in a cache row of ``--row`` positions, the script times one
layer's decode attention ``[B, H, Dh]`` x ``[B, K, S, Dh]`` for the dense attention and for the
ragged kernel at every tiling of the grid (``block_k`` x ``k_splits`` x ``num_warps`` x
``num_stages``), ``--reps`` calls inside one jitted ``fori_loop`` (so launch overhead is
excluded), and reports microseconds per call and the bandwidth it reaches over the valid KV
bytes (``sum_b len_b x K x Dh x 2 (k, v) x 2 bytes``), against the roofline of those bytes /
``--bandwidth`` (by default a device copy measured in this process,
``benchmarks/speed/copy_bandwidth.py``; or a number in B/s). Every tiling's output is checked
against the dense attention before it is timed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks.speed.copy_bandwidth import (  # noqa: E402
    add_bandwidth_arguments, describe_bandwidth, resolve_bandwidth)

SHAPES = {"smollm2-135m": dict(kv_heads=3, group=3, head_dim=64),
          "qwen2.5-1.5b": dict(kv_heads=2, group=6, head_dim=128)}


def valid_tilings(row: int, block_ks, splits, warps, stages):
    for bk, ks, nw, ns in itertools.product(block_ks, splits, warps, stages):
        if row % ks or (row // ks) % bk or row // ks < 16:
            continue
        yield dict(block_k=bk, k_splits=ks, num_warps=nw, num_stages=ns)


def time_fn(fn, q, k, v, lengths, reps: int) -> float:
    """Seconds per call of ``fn(q, k, v, lengths)``, ``reps`` chained calls in one jit."""
    import jax
    import jax.numpy as jnp

    @jax.jit
    def loop(q, k, v, lengths):
        def body(_, carry):
            q, acc = carry
            out = fn(q, k, v, lengths)
            # a data dependency between calls (the next query depends on this output)
            return q + (out[:, :1, :1] * 0).astype(q.dtype), acc + out[0, 0, 0].astype(jnp.float32)
        return jax.lax.fori_loop(0, reps, body, (q, jnp.float32(0)))[1]

    loop(q, k, v, lengths).block_until_ready()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        loop(q, k, v, lengths).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return best / reps


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--row", type=int, default=384, help="cache row length S")
    p.add_argument("--min-len", type=int, default=256)
    p.add_argument("--max-len", type=int, default=384)
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--block-k", default="32,64,128")
    p.add_argument("--splits", default="1,2,3,4,6,8,12,16")
    p.add_argument("--warps", default="2,4,8")
    p.add_argument("--stages", default="1,2,3")
    add_bandwidth_arguments(p, default_copy_bytes=4e9)  # --small copies 1e7
    p.add_argument("--small", action="store_true", help="CPU smoke run (Pallas interpreter)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.gpu.decode_attention import mqa

    from agentrl_jax.kernels.decode_attention import dense_decode_attention

    interpret = args.small or jax.default_backend() != "gpu"
    if args.small:
        args.batch, args.row, args.min_len, args.max_len, args.reps = 4, 64, 8, 64, 2
        args.block_k, args.splits, args.warps, args.stages = "16,32", "1,2", "4", "2"
    args.bandwidth, bandwidth_note = resolve_bandwidth(
        args.bandwidth, args.copy_bytes or (1e7 if args.small else 4e9))
    print(describe_bandwidth(bandwidth_note), flush=True)
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    report: dict[str, Any] = {"device": str(jax.devices()[0].device_kind),
                              "jax": jax.__version__, "args": vars(args),
                              "bandwidth": bandwidth_note, "shapes": {}}
    rng = np.random.default_rng(0)
    for shape in args.shapes.split(","):
        kh, g, dh = (SHAPES[shape][k] for k in ("kv_heads", "group", "head_dim"))
        b, s = args.batch, args.row
        q = jnp.asarray(rng.standard_normal((b, kh * g, dh)), jnp.bfloat16)
        k = jnp.asarray(rng.standard_normal((b, kh, s, dh)), jnp.bfloat16)
        v = jnp.asarray(rng.standard_normal((b, kh, s, dh)), jnp.bfloat16)
        lengths = jnp.asarray(rng.integers(args.min_len, args.max_len + 1, size=b), jnp.int32)
        valid_bytes = int(np.asarray(lengths).sum()) * kh * dh * 2 * 2
        reference = np.asarray(dense_decode_attention(q, k, v, lengths), np.float32)

        def ragged(tiling):
            def fn(q, k, v, lengths):
                out = mqa(q.reshape(b * kh, g, dh), k.reshape(b * kh, s, dh),
                          v.reshape(b * kh, s, dh), kv_seq_len=jnp.repeat(lengths, kh),
                          sm_scale=dh ** -0.5, block_h=16, interpret=interpret, **tiling)
                return out.reshape(b, kh * g, dh)
            return fn

        rows = []
        t = time_fn(dense_decode_attention, q, k, v, lengths, args.reps)
        rows.append({"kernel": "dense", "us": 1e6 * t, "GBps": valid_bytes / t / 1e9})
        for tiling in valid_tilings(s, ints(args.block_k), ints(args.splits), ints(args.warps),
                                    ints(args.stages)):
            fn = ragged(tiling)
            try:
                out = np.asarray(jax.jit(fn)(q, k, v, lengths), np.float32)
                err = float(np.abs(out - reference).max())
                if err > 0.05:
                    rows.append({"kernel": "ragged", **tiling, "error": f"max abs diff {err}"})
                    continue
                t = time_fn(fn, q, k, v, lengths, args.reps)
            except Exception as e:  # a tiling Triton cannot compile (shared memory etc.)
                rows.append({"kernel": "ragged", **tiling, "error": repr(e)[:200]})
                continue
            rows.append({"kernel": "ragged", **tiling, "us": 1e6 * t,
                         "GBps": valid_bytes / t / 1e9, "max_abs_diff": err})
        timed = sorted((r for r in rows if "us" in r), key=lambda r: r["us"])
        report["shapes"][shape] = {"valid_kv_bytes": valid_bytes,
                                   "roofline_us": 1e6 * valid_bytes / args.bandwidth,
                                   "rows": rows, "best": timed[0] if timed else None}
        print(f"# {shape}: B={b} K={kh} G={g} Dh={dh} S={s}, valid KV "
              f"{valid_bytes / 1e6:.1f} MB, roofline {1e6 * valid_bytes / args.bandwidth:.1f} us")
        for r in timed[:8] + [r for r in rows if r["kernel"] == "dense"]:
            name = r["kernel"] if r["kernel"] == "dense" else (
                f"bk={r['block_k']} ks={r['k_splits']} w={r['num_warps']} st={r['num_stages']}")
            print(f"  {name:<28} {r['us']:8.2f} us  {r['GBps']:7.0f} GB/s", flush=True)
        failed = [r for r in rows if "error" in r]
        if failed:
            print(f"  ({len(failed)} tilings failed: {failed[0]['error'][:100]})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
