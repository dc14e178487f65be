"""A whole RL step, timed part by part: rollout, learner log-prob passes, update, weight sync,
host work. Runs the real trainer (environment servers, embedded engine, actor pool, learner)
for a few steps per variant, in one process, and reads the per-step metrics it logs.

    python benchmarks/speed/rl_step.py                                   # GPU: BabyAI, SmolLM2
    python benchmarks/speed/rl_step.py --steps 6 --variants packed,padded --json out.json
    python benchmarks/speed/rl_step.py --config experiments/smoke.py --steps 3   # CPU smoke run

Variants (each a set of config overrides on ``--config``):
  packed  the config as given (packed learner rows, flat groups skipped when the config does)
  padded  the previous learner path: rows padded to power-of-two length buckets, every group
          trained, XLA / cuDNN causal attention (``learner.pack_length=0``,
          ``train.skip_flat_groups=False``, ``learner.attention_impl=None``)
  overlap the config with ``train.max_staleness=1``: step s+1's rollout runs during update s
          (one-step off-policy). ``step`` is then the wait for the rollout's rest + update +
          sync + host, ``rollout`` the rollout's own wall (it overlaps the update), so ``host``
          (step - rollout - update - sync) is no longer the host's share and can be negative
  bf16_engine  the config with a bfloat16 engine (``rollout.engine_dtype``; the learner keeps its
          dtype): a faster prefill and decode, at the price of a larger sampler / learner
          log-prob mismatch (``ratio_min`` / ``ratio_max`` per step; ``learner.tis_cap`` corrects it)
  bf16_engine_overlap  both of the above
  dense_prefill  the config with the engine's prefill attention as XLA einsums over the call's
          whole KV length (``rollout.prefill_attention="dense"``, the engine before the flash
          prefill kernel): the baseline of ``packed`` on a GPU
  in_cache_prefill  the config with the flash prefill kernel reading the rows where they are
          in the cache (``rollout.prefill_attention="flash_in_cache"``: no gathered copy)
  no_remat  the config without rematerialisation in the learner (``learner.remat=False``: no
          recomputed forward in the backward pass, more activation memory)
  in_cache_no_remat  both of the above
  no_compile_ahead  the config without compiling the first update ahead of time on a background
          thread (``train.compile_ahead=False``: the first update compiles it)

``--fresh-process`` runs each variant in its own Python process: in one process the first
trainer's update is slower than the later ones' for the same batches (docs/PERFORMANCE.md,
"Our engine beside SGLang"), which favours every variant after the first.

Per step: ``step`` (wall, rollout included), ``rollout`` (actor pool wall), ``update``
(learner.update: old / reference log-probs + optimiser steps) = ``logprob`` (the forward-only
log-prob passes, ``forward`` in earlier files) + ``optimizer`` (the rest: forward + backward +
AdamW over the micro-batches), ``sync`` (weights to the engine), ``host`` (the rest: batch
assembly, logging). Steady state = the median over steps 2..N; the first step's extra time
(``first - steady``) is compilation. Rollout throughput = generated tokens / rollout wall;
learner throughput = real (unpadded) tokens / update time.

The JSON also records the visible devices, each device's peak memory
(``memory_stats()['peak_bytes_in_use']``, where the backend reports it) and, when a variant
fails (e.g. out of device memory), its error, with exit code 1; what ran before is kept.
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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

VARIANTS = {
    "packed": {},
    "overlap": {"train.max_staleness": 1},
    "bf16_engine": {"rollout.engine_dtype": "bfloat16"},
    "bf16_engine_overlap": {"rollout.engine_dtype": "bfloat16", "train.max_staleness": 1},
    "dense_prefill": {"rollout.prefill_attention": "dense"},
    "in_cache_prefill": {"rollout.prefill_attention": "flash_in_cache"},
    "no_remat": {"learner.remat": False},
    "in_cache_no_remat": {"rollout.prefill_attention": "flash_in_cache", "learner.remat": False},
    "no_compile_ahead": {"train.compile_ahead": False},
    "padded": {"learner.pack_length": 0, "train.skip_flat_groups": False,
               "learner.attention_impl": None},
}


def load_config(path: str, steps: int, overrides: dict):
    from agentrl_jax.training.config.command_line import load_experiment

    c = load_experiment(path)  # path or path:variant
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
            forward = m.get("perf/forward_time_s", 0.0)
            rows.append({
                "step": m["step"], "step_s": step, "rollout_s": rollout, "update_s": update,
                "forward_s": forward, "logprob_s": forward, "optimizer_s": update - forward,
                "sync_s": sync,
                "host_s": step - rollout - update - sync,
                "generated_tokens": m.get("rollout/generated_tokens", 0.0),
                "real_tokens": m.get("batch/real_tokens",
                                     m.get("sequence_length/mean", 0.0) * m.get("batch/rows", 0)),
                "episodes": m.get("rollout/episodes", 0.0),
                "reward": m.get("rollout/mean_reward", 0.0),
                "ratio_min": m.get("rollout/behaviour_ratio_min"),
                "ratio_max": m.get("rollout/behaviour_ratio_max"),
                "lp_diff_mean": m.get("rollout/logprob_abs_diff_mean"),
                "statuses": {k.split("/", 2)[2]: v for k, v in m.items()
                             if k.startswith("rollout/status/")},
                "flat_groups_skipped": m.get("rollout/flat_groups_skipped", 0.0),
                # the update's shapes (docs/LEARNER.md, "One token space a run"): packed rows
                # holding tokens / run, accumulate calls, log-prob rows, token-space rows, and
                # the XLA compiles during the update (0 in a steady step), the garbage
                # collections during it and the update thread's CPU seconds
                **{k.split("/", 1)[1]: m[k] for k in (
                    "learner/rows", "learner/rows_padded", "learner/micro_batches",
                    "learner/logprob_rows", "learner/logprob_rows_padded",
                    "learner/token_space_rows", "perf/update_compiles", "perf/update_gc_s",
                    "perf/update_gc_full", "perf/update_thread_cpu_s") if k in m},
                "updated": "perf/update_time_s" in m})
    return rows


def summarise(rows: list[dict]) -> dict:
    steady = rows[1:] or rows

    def med(key):
        return statistics.median(r[key] for r in steady)

    out = {k: med(k) for k in ("step_s", "rollout_s", "update_s", "forward_s", "logprob_s",
                               "optimizer_s", "sync_s", "host_s")}
    out["first_step_s"] = rows[0]["step_s"]
    out["compile_s_estimate"] = rows[0]["step_s"] - out["step_s"]
    out["rollout_tokens_per_s"] = med("generated_tokens") / max(out["rollout_s"], 1e-9)
    upd = [r["real_tokens"] / r["update_s"] for r in steady if r["update_s"] > 0]
    out["learner_real_tokens_per_s"] = statistics.median(upd) if upd else 0.0
    out["episodes"] = med("episodes")
    out["steps_with_update"] = sum(bool(r["updated"]) for r in rows)
    # XLA compiles inside the steady steps' updates (a new update shape mid-run; 0 expected)
    out["steady_update_compiles"] = sum(r.get("update_compiles", 0.0) for r in steady)
    return out


def device_memory() -> list[dict]:
    """Per visible device: peak and current bytes in use and the allocator's limit (GiB),
    where the backend reports them (GPUs do; CPU: None)."""
    import jax

    out = []
    for d in jax.local_devices():
        try:
            stats = d.memory_stats() or {}
        except Exception:  # noqa: BLE001 -- backends without memory stats
            stats = {}
        gib = {k: (stats[k] / 2 ** 30 if k in stats else None)
               for k in ("peak_bytes_in_use", "bytes_in_use", "bytes_limit")}
        out.append({"device": str(d), **gib})
    return out


def run_variant(config_path: str, name: str, steps: int, workdir: str,
                checkpoint: bool = False) -> dict:
    from agentrl_jax.training.rl.stop_policy import Checkpoints
    from agentrl_jax.training.rl.trainer import Trainer

    class BenchCheckpoints(Checkpoints):
        """The trainer's checkpoints without the one of the last step (taken after the step's
        time is measured, but a Qwen2.5-7B shape's parameters + AdamW are 85 GiB to write)."""

        def save(self, learner, step, cursor, train_seconds, sampler=None):
            if checkpoint:
                super().save(learner, step, cursor, train_seconds, sampler=sampler)

    config = load_config(config_path, steps, VARIANTS[name])
    out = os.path.join(workdir, name)
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    trainer = Trainer(config, out, progress=False)
    trainer.checkpoints = BenchCheckpoints(trainer.output.say)
    trainer.run()
    rows = step_rows(os.path.join(out, "metrics.jsonl"))
    result = {"variant": name, "wall_s": time.perf_counter() - t0, "steps": rows,
              "pid": os.getpid()}
    if not rows:
        raise RuntimeError(f"variant {name}: the trainer logged no step ({out}/metrics.jsonl)")
    result["summary"] = summarise(rows)
    result["memory"] = device_memory()
    s = result["summary"]
    print(f"[{name}] steady step {s['step_s']:.2f} s = rollout {s['rollout_s']:.2f} + update "
          f"{s['update_s']:.2f} (logprob {s['logprob_s']:.2f} + optimizer "
          f"{s['optimizer_s']:.2f}) + sync {s['sync_s']:.2f} + host "
          f"{s['host_s']:.2f}; first step {s['first_step_s']:.1f} s (compile ~"
          f"{s['compile_s_estimate']:.1f} s); rollout {s['rollout_tokens_per_s']:.0f} gen tok/s; "
          f"learner {s['learner_real_tokens_per_s']:.0f} real tok/s; "
          f"{s['steady_update_compiles']:.0f} compiles in the steady updates", flush=True)
    return result


