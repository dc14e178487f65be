"""GAE benchmark: per-token Python loop vs lax.scan vs associative scan vs blocked
two-level scan vs Pallas (Triton) kernels, side by side in one process.

Every variant computes the same thing as verl's ``compute_gae_advantage_return``
(multi-turn version): given token-level rewards ``r``, values ``V`` and the loss mask
``m`` (all ``[B, T]`` float32, observation spans in the middle of each row), return
``whiten(A over m)`` and ``returns = A + V``. Variants:

  torch_loop     verl's per-token loop in PyTorch on the same GPU (skipped without
                 torch + CUDA); the "x vs loop" column uses it when present
  loop           the same loop over jax.numpy column ops, dispatched eagerly
  scan           ``jax.lax.scan`` over time, jitted (inputs transposed to time-major
                 inside, as Tunix does)
  scan_tmajor    the same scan on inputs that are already time-major ``[T, B]``
                 (transposes excluded: shows what the layout costs)
  associative    ``lax.associative_scan`` (next-value scan + advantage scan), jitted
  blocked        ours: blocked two-level scan (chunked masked reduce + carry level),
                 jitted; the default ``method="auto"`` of ``compute_advantages``
  pallas         ours: two Pallas/Triton kernels + fused whitening (GPU only; on CPU it
                 runs in interpret mode for small sizes as a correctness check, and
                 ``--check-lowering`` verifies the Triton lowering without a GPU)

Timing: after warm-up (compile), ``median`` of per-call wall time with
``block_until_ready`` (includes dispatch + host sync), and ``pipelined``: N calls
issued back to back then one ``block_until_ready``, divided by N (closer to device
time for small kernels). Memory-bandwidth floor: read r, V, m + write A, returns =
20 bytes/token, divided by ``--bandwidth`` (by default a device copy measured in this process,
``benchmarks/speed/copy_bandwidth.py``; or a number in B/s: the 3.0e12 this script used to
assume for an H100 was never measured).

    python benchmarks/contenders/advantages.py --batch 256 --time 4096 --repeats 50 --json out.json
    # on the GPU, to tune: --blocked-chunks 32,128 --pallas-sweep
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from agentrl_jax.algorithms.gae import gae_advantages_raw  # noqa: E402
from agentrl_jax.algorithms.masked import masked_whiten  # noqa: E402
from benchmarks.speed.copy_bandwidth import (  # noqa: E402
    add_bandwidth_arguments, describe_bandwidth, resolve_bandwidth)
from benchmarks.speed.devtime import device_time  # noqa: E402

BYTES_PER_TOKEN = 4 * 5  # r, V, m in; A, returns out (float32)


# --------------------------------------------------------------------------- data


def make_inputs(B: int, T: int, seed: int = 0):
    """Random multi-turn batch: prompt, alternating generated / observation spans,
    padding; outcome reward on each row's last generated token plus small per-token
    rewards; float32 ``[B, T]`` arrays."""
    rng = np.random.default_rng(seed)
    m = np.zeros((B, T), np.float32)
    for b in range(B):
        t = int(rng.integers(8, max(9, T // 8)))
        end = T - int(rng.integers(0, max(1, T // 16)))
        gen = True
        while t < end:
            n = int(rng.integers(4, 96)) if gen else int(rng.integers(4, 64))
            if gen:
                m[b, t : min(t + n, end)] = 1.0
            t += n
            gen = not gen
    r = (rng.normal(size=(B, T)) * 0.01).astype(np.float32) * m
    for b in range(B):
        idx = np.nonzero(m[b])[0]
        if idx.size:
            r[b, idx[-1]] += rng.normal()
    V = rng.normal(size=(B, T)).astype(np.float32)
    return r, V, m


# --------------------------------------------------------------------------- variants


def gae_python_loop(r, V, m, gamma: float, lam: float):
    """verl's ``compute_gae_advantage_return`` transcribed to jax.numpy, eager.

    Columns are read with ``lax.dynamic_index_in_dim`` and a device index, so every step
    dispatches the same already-compiled ops (a Python-int ``r[:, t]`` would compile a new
    static slice for each ``t``, timing XLA's compiler instead of the loop)."""
    B, T = r.shape
    nextvalues = jnp.zeros((B,), jnp.float32)
    lastgaelam = jnp.zeros((B,), jnp.float32)
    advantages_reversed = []

    def col(x, t):
        return jax.lax.dynamic_index_in_dim(x, t, axis=1, keepdims=False)

    for t in reversed(range(T)):
        ti = jnp.int32(t)
        r_t, v_t, m_t = col(r, ti), col(V, ti), col(m, ti)
        delta = r_t + gamma * nextvalues - v_t
        lastgaelam_ = delta + gamma * lam * lastgaelam
        nextvalues = v_t * m_t + (1 - m_t) * nextvalues
        lastgaelam = lastgaelam_ * m_t + (1 - m_t) * lastgaelam
        advantages_reversed.append(lastgaelam)
    A = jnp.stack(advantages_reversed[::-1], axis=1)
    returns = A + V
    return masked_whiten(A, m), returns


def time_torch_loop(r_np, V_np, m_np, gamma: float, lam: float, repeats: int, device: str = "cuda"):
    """verl's per-token GAE loop in PyTorch on the same GPU (the reference system's own
    framework): ``for t in reversed(range(T))`` over CUDA column ops, then masked whitening.
    Returns ``(timing dict, (whitened advantages, returns) as numpy)`` or raises ImportError /
    RuntimeError without torch + CUDA."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("no CUDA device for torch")
    dev = torch.device(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    r, V, m = (torch.from_numpy(x).to(dev) for x in (r_np, V_np, m_np))

    def gae():
        B, T = r.shape
        nextvalues = torch.zeros(B, device=dev)
        lastgaelam = torch.zeros(B, device=dev)
        adv_rev = []
        for t in reversed(range(T)):
            delta = r[:, t] + gamma * nextvalues - V[:, t]
            new_gae = delta + gamma * lam * lastgaelam
            nextvalues = V[:, t] * m[:, t] + (1 - m[:, t]) * nextvalues
            lastgaelam = new_gae * m[:, t] + (1 - m[:, t]) * lastgaelam
            adv_rev.append(lastgaelam)
        A = torch.stack(adv_rev[::-1], dim=1)
        ret = A + V
        n = m.sum()
        mean = (A * m).sum() / n
        var = (((A - mean) ** 2) * m).sum() / (n - 1)
        return (A - mean) * torch.rsqrt(var + 1e-8) * m, ret * m

    out = gae()
    sync()
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        out = gae()
        sync()
        times.append(time.perf_counter() - t0)
    res = {"median_ms": statistics.median(times) * 1e3, "min_ms": min(times) * 1e3, "repeats": len(times)}
    return res, tuple(o.cpu().numpy() for o in out)


def make_jitted(method: str, gamma: float, lam: float, chunk: int = 64):
    def f(r, V, m):
        A = gae_advantages_raw(r, V, m, gamma=gamma, lam=lam, method=method, chunk=chunk)
        return masked_whiten(A, m) * m, (A + V) * m

    return jax.jit(f)


def make_scan_time_major(gamma: float, lam: float):
    """lax.scan on inputs that are already [T, B] (returns [T, B])."""

    def f(rT, VT, mT):
        def step(carry, xs):
            last_adv, next_v = carry
            r_t, v_t, m_t = xs
            adv = r_t + gamma * next_v - v_t + gamma * lam * last_adv
            next_v = m_t * v_t + (1.0 - m_t) * next_v
            last_adv = m_t * adv + (1.0 - m_t) * last_adv
            return (last_adv, next_v), last_adv

        B = rT.shape[1]
        init = (jnp.zeros((B,), jnp.float32), jnp.zeros((B,), jnp.float32))
        _, AT = jax.lax.scan(step, init, (rT, VT, mT), reverse=True)
        return masked_whiten(AT, mT) * mT, (AT + VT) * mT

    return jax.jit(f)


def make_pallas(gamma: float, lam: float, interpret: bool, precision: str, **tile):
    from agentrl_jax.kernels.gae import gae_pallas_full

    def f(r, V, m):
        adv, ret, _ = gae_pallas_full(r, V, m, gamma=gamma, lam=lam, interpret=interpret, precision=precision, **tile)
        return adv, ret

    return f


# --------------------------------------------------------------------------- timing


def _block(x):
    return jax.block_until_ready(x)


def time_fn(fn: Callable, args, repeats: int, warmup: int = 2, pipelined: bool = True) -> dict:
    t0 = time.perf_counter()
    out = _block(fn(*args))
    first = time.perf_counter() - t0
    for _ in range(max(0, warmup - 1)):
        _block(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        _block(fn(*args))
        times.append(time.perf_counter() - t0)
    res = {
        "first_call_ms": first * 1e3,
        "median_ms": statistics.median(times) * 1e3,
        "min_ms": min(times) * 1e3,
        "repeats": repeats,
    }
    if pipelined:
        n = max(repeats, 10)
        t0 = time.perf_counter()
        outs = [fn(*args) for _ in range(n)]
        _block(outs)
        res["pipelined_ms"] = (time.perf_counter() - t0) / n * 1e3
    return res, out


# --------------------------------------------------------------------------- main


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--time", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--loop-repeats", type=int, default=1, help="repeats for the (slow) Python loop")
    ap.add_argument("--gamma", type=float, default=1.0)
    ap.add_argument("--lam", type=float, default=0.95)
    ap.add_argument(
        "--variants",
        default="torch_loop,loop,scan,scan_tmajor,associative,blocked,pallas",
        help="comma-separated subset of: torch_loop,loop,scan,scan_tmajor,associative,blocked,pallas",
    )
    ap.add_argument("--pallas-precision", default="ieee", choices=["ieee", "tf32x3"])
    ap.add_argument(
        "--interpret-max-tokens",
        type=int,
        default=1 << 16,
        help="without a GPU, run the Pallas kernels in interpret mode up to this many tokens",
    )
    ap.add_argument("--check-lowering", action="store_true", help="lower the Pallas kernels for CUDA (no GPU needed)")
    ap.add_argument(
        "--blocked-chunks", default="", help="extra chunk lengths for the blocked scan, e.g. 32,128 (rows blocked_L<n>)"
    )
    ap.add_argument(
        "--pallas-sweep",
        action="store_true",
        help="GPU: also time Pallas tile configs (block_rows x block_t x num_warps x precision), rows pallas_<cfg>",
    )
    ap.add_argument("--no-device-time", action="store_true", help="GPU: skip the profiler-trace device timing")
    ap.add_argument("--json", default=None, help="write results here")
    ap.add_argument("--seed", type=int, default=0)
    add_bandwidth_arguments(ap, default_copy_bytes=1e9)
    args = ap.parse_args(argv)

    B, T, g, lam = args.batch, args.time, args.gamma, args.lam
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    dev = jax.devices()[0]
    on_gpu = dev.platform == "gpu"
    bytes_moved = BYTES_PER_TOKEN * B * T
    bandwidth, bandwidth_note = resolve_bandwidth(
        args.bandwidth, args.copy_bytes or (1e9 if on_gpu else 1e7))
    print(describe_bandwidth(bandwidth_note), flush=True)
    floor_ms = bytes_moved / bandwidth * 1e3

    r_np, V_np, m_np = make_inputs(B, T, args.seed)
    r, V, m = (jax.device_put(x) for x in (r_np, V_np, m_np))
    _block((r, V, m))
    print(
        f"GAE benchmark  B={B} T={T} gamma={g} lam={lam}  device={dev.device_kind} ({dev.platform})  "
        f"jax={jax.__version__}  generated tokens={m_np.mean():.2f}"
    )

    results: dict[str, dict] = {}
    outputs: dict[str, tuple] = {}
    notes: dict[str, str] = {}

    def run(name, fn, fargs, repeats, pipelined=True, transform=None):
        try:
            res, out = time_fn(fn, fargs, repeats, pipelined=pipelined)
        except Exception as e:  # keep going: report the failure
            notes[name] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
            print(f"  {name}: {notes[name]}")
            return
        if transform is not None:
            out = transform(out)
        if on_gpu and not args.no_device_time:
            # device busy time from a profiler trace: the kernels alone, no dispatch / sync
            dt = device_time(lambda: fn(*fargs), calls=1 if name == "loop" else 10, top=6)
            if dt is not None:
                res["device_ms"] = dt["busy_ms"]
                res["device_span_ms"] = dt["span_ms"]
                res["device_kernels"] = dt["kernels"]
                res["kernels_per_call"] = dt["kernels_per_call"]
        results[name] = res
        outputs[name] = tuple(np.asarray(o) for o in out)
        dev_txt = f"  device {res['device_ms']:9.4f} ms ({res['kernels_per_call']:.0f} kernels)" if "device_ms" in res else ""
        print(f"  {name:28s} median {res['median_ms']:10.3f} ms{dev_txt}", flush=True)

    # lax.scan always runs: it is the reference for the error columns
    run("scan", make_jitted("scan", g, lam), (r, V, m), args.repeats)
    if "scan_tmajor" in variants:
        rT, VT, mT = (jnp.asarray(x.T) for x in (r_np, V_np, m_np))
        run("scan_tmajor", make_scan_time_major(g, lam), (rT, VT, mT), args.repeats, transform=lambda o: (o[0].T, o[1].T))
    if "associative" in variants:
        run("associative", make_jitted("associative", g, lam), (r, V, m), args.repeats)
    if "blocked" in variants:
        if lam > 0:
            run("blocked", make_jitted("blocked", g, lam), (r, V, m), args.repeats)
        else:
            notes["blocked"] = "skipped: lam == 0"
    for ch in [int(c) for c in args.blocked_chunks.split(",") if c.strip()]:
        if lam > 0:
            run(f"blocked_L{ch}", make_jitted("blocked", g, lam, chunk=ch), (r, V, m), args.repeats)
    if "pallas" in variants:
        from agentrl_jax.kernels import gae as pallas_gae

        if not pallas_gae.supported(g, lam):
            notes["pallas"] = "skipped: parameters outside the kernel's range (see pallas_gae.supported)"
        elif on_gpu:
            run("pallas", make_pallas(g, lam, False, args.pallas_precision), (r, V, m), args.repeats)
            if args.pallas_sweep:
                for br in (16, 32):
                    for bt in (32, 64, 128):
                        if not pallas_gae.supported(g, lam, bt):
                            continue
                        for nw in (2, 4, 8):
                            for prec in ("ieee", "tf32x3"):
                                cfg = dict(block_rows=br, block_t=bt, num_warps=nw)
                                run(f"pallas_{br}x{bt}_w{nw}_{prec}", make_pallas(g, lam, False, prec, **cfg), (r, V, m), args.repeats)
        elif B * T <= args.interpret_max_tokens:
            run("pallas", make_pallas(g, lam, True, args.pallas_precision), (r, V, m), min(args.repeats, 2), pipelined=False)
            if "pallas" in results:
                notes["pallas"] = "interpret mode on CPU: correctness only, time is not meaningful"
        else:
            notes["pallas"] = "skipped: no GPU (interpret mode too slow at this size)"
        if args.check_lowering:
            try:
                txt = pallas_gae.lower_for_gpu(B, T, gamma=g, lam=lam, precision=args.pallas_precision)
                notes["pallas_lowering"] = f"Triton lowering OK ({txt.count('xla.gpu.triton')} kernels)"
            except Exception as e:
                notes["pallas_lowering"] = f"Triton lowering FAILED: {type(e).__name__}: {e}"
            print(f"  {notes['pallas_lowering']}")
    if "torch_loop" in variants:
        try:
            res, out = time_torch_loop(r_np, V_np, m_np, g, lam, max(args.loop_repeats, 3))
            results["torch_loop"] = res
            outputs["torch_loop"] = out
            print(f"  {'torch_loop':28s} median {res['median_ms']:10.3f} ms", flush=True)
        except (ImportError, RuntimeError) as e:
            notes["torch_loop"] = f"skipped: {type(e).__name__}: {e}"
    if "loop" in variants:
        run("loop", lambda a, b, c: gae_python_loop(a, b, c, g, lam), (r, V, m), args.loop_repeats, pipelined=False)

    # errors vs the lax.scan reference (masked positions only; loop is unmasked at obs)
    ref = outputs.get("scan")
    for name, out in outputs.items():
        if ref is None:
            break
        results[name]["max_abs_err_adv"] = float(np.max(np.abs((out[0] - ref[0]) * m_np)))
        results[name]["max_abs_err_ret"] = float(np.max(np.abs((out[1] - ref[1]) * m_np)))

    loop_ms = results.get("torch_loop", results.get("loop", {})).get("median_ms")
    scan_ms = results.get("scan", {}).get("median_ms")
    fixed = ("torch_loop", "loop", "scan", "scan_tmajor", "associative", "blocked", "pallas")
    order = [v for v in fixed if v in results] + sorted(v for v in results if v not in fixed)
    print()
    hdr = (
        f"{'variant':28s} {'median ms':>11s} {'pipelined ms':>13s} {'device ms':>10s} {'x vs loop':>10s} {'x vs scan':>10s} "
        f"{'x floor':>8s} {'max|dA|':>9s} {'max|dR|':>9s}"
    )
    print(hdr)
    print("-" * len(hdr))
    for name in order:
        res = results[name]
        best = min(res["median_ms"], res.get("pipelined_ms", float("inf")))
        res["vs_loop"] = loop_ms / res["median_ms"] if loop_ms else None
        res["vs_scan"] = scan_ms / res["median_ms"] if scan_ms else None
        res["x_floor"] = best / floor_ms
        print(
            f"{name:28s} {res['median_ms']:11.3f} {res.get('pipelined_ms', float('nan')):13.3f} {res.get('device_ms', float('nan')):10.4f} "
            f"{(res['vs_loop'] or float('nan')):10.1f} {(res['vs_scan'] or float('nan')):10.2f} "
            f"{res['x_floor']:8.1f} {res.get('max_abs_err_adv', float('nan')):9.2e} {res.get('max_abs_err_ret', float('nan')):9.2e}"
        )
    print(
        f"\nbandwidth floor: {bytes_moved / 1e6:.1f} MB / {bandwidth:.3g} B/s"
        f" ({bandwidth_note['source']}) = {floor_ms * 1e3:.2f} us"
        f"  (target on H100 for 256x4096: <= 50 us)"
    )
    for k, v in notes.items():
        print(f"note[{k}]: {v}")

    report = {
        "benchmark": "gae",
        "batch": B,
        "time": T,
        "gamma": g,
        "lam": lam,
        "device_kind": dev.device_kind,
        "platform": dev.platform,
        "jax_version": jax.__version__,
        "python": platform.python_version(),
        "generated_fraction": float(m_np.mean()),
        "bytes_moved": bytes_moved,
        "bandwidth_floor_ms": floor_ms,
        "bandwidth": bandwidth_note,
        "results": results,
        "notes": notes,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
        print(f"wrote {args.json}")
    return report


if __name__ == "__main__":
    main()
