"""The HF export of a model's weights (``model_to_hf_tensors``, which ``save_hf_directory`` and
the SGLang backend's weight sync from disk run every step): cast and transpose on the device,
then fetch, against the previous code (fetch float32, then cast and transpose with NumPy on
the host), in the same process on the same model.

    python benchmarks/contenders/weight_export.py                       # SmolLM2-135M (the GGUF), bfloat16
    python benchmarks/contenders/weight_export.py --dtype float32 --reps 5 --json out.json

Reported: seconds per export (median of ``--reps`` after one warm-up each) and whether both
give bit-identical tensors.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def host_export(model: Any, dtype: str) -> dict[str, np.ndarray]:
    """The export before the device-side cast: every parameter fetched as it is, then cast and
    transposed by NumPy."""
    import jax
    from flax import nnx

    from agentrl_jax.models.weights import hf_name

    np_dtype = jax.numpy.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    out = {}
    for path, variable in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        name, transpose = hf_name(path)
        array = np.asarray(variable.get_value()).astype(np_dtype)
        out[name] = np.ascontiguousarray(array.T if transpose else array)
    return out


def timed(fn, reps: int) -> tuple[float, Any]:
    out = fn()  # warm-up (the device casts compile once per shape)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    import jax

    from agentrl_jax.models.pretrained import load_model
    from agentrl_jax.models.weights import model_to_hf_tensors

    model, cfg = load_model(args.model)
    host_s, host = timed(lambda: host_export(model, args.dtype), args.reps)
    device_s, device = timed(lambda: model_to_hf_tensors(model, args.dtype), args.reps)
    same = list(host) == list(device) and all(
        host[k].dtype == device[k].dtype and host[k].shape == device[k].shape
        and np.array_equal(host[k].view(np.uint8), device[k].view(np.uint8)) for k in host)
    report = {"model": args.model, "dtype": args.dtype, "param_dtype": cfg.param_dtype,
              "num_parameters": cfg.num_parameters, "reps": args.reps,
              "device": f"{jax.devices()[0].platform}:{jax.devices()[0].device_kind}",
              "host_cast_s": host_s, "device_cast_s": device_s,
              "speedup": host_s / device_s, "bit_identical": bool(same)}
    print(f"{args.model} ({cfg.num_parameters / 1e6:.1f}M, {cfg.param_dtype} -> {args.dtype}) "
          f"on {report['device']}: host cast {host_s:.3f} s, device cast {device_s:.3f} s "
          f"({report['speedup']:.2f}x); bit-identical: {same}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return report


if __name__ == "__main__":
    main()
