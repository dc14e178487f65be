"""The device's copy bandwidth, measured in the process that uses it (the bandwidth roofline of
``benchmarks/speed/engine.py``'s decode step and of the kernel contenders in
``benchmarks/contenders/``: ``--bandwidth measure``, their default).

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


def bandwidth_arg(value: str) -> str | float:
    """``--bandwidth``'s type: ``"measure"`` or a positive number of bytes/s (e.g. ``3.35e12``)."""
    if value == "measure":
        return value
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--bandwidth must be 'measure' or bytes/s such as 3.35e12, got {value!r}") from None
    if not number > 0 or number == float("inf"):
        raise argparse.ArgumentTypeError(f"--bandwidth must be a positive finite number, got {value!r}")
    return number


def add_bandwidth_arguments(parser: argparse.ArgumentParser, default_copy_bytes: float = 4e9
                            ) -> None:
    """``--bandwidth`` (default ``measure``) and ``--copy-bytes``, as every roofline benchmark
    takes them: the roofline's bandwidth is a device copy timed in the same process unless a
    number is given (an assumed figure is never the default)."""
    parser.add_argument("--bandwidth", type=bandwidth_arg, default="measure",
                        help="bytes/s for the bandwidth roofline, or 'measure' (the default: a "
                             "device copy of --copy-bytes timed in this process, JAX and PyTorch, "
                             "read + write bytes / time)")
    parser.add_argument("--copy-bytes", type=float, default=None,
                        help=f"bytes copied by --bandwidth measure (default {default_copy_bytes:g}; "
                             "less in CPU / --small runs)")


def resolve_bandwidth(bandwidth: str | float, copy_bytes: float) -> tuple[float, dict[str, Any]]:
    """``(bytes/s, note)`` for ``--bandwidth``: a given number as it is (note ``{"source":
    "given"}``), or ``measure``: :func:`measure_copy_bandwidth` of ``copy_bytes`` (note
    ``{"source": "measured", **its result}``)."""
    bandwidth = bandwidth_arg(bandwidth) if isinstance(bandwidth, str) else float(bandwidth)
    if bandwidth != "measure":
        return float(bandwidth), {"source": "given", "bandwidth_Bps": float(bandwidth)}
    measured = measure_copy_bandwidth(int(copy_bytes))
    return measured["bandwidth_Bps"], {"source": "measured", **measured}


def describe_bandwidth(note: dict[str, Any]) -> str:
    """One line saying which bandwidth a roofline uses and where it came from."""
    if note["source"] != "measured":
        return f"# the roofline uses {note['bandwidth_Bps'] / 1e12:.2f} TB/s (given, not measured)"
    torch_tbps = note.get("torch_Bps", float("nan")) / 1e12
    return (f"# device copy of {note['copy_bytes'] / 1e9:.2f} GB: JAX {note['jax_Bps'] / 1e12:.2f} TB/s, "
            f"PyTorch {torch_tbps:.2f} TB/s (read + write): the roofline uses "
            f"{note['bandwidth_Bps'] / 1e12:.2f} TB/s")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bytes", type=float, default=4e9, help="bytes copied per call")
    result = measure_copy_bandwidth(int(p.parse_args(argv).bytes))
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
