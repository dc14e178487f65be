"""Our engine beside SGLang's offline engine: one command, the same workload, the same quantity.

    SGLANG_PYTHONPATH=~/sg/site python3 benchmarks/contenders/engine_vs_sglang.py \\
        --model-dir ~/smollm2_hf_bf16 --json OUT/engine_vs_sglang.json           # on a GPU
    JAX_PLATFORMS=cpu python3 benchmarks/contenders/engine_vs_sglang.py --shapes tiny \\
        --engines ours --batch 8 --prompt-len 16 --decode-tokens 8                # CPU smoke run

For each shape of ``--shapes`` (``benchmarks/speed/engine.py``'s shapes) and each engine of
``--engines`` (``ours``: ``agentrl_jax.rollout.engine.engine.Engine``; ``sglang``:
``sglang.Engine``, its offline engine, no HTTP) a fresh Python process runs one workload:

* ``--batch`` prompts (256) of ``--prompt-len`` tokens (128), the same token ids for both engines
  (drawn once from ``--seed`` and handed to both in a file), EOS ignored, the same
  ``--temperature`` (0 = greedy) for both, bfloat16;
* warm-up alike: one whole run of the longest request (n = D + 1 new tokens) before any timing;
* then ``--repeats`` (R) rounds of: the whole batch with n = 1 new token, the whole batch with
  n = D + 1 (D = ``--decode-tokens``, 256). T(n) is the wall time from handing all the requests
  to the engine to the last result, median over the R rounds; the prefix cache is flushed
  (outside the timing) before every run, so no run reuses an earlier run's prompt KV.

Derived the same way for both (``derive``), from wall times alone::

    decode step     = (T(D+1) - T(1)) / D                  (the n = 1 run is prefill + 1 token)
    decode tok/s    = batch * D / (T(D+1) - T(1))          (decode only)
    end-to-end tok/s = batch * (D+1) / T(D+1)              (prefill included)

so SGLang's per-step CUDA graphs and our fused decode calls (``--decode-steps`` a call) are
compared on one quantity: generated tokens per wall second of the same batch.

Weights: with ``--model-dir`` (a HF directory, e.g. ``python -m agentrl_jax.models.convert
smollm2 DIR --dtype bfloat16``) the ``smollm2-135m`` shape is that model for both engines;
every other shape (and smollm2-135m without it) is random weights of the shape: ours
initialises them, SGLang gets a ``config.json`` of the shape (``ModelConfig.to_hf_dict``) with
``load_format="dummy"``. Random vs real weights do not change a dense step's work (EOS ignored).

Processes: ours runs with this repository on ``PYTHONPATH`` (ahead of the caller's); SGLang with
``SGLANG_PYTHONPATH`` (``--sglang-pythonpath``) alone, since it pins its own transformers. When
``import sglang`` fails in its process the SGLang side is skipped with that message and ours
still runs. SGLang is started with ``skip_tokenizer_init=True`` (token ids in and out, no
detokenizer; ours has none either) and no ``min_new_tokens`` (``ignore_eos`` already forces
every token; ``min_new_tokens`` would add SGLang's per-step EOS-mask penalizer, a vocabulary-wide
add ours does not do; ``--sglang-min-new-tokens`` turns it on). ``--sglang-arg KEY=VALUE`` adds
``sglang.Engine`` arguments (VALUE as JSON when it parses, e.g. ``mem_fraction_static=0.8``).

Output: one JSON (``--json``) with both engines' times and derived numbers per shape and the
ratios (ours against SGLang), and a table on stdout. Each worker's log is in ``--workdir``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENGINES = ("ours", "sglang")
DEFAULT_SHAPES = "smollm2-135m,qwen2.5-1.5b"
REAL_WEIGHTS_SHAPE = "smollm2-135m"  # the shape --model-dir is
# NVLink multicast stays off in every process this starts (docs of the lent GPU machines)
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1"}

RunBatch = Callable[[int], "tuple[float, int]"]


# ------------------------------------------------------------------------ the arithmetic
def measure(run_batch: RunBatch, batch: int, decode_tokens: int, repeats: int) -> dict[str, Any]:
    """Warm-up, then ``repeats`` rounds of T(1) and T(D+1), D = ``decode_tokens``.

    ``run_batch(n)`` runs the whole batch with ``n`` new tokens a request and returns
    ``(wall seconds, generated tokens)``; every run must generate ``batch * n`` tokens. Returns
    ``{"warmup_s": s, "times_s": {"1": [R floats], str(D+1): [R floats]}}``.
    """
    if batch < 1 or decode_tokens < 1 or repeats < 1:
        raise ValueError(f"batch {batch}, decode_tokens {decode_tokens}, repeats {repeats}: "
                         "each must be >= 1")
    long = decode_tokens + 1

    def timed(n: int) -> float:
        seconds, generated = run_batch(n)
        if generated != batch * n:
            raise RuntimeError(f"{generated} tokens generated for {batch} requests x {n} new "
                               f"tokens ({batch * n} expected): EOS was not ignored?")
        return seconds

    warmup = timed(long)  # one whole run of the longest request, before any timing
    times: dict[str, list[float]] = {"1": [], str(long): []}
    for _ in range(repeats):
        for n in (1, long):
            times[str(n)].append(timed(n))
    return {"warmup_s": warmup, "times_s": times}


def derive(times_s: dict[str, list[float]], batch: int, decode_tokens: int) -> dict[str, float]:
    """The compared quantities from the wall times of ``measure`` (medians over the rounds).

    With T1 = median T(1), TL = median T(D+1), D = ``decode_tokens``, B = ``batch``:
    decode step = (TL - T1) / D; decode tok/s = B * D / (TL - T1); end-to-end tok/s =
    B * (D + 1) / TL.
    """
    long = decode_tokens + 1
    t1 = statistics.median(times_s["1"])
    tl = statistics.median(times_s[str(long)])
    decode_s = tl - t1
    if decode_s <= 0:
        raise ValueError(f"T({long}) = {tl:.6f} s is not longer than T(1) = {t1:.6f} s")
    return {"t1_s": t1, "t_long_s": tl, "decode_s": decode_s,
            "decode_step_ms": 1e3 * decode_s / decode_tokens,
            "decode_tokens_per_s": batch * decode_tokens / decode_s,
            "end_to_end_tokens_per_s": batch * long / tl}


def ratios(ours: dict[str, float], sglang: dict[str, float]) -> dict[str, float]:
    """Ours against SGLang, each > 1 when ours is faster: SGLang's step / ours, our tok/s /
    SGLang's (decode only and end to end)."""
    return {"decode_step": sglang["decode_step_ms"] / ours["decode_step_ms"],
            "decode_tokens_per_s": ours["decode_tokens_per_s"] / sglang["decode_tokens_per_s"],
            "end_to_end_tokens_per_s": (ours["end_to_end_tokens_per_s"]
                                        / sglang["end_to_end_tokens_per_s"])}