def run_in_processes(args: argparse.Namespace) -> int:
    """``--fresh-process``: this script once per variant, each in a new Python process (this
    one never starts JAX, so it holds no device memory); their JSON files merged into
    ``--json`` in variant order. Returns 1 if any variant failed."""
    import subprocess

    workdir = args.workdir or tempfile.mkdtemp(prefix="rl_step_")
    os.makedirs(workdir, exist_ok=True)
    header: dict = {}
    results: list[dict] = []
    failed = False
    for i, v in enumerate(x for x in args.variants.split(",") if x):
        part = os.path.join(workdir, f"process{i}_{v}.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--config", args.config,
               "--steps", str(args.steps), "--variants", v,
               "--workdir", os.path.join(workdir, f"process{i}"), "--json", part,
               "--label", args.label, *(["--checkpoint"] if args.checkpoint else []),
               *[a for item in args.set for a in ("--set", item)]]
        code = subprocess.call(cmd)
        failed |= code != 0
        try:
            with open(part) as f:
                data = json.load(f)
        except (OSError, ValueError) as e:  # the process died before writing its JSON
            data = {"results": [{"variant": v, "steps": [],
                                 "error": f"process exited with code {code}: {e}"}]}
        header = header or {k: val for k, val in data.items() if k != "results"}
        results.extend(data["results"])
        if args.json:
            with open(args.json, "w") as f:
                json.dump({**header, "fresh_process": True, "results": results}, f, indent=2)
    done = [r for r in results if "summary" in r]
    if len(done) >= 2:
        a, b = done[0]["summary"], done[1]["summary"]
        print(f"steady step ratio {done[1]['variant']} / {done[0]['variant']}: "
              f"{b['step_s'] / a['step_s']:.2f}x (separate processes)", flush=True)
    return 1 if failed else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="experiments/babyai.py:grpo_gpu")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--variants", default="packed,padded")
    p.add_argument("--workdir", default=None)
    p.add_argument("--json", default=None)
    p.add_argument("--label", default="", help="free text stored in the JSON (e.g. '4 GPUs')")
    p.add_argument("--checkpoint", action="store_true",
                   help="let the trainer save its final checkpoint (off: a benchmark)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="config override for every variant (Python literal), e.g. "
                        "--set learner.attention_impl='pallas'")
    p.add_argument("--fresh-process", action="store_true",
                   help="run each variant in its own Python process (the first trainer of a "
                        "process updates slower than later ones: docs/PERFORMANCE.md)")
    args = p.parse_args(argv)
    if args.fresh_process:
        return run_in_processes(args)
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
    header = {"device": device.device_kind, "num_devices": jax.device_count(),
              "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
              "config": args.config, "steps": args.steps, "overrides": args.set,
              "label": args.label, "checkpoint": args.checkpoint}
    results: list[dict] = []
    failed = False

    def save() -> None:
        if args.json:  # after every variant: a later one may not finish
            with open(args.json, "w") as f:
                json.dump({**header, "results": results}, f, indent=2)

    save()
    for v in args.variants.split(","):
        if not v:
            continue
        t0 = time.perf_counter()
        try:
            results.append(run_variant(args.config, v, args.steps, workdir, args.checkpoint))
        except BaseException as e:  # noqa: BLE001 -- recorded (an OOM is a result), re-raised
            failed = True
            msg = f"{type(e).__name__}: {e}"
            print(f"[{v}] FAILED after {time.perf_counter() - t0:.1f} s: {msg[:2000]}",
                  flush=True)
            try:  # the steps it finished before failing
                partial = step_rows(os.path.join(workdir, v, "metrics.jsonl"))
            except (OSError, ValueError):
                partial = []
            results.append({"variant": v, "wall_s": time.perf_counter() - t0,
                            "steps": partial, "error": msg[:20000],
                            "out_of_memory": "RESOURCE_EXHAUSTED" in msg
                            or "out of memory" in msg.lower(),
                            "memory": device_memory()})
            save()
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            continue
        save()
    if failed:
        return 1
    if len(results) >= 2:
        a, b = results[0]["summary"], results[1]["summary"]
        print(f"steady step ratio {results[1]['variant']} / {results[0]['variant']}: "
              f"{b['step_s'] / a['step_s']:.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
