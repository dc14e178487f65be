"""Reading a GGUF file's header: ``gguf.GGUFReader`` (what the model load used before) against
``models/gguf_index.read_index`` (what it uses now), side by side in one process, and the whole
model load (``load_gguf_model``: header, dequantisation, parameters placed) as it is now.

    python benchmarks/contenders/gguf_load.py                      # the SmolLM2 GGUF the package ships
    python benchmarks/contenders/gguf_load.py --path model.gguf --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--path", default=None, help="a .gguf file (default: the shipped SmolLM2)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    import gguf

    from agentrl_jax.models.gguf_index import read_index
    from agentrl_jax.models.gguf_io import load_gguf_model
    from agentrl_jax.models.pretrained import resolve_model_path

    path = args.path or resolve_model_path("smollm2")
    load_gguf_model(path)  # imports and first-use costs out of the way
    rows = {"GGUFReader (before)": timed(lambda: gguf.GGUFReader(path), args.repeats),
            "read_index (now)": timed(lambda: read_index(path), args.repeats),
            "load_gguf_model (now, whole load)": timed(lambda: load_gguf_model(path),
                                                       args.repeats)}
    for name, s in rows.items():
        print(f"{name:36s} {s:7.3f} s")
    ratio = rows["GGUFReader (before)"] / rows["read_index (now)"]
    print(f"header: {ratio:.0f}x faster; the model load saves "
          f"{rows['GGUFReader (before)'] - rows['read_index (now)']:.2f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"path": os.path.basename(path), "median_s": rows, "repeats": args.repeats},
                      f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
