"""The decode step's GEMMs at batch 256: XLA (default autotuning, cuBLAS only, exhaustive
tiling search) vs the Pallas skinny matmul (``benchmarks/contenders/skinny_matmul.py``) over a tiling sweep.

    python benchmarks/contenders/decode_gemm.py --shape smollm2-135m,qwen2.5-1.5b --json out.json  # GPU
    python benchmarks/contenders/decode_gemm.py --small                                           # CPU smoke

For each model shape (``benchmarks/speed/engine.py``'s ``SHAPES``) the GEMMs of one decode step:
``qkv`` (``[M, D] @ [D, (H + 2K) Dh]``, the q/k/v projections as XLA merges them), ``o``,
``gate_up`` (merged), ``down`` and ``lm_head``, with ``M = --batch`` rows, bf16 in and out.
Each contender runs ``L`` independent GEMMs (distinct inputs and weights, so nothing stays in
L2 and XLA cannot merge them) inside a ``fori_loop`` of ``--iters`` iterations (device-side
timing, see :func:`time_loop`); the time per GEMM is the median call time, less the same loop
without GEMMs, / (iterations x ``L``). Bandwidth = (weights + input + output bytes) / time;
a GEMM's bandwidth roofline is those bytes / ``--bandwidth`` (by default a device copy
measured in this process, ``benchmarks/speed/copy_bandwidth.py``; or a number in B/s). A
Pallas tiling is timed only after its output matches XLA's on the same inputs (relative max
error <= 2e-2, bf16).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from typing import Any, Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks.speed.copy_bandwidth import (  # noqa: E402
    add_bandwidth_arguments, describe_bandwidth, resolve_bandwidth)
from benchmarks.speed.engine import SHAPES  # noqa: E402

# (block_m, block_n, block_k, splits, num_warps, num_stages)
TILINGS = [
    (256, 64, 64, 1, 4, 3), (256, 64, 64, 1, 8, 4), (256, 128, 64, 1, 8, 3),
    (256, 32, 64, 1, 4, 4), (128, 128, 64, 1, 4, 3), (128, 64, 64, 1, 4, 4),
    (128, 64, 128, 1, 4, 3), (64, 128, 64, 1, 4, 4), (64, 64, 64, 1, 4, 4),
    (64, 64, 128, 1, 4, 3), (128, 64, 64, 2, 4, 4), (64, 64, 64, 4, 4, 4),
    (256, 64, 64, 2, 8, 3), (128, 128, 64, 4, 4, 3),
]
SMALL_TILINGS = [(16, 32, 32, 1, 4, 3), (32, 32, 16, 2, 4, 3)]


def gemms(shape: dict[str, Any]) -> dict[str, tuple[int, int, int]]:
    """``name -> (K, N, per_step)``: each GEMM's contracting / output width and how many
    times a decode step runs it."""
    d, h, kv, dh = (shape["hidden_size"], shape["num_heads"], shape["num_kv_heads"],
                    shape["head_dim"])
    layers, inter = shape["num_layers"], shape["intermediate_size"]
    return {"qkv": (d, (h + 2 * kv) * dh, layers), "o": (h * dh, d, layers),
            "gate_up": (d, 2 * inter, layers), "down": (inter, d, layers),
            "lm_head": (d, shape["vocab_size"], 1)}


def split_k_dot(splits: int) -> Callable:
    """``x [M, K] @ w [K, N]`` as ``splits`` K-slices in one batched GEMM (``[splits, M, N]``
    float32 partials) summed in XLA: more thread blocks for a GEMM with few output tiles."""
    import jax.numpy as jnp

    def dot(x, w):
        m, k = x.shape
        parts = jnp.einsum("msk,skn->smn", x.reshape(m, splits, k // splits),
                           w.reshape(splits, k // splits, w.shape[1]),
                           preferred_element_type=jnp.float32)
        return parts.sum(axis=0).astype(x.dtype)
    return dot


def time_loop(matmul: Callable, xs: tuple, ws: tuple, repeats: int, iters: int,
              options: dict | None = None) -> float:
    """Seconds per ``matmul`` call, timed on the device: ``iters`` iterations of a
    ``fori_loop`` (one CUDA graph per iteration, no host launches) each running ``matmul`` on
    every ``(x, w)`` pair; each x's element [0, 0] takes the previous output's [0, 0] so the
    GEMMs depend on the loop (nothing is hoisted). The same loop without the GEMMs is timed and
    subtracted. Median of ``repeats`` calls."""
    import jax
    from jax import lax

    def loop(with_gemm: bool):
        def run(xs, ws):
            ys0 = tuple(jax.numpy.zeros((x.shape[0], w.shape[1]), x.dtype)
                        for x, w in zip(xs, ws))

            def body(_, carry):
                xs, ys = carry
                xs = tuple(x.at[0, 0].set(y[0, 0]) for x, y in zip(xs, ys))
                if with_gemm:
                    ys = tuple(matmul(x, w) for x, w in zip(xs, ws))
                else:
                    ys = tuple(y.at[0, 0].set(x[0, 0]) for x, y in zip(xs, ys))
                return xs, ys

            return lax.fori_loop(0, iters, body, (xs, ys0))
        return jax.jit(run, compiler_options=options) if options else jax.jit(run)

    def median(fn) -> float:
        for _ in range(2):
            jax.block_until_ready(fn(xs, ws))
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            jax.block_until_ready(fn(xs, ws))
            times.append(time.perf_counter() - start)
        return float(np.median(times))

    return max(median(loop(True)) - median(loop(False)), 0.0) / (iters * len(xs))


def bench_gemm(m: int, k: int, n: int, tilings: list[tuple], args, deadline: float
               ) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    from benchmarks.contenders.skinny_matmul import MatmulTiling, skinny_matmul

    interpret = args.small
    w_bytes = k * n * 2
    copies = int(min(64, max(2, math.ceil(args.min_bytes / w_bytes))))
    keys = jax.random.split(jax.random.PRNGKey(0), 2 * copies)
    xs = tuple(jax.random.normal(keys[i], (m, k), jnp.bfloat16) for i in range(copies))
    ws = tuple((jax.random.normal(keys[copies + i], (k, n), jnp.float32) * k ** -0.5
                ).astype(jnp.bfloat16) for i in range(copies))
    moved = copies * (w_bytes + 2 * m * k + 2 * m * n)
    row: dict[str, Any] = dict(m=m, k=k, n=n, copies=copies, weight_bytes=w_bytes,
                               roofline_us=(w_bytes + 2 * m * k + 2 * m * n)
                               / args.bandwidth * 1e6, variants={})

    def record(name: str, seconds: float) -> None:
        row["variants"][name] = dict(us=seconds * 1e6, gbps=moved / copies / seconds / 1e9
                                     if seconds > 0 else None)

    ref_out = jax.jit(lambda xs, ws: tuple(jnp.dot(x, w) for x, w in zip(xs, ws)))(xs, ws)
    record("xla", time_loop(jnp.dot, xs, ws, args.repeats, args.iters))
    if not args.small:
        for name, options in (("xla_cublas", {"xla_gpu_enable_triton_gemm": False}),):
            try:
                record(name, time_loop(jnp.dot, xs, ws, args.repeats, args.iters, options))
            except Exception as e:  # noqa: BLE001 - a failed contender is reported, not fatal
                row["variants"][name] = dict(error=f"{type(e).__name__}: {str(e)[:200]}")
    ref0 = np.asarray(ref_out[0], np.float32)
    cublas = {"xla_gpu_enable_triton_gemm": False}
    for splits in (2, 4) if k >= 2 * n else ():  # K-heavy GEMMs (the down projection)
        name = f"xla_cublas_splitk{splits}"
        if k % splits or args.small:
            continue
        out0 = np.asarray(jax.jit(split_k_dot(splits), compiler_options=cublas)(xs[0], ws[0]),
                          np.float32)
        err = float(np.abs(out0 - ref0).max() / max(np.abs(ref0).max(), 1e-6))
        if err > 2e-2:
            row["variants"][name] = dict(error=f"mismatch vs XLA: rel max err {err:.3g}")
            continue
        record(name, time_loop(split_k_dot(splits), xs, ws, args.repeats, args.iters, cublas))
    for t in tilings:
        tiling = MatmulTiling(*t)
        name = "pallas_" + "_".join(map(str, t))
        if not tiling.fits(m, k, n):
            continue
        if time.perf_counter() > deadline:
            row["variants"][name] = dict(error="skipped: deadline")
            continue
        fn = jax.jit(lambda xs, ws, tiling=tiling: tuple(
            skinny_matmul(x, w, tiling, interpret=interpret) for x, w in zip(xs, ws)))
        try:
            out0 = np.asarray(fn(xs, ws)[0], np.float32)
            err = float(np.abs(out0 - ref0).max() / max(np.abs(ref0).max(), 1e-6))
            if err > 2e-2:
                row["variants"][name] = dict(error=f"mismatch vs XLA: rel max err {err:.3g}")
                continue
            record(name, time_loop(
                lambda x, w, tiling=tiling: skinny_matmul(x, w, tiling, interpret=interpret),
                xs, ws, args.repeats, args.iters))
            row["variants"][name]["rel_err"] = err
        except Exception as e:  # noqa: BLE001
            row["variants"][name] = dict(error=f"{type(e).__name__}: {str(e)[:200]}")
    if args.exhaustive and time.perf_counter() < deadline:
        try:
            record("xla_exhaustive", time_loop(
                jnp.dot, xs, ws, args.repeats, args.iters,
                {"xla_gpu_exhaustive_tiling_search": True}))
        except Exception as e:  # noqa: BLE001
            row["variants"]["xla_exhaustive"] = dict(error=f"{type(e).__name__}: {str(e)[:200]}")
    timed = {k: v for k, v in row["variants"].items() if "us" in v}
    best = min((k for k in timed if k.startswith("pallas")), key=lambda k: timed[k]["us"],
               default=None)
    row["best_pallas"] = best
    return row


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="smollm2-135m,qwen2.5-1.5b")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--small", action="store_true", help="CPU smoke run: tiny shape, interpreter")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--iters", type=int, default=20, help="loop iterations per timed call")
    p.add_argument("--min-bytes", type=float, default=256e6,
                   help="weights per timed call (distinct copies, so they come from HBM)")
    add_bandwidth_arguments(p, default_copy_bytes=4e9)  # --small copies 1e7
    p.add_argument("--exhaustive", action="store_true",
                   help="also XLA with --xla_gpu_exhaustive_tiling_search (slow to compile)")
    p.add_argument("--deadline-s", type=float, default=480.0,
                   help="skip remaining contenders after this many seconds")
    p.add_argument("--gemms", default="", help="comma list (qkv,o,gate_up,down,lm_head); "
                                                   "empty: all")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    import jax

    start = time.perf_counter()
    deadline = start + args.deadline_s
    shapes = ["tiny"] if args.small else args.shape.split(",")
    batch = 32 if args.small else args.batch
    if args.small:
        args.min_bytes, args.repeats, args.iters = 0, 2, 2
    tilings = SMALL_TILINGS if args.small else TILINGS
    args.bandwidth, bandwidth_note = resolve_bandwidth(
        args.bandwidth, args.copy_bytes or (1e7 if args.small else 4e9))
    print(describe_bandwidth(bandwidth_note), flush=True)
    dev = jax.devices()[0]
    result: dict[str, Any] = dict(device=f"{dev.platform}:{getattr(dev, 'device_kind', '')}",
                                  jax=jax.__version__, host=platform.node(), batch=batch,
                                  bandwidth=args.bandwidth, bandwidth_source=bandwidth_note,
                                  shapes={})
    for shape in shapes:
        rows = {}
        print(f"# {shape}: batch {batch}, {dev.platform}:{getattr(dev, 'device_kind', '')}")
        print(f"| gemm | K x N | roofline us | xla us | cublas us | cublas split-K 2 / 4 us |"
              f" best pallas us (tiling) | exhaustive us |")
        for name, (k, n, per_step) in gemms(SHAPES[shape]).items():
            if args.gemms and name not in args.gemms.split(","):
                continue
            row = bench_gemm(batch, k, n, tilings, args, deadline)
            row["per_step"] = per_step
            rows[name] = row
            v = row["variants"]
            us = lambda key: f"{v[key]['us']:.2f}" if "us" in v.get(key, {}) else "-"  # noqa
            best = row["best_pallas"]
            print(f"| {name} | {k} x {n} | {row['roofline_us']:.2f} | {us('xla')} | "
                  f"{us('xla_cublas')} | {us('xla_cublas_splitk2')} / "
                  f"{us('xla_cublas_splitk4')} | {us(best) if best else '-'} "
                  f"({best or 'none'}) | {us('xla_exhaustive')} |", flush=True)
        step = {}
        for key in ("roofline", "xla", "best"):
            total = 0.0
            for row in rows.values():
                v = row["variants"]
                if key == "roofline":
                    us_ = row["roofline_us"]
                elif key == "xla":
                    us_ = v["xla"]["us"]
                else:
                    us_ = min(x["us"] for x in v.values() if "us" in x)
                total += us_ * row["per_step"]
            step[key + "_ms"] = total / 1e3
        print(f"GEMM time per decode step: roofline {step['roofline_ms']:.3f} ms, XLA "
              f"{step['xla_ms']:.3f} ms, best contender per GEMM {step['best_ms']:.3f} ms")
        result["shapes"][shape] = dict(gemms=rows, step=step)
    result["wall_s"] = time.perf_counter() - start
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
