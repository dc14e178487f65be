"""A whole RL step, timed part by part: rollout, learner log-prob passes, update, weight sync,
host work. Runs the real trainer (environment servers, embedded engine, actor pool, learner)
for a few steps per variant, in one process, and reads the per-step metrics it logs.

    python benchmarks/rl_step.py                                   # GPU: BabyAI, SmolLM2
    python benchmarks/rl_step.py --steps 6 --variants packed,padded --json out.json
    python benchmarks/rl_step.py --config experiments/smoke.py --steps 3   # CPU smoke run

Variants (each a set of config overrides on ``--config``):
  packed  the config as given (packed learner rows, flat groups skipped when the config does)
  padded  the previous learner path: rows padded to power-of-two length buckets, every group
          trained, XLA / cuDNN causal attention (``learner.pack_length=0``,
          ``train.skip_flat_groups=False``, ``learner.attention_impl=None``)

Per step: ``step`` (wall, rollout included), ``rollout`` (actor pool wall), ``update``
(learner.update: old / reference log-probs + optimiser steps), ``sync`` (weights to the engine),
``host`` (the rest: batch assembly, logging). Steady state = the median over steps 2..N; the
first step's extra time (``first - steady``) is compilation. Rollout throughput = generated
tokens / rollout wall; learner throughput = real (unpadded) tokens / update time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

VARIANTS = {
    "packed": {},
    "padded": {"learner.pack_length": 0, "train.skip_flat_groups": False,
               "learner.attention_impl": None},
}


def load_config(path: str, steps: int, overrides: dict):
    import importlib.util

    spec = importlib.util.spec_from_file_location("experiment", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    c = module.get_config()
    c.train.total_steps = steps
    c.train.eval_before = c.train.eval_after = False
    c.train.eval_every = 0
    c.train.save_every = 10 ** 6
    c.train.max_seconds = 0.0
    for key, value in overrides.items():
        section, name = key.split(".")
        c[section][name] = value
    return c


def step_rows(metrics_path: str) -> list[dict]:
    rows = []
    with open(metrics_path) as f:
        for line in f:
            m = json.loads(line)
            if "train/step_seconds" not in m:
                continue
            rollout = m.get("rollout/wall_s", 0.0)
            update = m.get("perf/update_time_s", 0.0)
            sync = m.get("perf/weight_sync_s", 0.0)
            step = m["train/step_seconds"]
            rows.append({
                "step": m["step"], "step_s": step, "rollout_s": rollout, "update_s": update,
                "forward_s": m.get("perf/forward_time_s", 0.0), "sync_s": sync,
                "host_s": step - rollout - update - sync,
                "generated_tokens": m.get("rollout/generated_tokens", 0.0),
                "real_tokens": m.get("batch/real_tokens",
                                     m.get("sequence_length/mean", 0.0) * m.get("batch/rows", 0)),
                "episodes": m.get("rollout/episodes", 0.0),
                "reward": m.get("rollout/mean_reward", 0.0),
                "ratio_min": m.get("rollout/behaviour_ratio_min"),
                "ratio_max": m.get("rollout/behaviour_ratio_max"),
                "lp_diff_mean": m.get("rollout/logprob_abs_diff_mean")})
    return rows


def summarise(rows: list[dict]) -> dict:
    steady = rows[1:] or rows

    def med(key):
        return statistics.median(r[key] for r in steady)

    out = {k: med(k) for k in ("step_s", "rollout_s", "update_s", "forward_s", "sync_s",
                               "host_s")}
    out["first_step_s"] = rows[0]["step_s"]
    out["compile_s_estimate"] = rows[0]["step_s"] - out["step_s"]
    out["rollout_tokens_per_s"] = med("generated_tokens") / max(out["rollout_s"], 1e-9)
    upd = [r["real_tokens"] / r["update_s"] for r in steady if r["update_s"] > 0]
    out["learner_real_tokens_per_s"] = statistics.median(upd) if upd else 0.0
    out["episodes"] = med("episodes")
    return out


def run_variant(config_path: str, name: str, steps: int, workdir: str) -> dict:
    from agentrl_jax.training.trainer import Trainer

    config = load_config(config_path, steps, VARIANTS[name])
    out = os.path.join(workdir, name)
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    Trainer(config, out, progress=False).run()
    rows = step_rows(os.path.join(out, "metrics.jsonl"))
    result = {"variant": name, "wall_s": time.perf_counter() - t0, "steps": rows,
              "summary": summarise(rows)}
    s = result["summary"]
    print(f"[{name}] steady step {s['step_s']:.2f} s = rollout {s['rollout_s']:.2f} + update "
          f"{s['update_s']:.2f} (forward {s['forward_s']:.2f}) + sync {s['sync_s']:.2f} + host "
          f"{s['host_s']:.2f}; first step {s['first_step_s']:.1f} s (compile ~"
          f"{s['compile_s_estimate']:.1f} s); rollout {s['rollout_tokens_per_s']:.0f} gen tok/s; "
          f"learner {s['learner_real_tokens_per_s']:.0f} real tok/s", flush=True)
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="experiments/babyai_grpo_gpu.py")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--variants", default="packed,padded")
    p.add_argument("--workdir", default=None)
    p.add_argument("--json", default=None)
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="config override for every variant (Python literal), e.g. "
                        "--set learner.attention_impl='pallas'")
    args = p.parse_args(argv)
    import ast

    for item in args.set:
        key, value = item.split("=", 1)
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            pass  # a bare string
        for overrides in VARIANTS.values():
            overrides.setdefault(key, value)
    import jax

    workdir = args.workdir or tempfile.mkdtemp(prefix="rl_step_")
    device = jax.devices()[0]
    print(f"device: {device.device_kind} x {jax.device_count()}; config {args.config}",
          flush=True)
    results = []
    for v in args.variants.split(","):
        if v:
            results.append(run_variant(args.config, v, args.steps, workdir))
            if args.json:  # after every variant: a later one may not finish
                with open(args.json, "w") as f:
                    json.dump({"device": device.device_kind, "config": args.config,
                               "results": results}, f, indent=2)
    if len(results) >= 2:
        a, b = results[0]["summary"], results[1]["summary"]
        print(f"steady step ratio {results[1]['variant']} / {results[0]['variant']}: "
              f"{b['step_s'] / a['step_s']:.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
