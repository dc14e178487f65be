"""The abstract model of a run start, traced every time (the code before 2026-12-04) against
traced once per config and copied (``models.llama.abstract_model``), side by side in one
process.

A run start asks for the abstract ``CausalLM`` (``jax.ShapeDtypeStruct`` parameters) twice:
the weights' load (``models.weights.build_model``) and the embedded engine (a random-init
policy with a mesh a third time, ``init_model``). Tracing it runs every layer's initialisers
under ``nnx.eval_shape``; the cached path merges the traced structure into a fresh copy.

    python benchmarks/speed/abstract_model.py --model smollm2 --calls 2 --repeats 3

Prints one line per repeat (seconds for ``--calls`` calls each way) and the medians with
their ratio; ``--json`` writes them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def seconds(fn, calls: int) -> float:
    """Wall seconds of ``calls`` calls of ``fn()``."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2", help="a known model name or a model path")
    p.add_argument("--calls", type=int, default=2, help="abstract models a repeat (a run: 2)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default="")
    args = p.parse_args(argv)

    from agentrl_jax.models import llama
    from agentrl_jax.models.pretrained import load_model_config

    cfg = load_model_config(args.model)
    rows = []
    for r in range(args.repeats):
        traced = seconds(lambda: llama._trace_abstract(cfg), args.calls)
        llama._abstract_split.cache_clear()  # the first call of a run traces once
        cached = seconds(lambda: llama.abstract_model(cfg), args.calls)
        rows.append({"traced_s": traced, "cached_s": cached})
        print(f"repeat {r}: {args.calls} calls traced each time {traced:.3f} s, traced once "
              f"and copied {cached:.3f} s")
    traced = statistics.median(x["traced_s"] for x in rows)
    cached = statistics.median(x["cached_s"] for x in rows)
    print(f"median: traced each time {traced:.3f} s, traced once {cached:.3f} s: "
          f"{traced / cached:.1f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "repeats": rows, "traced_s": traced,
                       "cached_s": cached, "ratio": traced / cached}, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
