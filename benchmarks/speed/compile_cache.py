"""The persistent compilation cache (``compile_cache``, agentrl_jax/compile_cache.py): the same
run twice in fresh processes with one empty cache folder, the first compiling (cold), the second
loading (warm); each phase's time from the run's own progress lines, side by side.

    python benchmarks/speed/compile_cache.py --config experiments/smoke.py --set train.total_steps=2
    python3 benchmarks/speed/compile_cache.py --config experiments/babyai.py:grpo_gpu \\
        --set train.max_seconds=60 --set train.eval_before=False      # GPU
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: the progress lines timed: "<phase> ... done in 12.3 s" (or "1 min 02 s")
PHASES = ("loading model", "starting rollout backend", "first update (compiles the train step)")


def seconds(text: str) -> float:
    """``"12.3 s"`` / ``"1 min 02 s"`` -> seconds."""
    m = re.match(r"(?:(\d+) min )?([\d.]+) s", text.strip())
    if not m:
        raise ValueError(f"not a duration: {text!r}")
    return 60 * int(m.group(1) or 0) + float(m.group(2))


def phase_times(log: str) -> dict[str, float]:
    out = {}
    for line in log.splitlines():
        for phase in PHASES:
            if line.startswith(phase) and " ... done in " in line:
                out[phase] = seconds(line.split(" ... done in ", 1)[1])
    return out


def run_once(config: str, sets: list[str], cache_home: str, workdir: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env["AGENTRL_JAX_CACHE"] = cache_home  # compile_cache="auto" -> <cache_home>/jax_compile
    cmd = [sys.executable, "launch/run.py", "--config", config, "--workdir", workdir,
           "--config.compile_cache=auto", *[f"--config.{s}" for s in sets]]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return {"wall_s": wall, "phases_s": phase_times(done.stdout)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="experiments/smoke.py")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="compile_cache_bench_") as tmp:
        home = os.path.join(tmp, "home")
        tok = os.path.join(os.path.expanduser("~"), ".cache", "agentrl_jax", "tokenizers")
        if os.path.isdir(tok):  # the tokenizer's own cache is not what is measured
            import shutil
            shutil.copytree(tok, os.path.join(home, "tokenizers"))
        cold = run_once(args.config, args.set, home, os.path.join(tmp, "cold"))
        warm = run_once(args.config, args.set, home, os.path.join(tmp, "warm"))
        size = sum(os.path.getsize(os.path.join(d, f))
                   for d, _, fs in os.walk(os.path.join(home, "jax_compile")) for f in fs)
    print(f"{'phase':45s} {'cold':>8s} {'warm':>8s}  ratio")
    for phase in PHASES + ("whole run",):
        c = cold["wall_s"] if phase == "whole run" else cold["phases_s"].get(phase)
        w = warm["wall_s"] if phase == "whole run" else warm["phases_s"].get(phase)
        if c is None or w is None:
            continue
        print(f"{phase:45s} {c:7.1f}s {w:7.1f}s  {c / max(w, 1e-9):.1f}x")
    print(f"cache folder after both runs: {size / 2 ** 20:.1f} MiB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": args.config, "sets": args.set, "cold": cold, "warm": warm,
                       "cache_bytes": size}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
