"""The device's copy bandwidth, measured in the process that uses it (the bandwidth roofline of
``benchmarks/speed/engine.py``'s decode step).

    python benchmarks/speed/copy_bandwidth.py [--bytes 4e9]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any


def measure_copy_bandwidth(n_bytes: int, repeats: int = 20) -> dict[str, Any]:
    """The device's copy bandwidth in B/s, two ways in this process:

    * ``jax``: a jitted, input-donated ``x * 1.0001`` over a ``[n_bytes / 4]`` float32 array
      (read and written in place: ``2 * n_bytes`` of traffic a call), ``repeats`` calls after
      three warm-ups, one sync at the end;
    * ``torch`` (where PyTorch sees a CUDA device): ``dst.copy_(src)`` of ``n_bytes`` timed with
      CUDA events, the measurement docs/PERFORMANCE.md quoted before.

    ``bandwidth_Bps`` is the larger of the two (each can only under-estimate what the memory
    moves)."""
    import jax
    import jax.numpy as jnp

    n = max(1, n_bytes // 4)
    scale = jax.jit(lambda a: a * 1.0001, donate_argnums=0)
    x = jnp.ones((n,), jnp.float32)
    for _ in range(3):
        x = scale(x)
    x.block_until_ready()
    t0 = time.perf_counter()
    for _ in range(repeats):
        x = scale(x)
    x.block_until_ready()
    per_call = (time.perf_counter() - t0) / repeats
    del x
    out: dict[str, Any] = {"copy_bytes": 4 * n, "jax_ms": 1e3 * per_call,
                           "jax_Bps": 2 * 4 * n / per_call}
    try:
        import torch
        if torch.cuda.is_available():
            src = torch.ones(n, dtype=torch.float32, device="cuda")
            dst = torch.empty_like(src)
            for _ in range(3):
                dst.copy_(src)
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(repeats):
                dst.copy_(src)
            stop.record()
            torch.cuda.synchronize()
            ms = start.elapsed_time(stop) / repeats
            out.update(torch_ms=ms, torch_Bps=2 * 4 * n / (ms / 1e3))
            del src, dst
            torch.cuda.empty_cache()
    except ImportError:
        pass
    out["bandwidth_Bps"] = max(out["jax_Bps"], out.get("torch_Bps", 0.0))
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bytes", type=float, default=4e9, help="bytes copied per call")
    result = measure_copy_bandwidth(int(p.parse_args(argv).bytes))
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
