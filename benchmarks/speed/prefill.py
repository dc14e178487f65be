"""The engine's prefill call, dense attention against the flash kernel, side by side.

    python benchmarks/speed/prefill.py --json out.json          # GPU: SmolLM2-135M shape, float32
    python benchmarks/speed/prefill.py --dtypes float32,bfloat16
    python benchmarks/speed/prefill.py --small                  # CPU smoke run (Pallas interpreter)

Each contender is the engine's own jitted prefill (``compiled.compiled_functions``) for a
random-weight model of ``--shape`` with the engine of ``experiments/babyai.py:grpo_gpu``
(``--slots`` slots of ``--max-length`` positions, head-major cache), differing only in
``prefill_attention`` (``dense``: XLA einsums over the call's KV length; ``flash``: the Pallas
kernel of ``kernels/prefill_attention.py`` on the gathered rows; ``flash_in_cache``: the
kernel reading the rows where they are in the cache, no gather or write-back, with the call's
tokens packed into rows of 64 as the engine then runs it: ``prefill_plan.plan_packed``). The calls are the shapes a BabyAI rollout
makes (docs/PERFORMANCE.md, "The agent loop, profiled"): each scenario is ``rows x chunk``
tokens attending over a KV bucket, with rows filled as the scheduler fills them (a first
prompt from position 0, a turn's observation at a later position, part-filled and empty rows).

Per scenario and contender: wall ms a call (median of ``--reps`` synchronised calls), device
busy ms and the kernels' categories (``devtime.py``, GPU only), real tokens a second, and the
largest difference between the two contenders' written KV rows (the later layers' keys depend
on the earlier layers' attention).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks.speed.engine import SHAPES, model_config  # noqa: E402

# name: (rows, chunk, kv, first position range, real tokens range per row, used rows share)
SCENARIOS: dict[str, tuple[int, int, int, tuple[int, int], tuple[int, int], float]] = {
    "first_prompts_256x16_kv512": (16, 256, 512, (0, 0), (256, 256), 1.0),
    "prompt_tails_64x64_kv512": (64, 64, 512, (256, 256), (20, 50), 0.5),
    "turns_64x64_kv1024": (64, 64, 1024, (300, 900), (64, 64), 1.0),
    "turn_tails_64x64_kv2048": (64, 64, 2048, (900, 1900), (20, 64), 0.75),
    "few_turns_256x16_kv2048": (16, 256, 2048, (900, 1700), (60, 120), 0.75),
    "long_1024x4_kv3072": (4, 1024, 3072, (0, 1500), (512, 1024), 1.0),
}
SMALL = {"first_prompts_64x4_kv128": (4, 64, 128, (0, 0), (64, 64), 1.0),
         "turns_64x4_kv256": (4, 64, 256, (70, 150), (20, 64), 0.75)}


def call_inputs(rng: np.random.Generator, scenario, slots: int, max_length: int, vocab: int):
    """``slot_ids [R]``, ``tokens [R, T]``, ``positions [R, T]`` as the scheduler builds them
    (unused rows: slot ``slots`` and positions ``max_length``, which write nothing), and the
    number of real tokens."""
    rows, chunk, _kv, (lo, hi), (n_lo, n_hi), used_share = scenario
    used = max(1, int(round(rows * used_share)))
    slot_ids = np.full((rows,), slots, np.int32)
    slot_ids[:used] = rng.choice(slots, size=used, replace=False)
    tokens = np.zeros((rows, chunk), np.int32)
    positions = np.full((rows, chunk), max_length, np.int32)
    real = 0
    for r in range(used):
        n = int(rng.integers(n_lo, n_hi + 1))
        start = int(rng.integers(lo, hi + 1))
        tokens[r, :n] = rng.integers(3, vocab, size=n)
        positions[r, :n] = np.arange(start, start + n)
        real += n
    return slot_ids, tokens, positions, real


def packed_inputs(slot_ids, tokens, positions, slots: int, max_length: int, piece: int,
                  row_buckets: tuple[int, ...]):
    """The same tokens as the engine's packed calls hold them (``prefill_plan.plan_packed``):
    each row's real tokens cut into consecutive rows of ``piece`` tokens, in the smallest row
    bucket that holds them."""
    pieces = []
    for r in range(tokens.shape[0]):
        n = int((positions[r] < max_length).sum())
        for a in range(0, n, piece):
            pieces.append((slot_ids[r], tokens[r, a:min(n, a + piece)],
                           positions[r, a:min(n, a + piece)]))
    rows = min(b for b in row_buckets if b >= len(pieces))
    p_slots = np.full((rows,), slots, np.int32)
    p_tokens = np.zeros((rows, piece), np.int32)
    p_positions = np.full((rows, piece), max_length, np.int32)
    for r, (slot, tok, pos) in enumerate(pieces):
        p_slots[r], p_tokens[r, :len(tok)], p_positions[r, :len(pos)] = slot, tok, pos
    return p_slots, p_tokens, p_positions


def run_contender(impl: str, cfg, args, scenarios, platform_name: str) -> dict[str, Any]:
    import jax
    from flax import nnx

    from agentrl_jax.models.llama import init_model
    from agentrl_jax.rollout.engine.compiled import compiled_functions
    from agentrl_jax.rollout.engine.prefill_plan import pack_rows
    from agentrl_jax.rollout.engine.forward import (DENSE, FLASH, FLASH_IN_CACHE,
                                                    FLASH_IN_CACHE_INTERPRET, FLASH_INTERPRET,
                                                    HEAD_MAJOR, new_cache)
    from benchmarks.speed.devtime import device_time

    gpu = platform_name == "gpu"
    kernel = {"dense": DENSE, "flash": FLASH if gpu else FLASH_INTERPRET,
              "flash_in_cache": FLASH_IN_CACHE if gpu else FLASH_IN_CACHE_INTERPRET}[impl]
    graphdef, state = nnx.split(init_model(cfg, seed=0))
    _, prefill, _, _ = compiled_functions(graphdef, jax.tree.structure(state), args.slots,
                                          args.max_length, 8, 8, HEAD_MAJOR, DENSE, "xla",
                                          prefill_attention=kernel)
    leaves = tuple(jax.tree.leaves(state))  # as the engine passes its weights
    out: dict[str, Any] = {"prefill_attention": kernel, "scenarios": {}}
    for name, scenario in scenarios.items():
        cache = [new_cache(HEAD_MAJOR, cfg, args.slots, args.max_length)]
        rng = np.random.default_rng(0)  # the same calls for both contenders
        slot_ids, tokens, positions, real = call_inputs(rng, scenario, args.slots,
                                                        args.max_length, cfg.vocab_size)
        kv = scenario[2]
        if impl == "flash_in_cache":  # as the engine runs it: packed rows, the whole row's KV
            from agentrl_jax.rollout.engine.engine_config import EngineConfig
            from agentrl_jax.kernels.prefill_attention import BLOCK_Q

            buckets = EngineConfig(max_length=args.max_length, prefill_chunks=(BLOCK_Q,),
                                   prefill_tokens=args.prefill_tokens).packed_row_buckets()
            slot_ids, tokens, positions = packed_inputs(slot_ids, tokens, positions, args.slots,
                                                        args.max_length, BLOCK_Q, buckets)
            kv = args.max_length

        rows = pack_rows(slot_ids, tokens, positions)  # the engine's one host array

        def call():
            cache[0] = prefill(leaves, cache[0], rows.packed, rows.chunk, kv)
            return cache[0].keys[-1]

        t0 = time.perf_counter()
        jax.block_until_ready(call())
        compile_s = time.perf_counter() - t0
        walls = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            jax.block_until_ready(call())
            walls.append(time.perf_counter() - t0)
        wall_ms = statistics.median(walls) * 1e3
        dev = device_time(call, calls=min(args.reps, 10)) if platform_name == "gpu" else None
        used = np.unique(slot_ids[slot_ids < args.slots])
        # the rows' written KV of the last layer (depends on every earlier layer's attention)
        last_k = np.asarray(jax.device_get(cache[0].keys[-1][used, :, :scenario[2]]),
                            np.float32)
        out["scenarios"][name] = {
            "rows": tokens.shape[0], "chunk": tokens.shape[1], "kv": kv, "real_tokens": real,
            "positions": tokens.size, "wall_ms": wall_ms, "compile_s": compile_s,
            "real_tokens_per_s": real / (wall_ms / 1e3),
            "device": dev, "_last_k": last_k}
        busy = f", device busy {dev['busy_ms']:.2f} ms" if dev else ""
        print(f"  {impl:14s} {name}: {wall_ms:.2f} ms a call{busy}, "
              f"{real / (wall_ms / 1e3):,.0f} real tok/s", flush=True)
        del cache[0]
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default=None)
    p.add_argument("--dtypes", default="float32", help="comma list: float32, bfloat16")
    p.add_argument("--slots", type=int, default=None, help="engine slots (default 256)")
    p.add_argument("--max-length", type=int, default=None, help="KV row (default 3072)")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--prefill-tokens", type=int, default=4096,
                   help="tokens of the largest packed call (EngineConfig.prefill_tokens)")
    p.add_argument("--contenders", default="dense,flash,flash_in_cache",
                   help="comma list, the first is the baseline: dense, flash, flash_in_cache")
    p.add_argument("--small", action="store_true", help="CPU smoke run: tiny shape and calls")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    import jax

    small = args.small
    args.shape = args.shape or ("tiny" if small else "smollm2-135m")
    args.slots = args.slots or (8 if small else 256)
    args.max_length = args.max_length or (256 if small else 3072)
    if small:
        args.reps = min(args.reps, 3)
    scenarios = SMALL if small else SCENARIOS
    platform_name = jax.devices()[0].platform
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"), "device": jax.devices()[0].device_kind,
        "platform": platform.platform(), "jax": jax.__version__, "shape": args.shape,
        "slots": args.slots, "max_length": args.max_length, "reps": args.reps, "dtypes": {}}
    for dtype in args.dtypes.split(","):
        cfg = model_config(args.shape, dtype)
        print(f"# {args.shape}, {dtype}, {args.slots} slots x {args.max_length} positions, "
              f"{jax.devices()[0].device_kind}", flush=True)
        contenders = args.contenders.split(",")
        runs = {impl: run_contender(impl, cfg, args, scenarios, platform_name)
                for impl in contenders}
        base = contenders[0]
        rows = []
        for name in scenarios:
            b = runs[base]["scenarios"][name]
            row = {"scenario": name, f"{base}_ms": b["wall_ms"]}
            for impl in contenders[1:]:
                f = runs[impl]["scenarios"][name]
                row[f"{impl}_ms"] = f["wall_ms"]
                row[f"{impl}_speedup"] = b["wall_ms"] / f["wall_ms"]
                row[f"{impl}_max_abs_kv_diff"] = float(np.max(np.abs(b["_last_k"] -
                                                                     f["_last_k"])))
            rows.append(row)
            print(f"{name}: " + ", ".join(
                f"{impl} {runs[impl]['scenarios'][name]['wall_ms']:.2f} ms" for impl in contenders)
                + "; " + ", ".join(f"{impl} {row[f'{impl}_speedup']:.2f}x (KV differ <= "
                                   f"{row[f'{impl}_max_abs_kv_diff']:.1e})"
                                   for impl in contenders[1:]))
        for r in runs.values():
            for sc in r["scenarios"].values():
                sc.pop("_last_k")
        totals = {impl: sum(r[f"{impl}_ms"] for r in rows) for impl in contenders}
        print("all scenarios: " + ", ".join(f"{impl} {ms:.1f} ms" for impl, ms in totals.items())
              + "; " + ", ".join(f"{impl} {totals[base] / totals[impl]:.2f}x"
                                 for impl in contenders[1:]))
        report["dtypes"][dtype] = {"contenders": runs, "comparison": rows, "totals_ms": totals}
        if args.json:  # after every dtype: a later one may not finish
            with open(args.json, "w") as fh:
                json.dump(report, fh, indent=2)
    return report


if __name__ == "__main__":
    main()