# ------------------------------------------------------------------------------- workers
def run_ours(spec: dict[str, Any]) -> dict[str, Any]:
    """Our engine on ``spec``'s workload (in its own process): ``measure``'s times + notes.

    The engine is set up as ``benchmarks/speed/engine.py`` sets it up (one prefill chunk
    covering the prompt, the whole row as the prefill KV bucket, ``decode_steps`` fused steps
    a call); all the requests are admitted at once (``pause`` / ``resume``).
    """
    sys.path.insert(0, ROOT)
    import jax

    from agentrl_jax.rollout.contract import SamplingParams
    from agentrl_jax.rollout.engine.engine import Engine, EngineConfig
    from benchmarks.speed.engine import model_config

    dtype = spec["dtype"]
    t0 = time.perf_counter()
    if spec["model_path"]:
        from agentrl_jax.models.pretrained import load_model

        model, _ = load_model(spec["model_path"], dtype=dtype, param_dtype=dtype)
    else:
        from agentrl_jax.models.llama import init_model

        model = init_model(model_config(spec["shape"], dtype), seed=spec["seed"])
    load_s = time.perf_counter() - t0
    with open(spec["prompts_file"]) as f:
        prompts = json.load(f)
    batch, decode_tokens = len(prompts), spec["decode_tokens"]
    prompt_len = len(prompts[0])
    chunk = 1 << (prompt_len - 1).bit_length()
    # the decode kernels need a max_length divisible by 16 (else the engine compiles dense
    # attention, which is not what a GPU run uses): the cache is rounded up to the next one
    max_length = -(-(prompt_len + decode_tokens + 1) // 16) * 16
    config = EngineConfig(max_batch=batch, max_length=max_length,
                          dtype=dtype, decode_steps=spec["decode_steps"], prefill_chunks=(chunk,),
                          prefill_tokens=max(chunk, 8192), prefill_kv_buckets=())
    t0 = time.perf_counter()
    engine = Engine(model, config)
    start_s = time.perf_counter() - t0

    def run_batch(n: int) -> tuple[float, int]:
        engine.flush_cache_sync()  # no prompt KV kept from an earlier run (outside the timing)
        sampling = SamplingParams(max_new_tokens=n, temperature=spec["temperature"],
                                  ignore_eos=True)
        t0 = time.perf_counter()
        engine.pause("in_place")  # admit the whole batch at once
        futures = [engine.submit(p, sampling) for p in prompts]
        engine.resume()
        results = [f.result()[0] for f in futures]
        return time.perf_counter() - t0, sum(len(r.output_ids) for r in results)

    try:
        before = engine.stats.as_dict()
        out = measure(run_batch, batch, decode_tokens, spec["repeats"])
        after = engine.stats.as_dict()
    finally:
        engine.close()
    steps = after["decode_steps"] - before["decode_steps"]
    device = jax.devices()[0]
    out.update({
        "device": f"{device.platform}:{device.device_kind}", "jax_version": jax.__version__,
        "load_s": load_s, "engine_start_s": start_s,
        "decode_attention": engine.decode_attention, "decode_gemm": engine.decode_gemm,
        "decode_steps_per_call": spec["decode_steps"],
        # the engine's own mean over its fused calls, warm-up included: not the compared number
        "engine_stats_decode_step_ms": 1e3 * (after["decode_time_s"] - before["decode_time_s"])
        / max(steps, 1)})
    return out


def run_sglang(spec: dict[str, Any]) -> dict[str, Any]:
    """SGLang's offline engine on ``spec``'s workload (its own process, its own PYTHONPATH).

    Returns ``{"skipped": why}`` when ``import sglang`` fails here.
    """
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        sys.path.pop(0)  # this script's folder: nothing of it may shadow SGLang's imports
    try:
        import sglang
    except Exception as e:  # noqa: BLE001 - ImportError, or what a broken install raises
        return {"skipped": f"import sglang failed in its process ({type(e).__name__}: {e}); "
                           f"PYTHONPATH={os.environ.get('PYTHONPATH', '')!r}: set "
                           "SGLANG_PYTHONPATH to where SGLang is installed "
                           "(docs/PERFORMANCE.md, 'Our engine beside SGLang')"}
    with open(spec["prompts_file"]) as f:
        prompts = json.load(f)
    batch, decode_tokens = len(prompts), spec["decode_tokens"]
    kwargs: dict[str, Any] = {"model_path": spec["sglang_model_path"],
                              "load_format": spec["sglang_load_format"], "dtype": spec["dtype"],
                              "skip_tokenizer_init": True, "random_seed": spec["seed"],
                              "log_level": "error"}
    kwargs.update(spec["sglang_args"])
    t0 = time.perf_counter()
    engine = sglang.Engine(**kwargs)
    start_s = time.perf_counter() - t0
    flush = getattr(engine, "flush_cache", None)

    def run_batch(n: int) -> tuple[float, int]:
        if flush is not None:
            flush()  # no radix-cache hit on an earlier run's prompts (outside the timing)
        params: dict[str, Any] = {"max_new_tokens": n, "ignore_eos": True,
                                  "temperature": spec["temperature"]}
        if spec["sglang_min_new_tokens"]:
            params["min_new_tokens"] = n
        t0 = time.perf_counter()
        outs = engine.generate(input_ids=prompts, sampling_params=params)
        seconds = time.perf_counter() - t0
        return seconds, sum(int(o["meta_info"]["completion_tokens"]) for o in outs)

    try:
        out = measure(run_batch, batch, decode_tokens, spec["repeats"])
    finally:
        engine.shutdown()
    out.update({"sglang_version": getattr(sglang, "__version__", "?"), "engine_start_s": start_s,
                "sglang_args": {k: v for k, v in kwargs.items() if k != "model_path"},
                "cache_flushed": flush is not None,
                "min_new_tokens": bool(spec["sglang_min_new_tokens"])})
    return out


def worker_main(engine: str, spec_path: str, out_path: str) -> int:
    with open(spec_path) as f:
        spec = json.load(f)
    result = (run_ours if engine == "ours" else run_sglang)(spec)
    result["pid"] = os.getpid()
    with open(out_path, "w") as f:
        json.dump(result, f, indent=2)
    return 0


# -------------------------------------------------------------------------- orchestrator
def parse_sglang_args(pairs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` strings as ``sglang.Engine`` keyword arguments (VALUE as JSON if it
    parses, else the string)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"error: --sglang-arg {pair!r}: expected KEY=VALUE")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def worker_env(engine: str, sglang_pythonpath: str) -> dict[str, str]:
    """The environment of a worker: ours with this repository first on PYTHONPATH, SGLang with
    ``sglang_pythonpath`` alone; NVLink multicast off in both."""
    env = {**os.environ, **NO_MULTICAST, "PYTHONUNBUFFERED": "1"}
    if engine == "ours":
        env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", ""))
                                            if p)
    else:
        env["PYTHONPATH"] = sglang_pythonpath
    return env


def run_worker(engine: str, spec: dict[str, Any], workdir: str, sglang_pythonpath: str,
               timeout_s: float) -> dict[str, Any]:
    """One engine on one shape in a fresh process; its result, or ``{"error": ...}``."""
    tag = f"{engine}_{spec['shape']}"
    spec_path = os.path.join(workdir, f"{tag}_spec.json")
    out_path = os.path.join(workdir, f"{tag}_result.json")
    log_path = os.path.join(workdir, f"{tag}.log")
    with open(spec_path, "w") as f:
        json.dump(spec, f, indent=2)
    if os.path.exists(out_path):
        os.remove(out_path)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", engine, "--spec", spec_path,
           "--out", out_path]
    print(f"# {spec['shape']}: {engine} (its own process, log {log_path})", flush=True)
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                env=worker_env(engine, sglang_pythonpath),
                                cwd=os.path.expanduser("~") if engine == "sglang" else ROOT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)  # the worker's own session: SGLang's children too
            proc.wait()
            return {"error": f"timed out after {timeout_s:.0f} s (log {log_path})",
                    "log": log_path}
    wall = time.perf_counter() - t0
    if rc != 0 or not os.path.exists(out_path):
        with open(log_path) as f:
            tail = f.read()[-1500:]
        return {"error": f"exit {rc} (log {log_path}): ...{tail}", "log": log_path}
    with open(out_path) as f:
        result = json.load(f)
    result["process_wall_s"] = wall
    result["log"] = log_path
    return result


def dummy_model_dir(shape: str, dtype: str, workdir: str) -> str:
    """A HF directory holding only the shape's ``config.json`` (for ``load_format="dummy"``)."""
    from benchmarks.speed.engine import model_config

    path = os.path.join(workdir, f"model_{shape}")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(model_config(shape, dtype).to_hf_dict(), f, indent=1)
    return path


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default=DEFAULT_SHAPES,
                   help="comma list of benchmarks/speed/engine.py shapes (tiny: CPU smoke run)")
    p.add_argument("--engines", default=",".join(ENGINES), help="comma list of: ours,sglang")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--decode-tokens", type=int, default=256,
                   help="D: T(1) and T(D+1) are timed; decode step = (T(D+1) - T(1)) / D")
    p.add_argument("--repeats", type=int, default=3, help="R: rounds timed (medians)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default), or 1")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    p.add_argument("--seed", type=int, default=0, help="the prompts' and the weights' seed")
    p.add_argument("--model-dir", default="",
                   help=f"HF directory of the {REAL_WEIGHTS_SHAPE} shape (both engines load it); "
                        "default: random weights")
    p.add_argument("--decode-steps", type=int, default=16,
                   help="ours: fused decode steps a call (a divisor of D keeps every call full)")
    p.add_argument("--sglang-pythonpath", default=os.environ.get("SGLANG_PYTHONPATH", ""),
                   help="PYTHONPATH of the SGLang process (default $SGLANG_PYTHONPATH)")
    p.add_argument("--sglang-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="an extra sglang.Engine argument (repeatable)")
    p.add_argument("--sglang-min-new-tokens", action="store_true",
                   help="also send min_new_tokens = n to SGLang (its EOS-mask penalizer)")
    p.add_argument("--timeout", type=float, default=900, help="seconds a worker may take")
    p.add_argument("--workdir", default="", help="specs, prompts, logs (default a temp dir)")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--worker", choices=ENGINES, help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        raise SystemExit(worker_main(args.worker, args.spec, args.out))

    sys.path.insert(0, ROOT)
    import numpy as np

    from benchmarks.speed.engine import SHAPES, model_config, prompts

    shapes = [s for s in args.shapes.split(",") if s]
    engines = [e for e in args.engines.split(",") if e]
    for s in shapes:
        if s not in SHAPES:
            p.error(f"--shapes: unknown shape {s!r} (known: {', '.join(sorted(SHAPES))})")
    for e in engines:
        if e not in ENGINES:
            p.error(f"--engines: unknown engine {e!r} (known: {', '.join(ENGINES)})")
    if args.temperature not in (0.0, 1.0):
        p.error("--temperature: 0 (greedy) or 1")
    workdir = os.path.abspath(args.workdir or tempfile.mkdtemp(prefix="engine_vs_sglang_"))
    os.makedirs(workdir, exist_ok=True)
    sglang_args = parse_sglang_args(args.sglang_arg)
    report: dict[str, Any] = {
        "config": {k: getattr(args, k) for k in (
            "batch", "prompt_len", "decode_tokens", "repeats", "temperature", "dtype", "seed",
            "model_dir", "decode_steps", "sglang_min_new_tokens")},
        "sglang_args": sglang_args, "sglang_pythonpath": args.sglang_pythonpath,
        "host": platform.node(), "workdir": workdir, "shapes": {}}
    failed = False
    for shape in shapes:
        cfg = model_config(shape, args.dtype)
        batch_prompts = prompts(np.random.default_rng(args.seed), args.batch, args.prompt_len,
                                cfg.vocab_size)
        prompts_file = os.path.join(workdir, f"prompts_{shape}.json")
        with open(prompts_file, "w") as f:
            json.dump(batch_prompts, f)
        real = bool(args.model_dir) and shape == REAL_WEIGHTS_SHAPE
        spec = {"shape": shape, "dtype": args.dtype, "seed": args.seed,
                "decode_tokens": args.decode_tokens, "repeats": args.repeats,
                "temperature": args.temperature, "prompts_file": prompts_file,
                "decode_steps": args.decode_steps,
                "model_path": os.path.abspath(args.model_dir) if real else "",
                "sglang_args": sglang_args, "sglang_min_new_tokens": args.sglang_min_new_tokens}
        if "sglang" in engines:
            spec["sglang_model_path"] = (os.path.abspath(args.model_dir) if real
                                         else dummy_model_dir(shape, args.dtype, workdir))
            spec["sglang_load_format"] = "auto" if real else "dummy"
        entry: dict[str, Any] = {"weights": args.model_dir if real else "random",
                                 "num_parameters": cfg.num_parameters}
        for engine in engines:
            result = run_worker(engine, spec, workdir, args.sglang_pythonpath, args.timeout)
            if "times_s" in result:
                result.update(derive(result["times_s"], args.batch, args.decode_tokens))
            elif "skipped" in result:
                print(f"# {shape}: {engine} skipped: {result['skipped']}", flush=True)
            else:
                failed = True
                print(f"# {shape}: {engine} FAILED: {result['error']}", flush=True)
            entry[engine] = result
        if all("decode_step_ms" in entry.get(e, {}) for e in ENGINES):
            entry["ours_vs_sglang"] = ratios(entry["ours"], entry["sglang"])
        report["shapes"][shape] = entry
    print_table(report)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
        print(f"wrote {args.json}")
    if failed:
        raise SystemExit(1)
    return report


def print_table(report: dict[str, Any]) -> None:
    c = report["config"]
    d = c["decode_tokens"]
    print(f"\nbatch {c['batch']}, prompt {c['prompt_len']}, T(1) and T({d + 1}) medians of "
          f"{c['repeats']}, temperature {c['temperature']}, {c['dtype']}")
    print(f"| {'shape':<13} | {'engine':<6} | {'T(1) s':>8} | {f'T({d + 1}) s':>9} | "
          f"{'step ms':>8} | {'decode tok/s':>12} | {'e2e tok/s':>10} |")
    print(f"|{'-' * 15}|{'-' * 8}|{'-' * 10}|{'-' * 11}|{'-' * 10}|{'-' * 14}|{'-' * 12}|")
    for shape, entry in report["shapes"].items():
        for engine in ENGINES:
            r = entry.get(engine)
            if r is None:
                continue
            if "decode_step_ms" not in r:
                why = r.get("skipped") or r.get("error", "")
                print(f"| {shape:<13} | {engine:<6} | {why[:70]}")
                continue
            print(f"| {shape:<13} | {engine:<6} | {r['t1_s']:>8.4f} | {r['t_long_s']:>9.4f} | "
                  f"{r['decode_step_ms']:>8.3f} | {r['decode_tokens_per_s']:>12,.0f} | "
                  f"{r['end_to_end_tokens_per_s']:>10,.0f} |")
        q = entry.get("ours_vs_sglang")
        if q:
            print(f"{shape}: ours vs SGLang: decode step {q['decode_step']:.2f}x faster, "
                  f"decode tok/s {q['decode_tokens_per_s']:.2f}x, end-to-end tok/s "
                  f"{q['end_to_end_tokens_per_s']:.2f}x")


if __name__ == "__main__":
    main()
