"""Start-up time of a run's embedded rollout engine: prefill KV buckets on / off, warm-up
compiles in parallel or one after another.

    python3 benchmarks/speed/engine_startup.py --config experiments/babyai.py:grpo_gpu \\
        --variants "seq:,seq:auto,par:,par:auto" --gpus 0,1,2,3 --json startup.json

A run prints this phase as ``starting rollout backend embedded ... done in``: the engine
compiles its decode step, every prefill shape (chunk x KV bucket: ``EngineConfig
.prefill_shapes``) and the row copy before the first request. A variant is
``WARMUP:BUCKETS``: ``seq`` (each shape compiled by its warm-up call in turn) or ``par``
(every shape compiled ahead of time at once on a thread pool: ``Engine.warmup(parallel=True)``,
the engine's default), and ``rollout.prefill_kv_buckets`` (``""`` the whole row, ``auto``
powers of two). Each variant runs in its own process (jit's cache is per process: a second
engine in one process would reuse the first one's compiles), on its own GPU with ``--gpus``
(variants side by side) or one after another on the default device. The model is a
random-init model of SmolLM2-135M's shape (compile time does not depend on the weights), the
engine sized as the config's run sizes it (``services.make_backend``). The time is the backend's
construction, weights placement included.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

if TYPE_CHECKING:
    from agentrl_jax.training.config.sections import RunConfig

WARMUPS = ("seq", "par")


def parse_variant(text: str) -> tuple[str, str]:
    """``"par:auto"`` -> ``("par", "auto")``; ``"seq:"`` -> ``("seq", "")``."""
    warmup, sep, buckets = text.partition(":")
    if not sep or warmup not in WARMUPS:
        raise ValueError(f"a variant is WARMUP:BUCKETS with WARMUP in {WARMUPS}, got {text!r}")
    return warmup, buckets


def load_config(path: str, prefill_kv_buckets: Any) -> RunConfig:
    """The ``RunConfig`` of experiment ``path`` (``file.py`` or ``file.py:variant``) with
    ``rollout.prefill_kv_buckets`` set to ``prefill_kv_buckets``."""
    from agentrl_jax.training.config.command_line import load_experiment
    from agentrl_jax.training.config.experiment import to_run_config

    config = load_experiment(path)
    config.rollout.prefill_kv_buckets = prefill_kv_buckets
    return to_run_config(config)


def one_variant(config_path: str, variant: str, shape: str) -> dict[str, Any]:
    """Build the run's rollout backend once in this process; its construction time."""
    import jax

    from agentrl_jax.models.llama import init_model
    from agentrl_jax.rollout.engine.engine import Engine
    from agentrl_jax.training.runtime import services
    from benchmarks.speed.engine import model_config

    warmup, buckets = parse_variant(variant)
    config = load_config(config_path, buckets)
    if warmup == "seq":
        Engine.warmup = functools.partialmethod(Engine.warmup, parallel=False)
    dtype = config.rollout.engine_dtype or "bfloat16"
    model = init_model(model_config(shape, dtype), seed=0)
    episodes = int(config.train.tasks_per_step) * int(config.train.samples_per_task)
    t0 = time.perf_counter()
    backend = services.make_backend(config, model, None, None, episodes=episodes)
    seconds = time.perf_counter() - t0
    engine_config = getattr(backend, "config", None)
    shapes = len(engine_config.prefill_shapes()) if engine_config is not None else None
    backend.close()
    return {"variant": variant, "warmup": warmup, "prefill_kv_buckets": buckets,
            "startup_s": round(seconds, 2), "prefill_shapes": shapes,
            "device": str(jax.devices()[0].device_kind), "cpus": os.cpu_count()}


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="experiments/babyai.py:grpo_gpu")
    p.add_argument("--variants", default="seq:,seq:auto,par:,par:auto",
                   help="comma list of WARMUP:BUCKETS (WARMUP: seq | par)")
    p.add_argument("--shape", default="smollm2-135m")
    p.add_argument("--gpus", default="", help="comma list of GPU ids: one variant per GPU, "
                   "side by side (default: one after another on the default device)")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child process
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)
    if args.one is not None:
        print(json.dumps(one_variant(args.config, args.one, args.shape)), flush=True)
        return []
    variants = [v for v in args.variants.split(",")]
    for v in variants:
        parse_variant(v)
    gpus = [g for g in args.gpus.split(",") if g]
    if gpus and len(gpus) < len(variants):
        p.error(f"--gpus gives {len(gpus)} GPU(s) for {len(variants)} variants")

    def child(variant: str, gpu: str | None) -> subprocess.Popen:
        env = dict(os.environ)
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu
        return subprocess.Popen([sys.executable, __file__, "--config", args.config, "--shape",
                                 args.shape, "--one", variant], env=env,
                                stdout=subprocess.PIPE, text=True)

    results = []
    if gpus:
        procs = [child(v, g) for v, g in zip(variants, gpus)]
        outputs = [proc.communicate()[0] for proc in procs]
    else:
        outputs = [child(v, None).communicate()[0] for v in variants]
    for variant, out in zip(variants, outputs):
        lines = [line for line in out.splitlines() if line.startswith("{")]
        results.append(json.loads(lines[-1]) if lines else {"variant": variant,
                                                             "error": "no result"})
    for r in results:
        print(f"{r['variant']:<12} start-up {r.get('startup_s', '-'):>7} s  prefill shapes "
              f"{r.get('prefill_shapes', '-')}  {r.get('device', r.get('error'))}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main()
