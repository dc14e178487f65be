"""Updates whose row count changes every step, as in a run that skips flat groups: the whole
sequence's wall time (compiles included) and its compiles, before and after, side by side.

A run's learner sees a different number of trajectories each step (GRPO drops groups whose
samples all earned the same reward). Each worker subprocess builds a random-weight policy of
``--shape`` and one learner, then updates once per entry of ``--rows`` (synthetic multi-turn
batches as in ``update_pipeline.py``, lengths in one length bucket), timing every update to
``block_until_ready`` of the parameters and counting XLA compiles (JAX's monitoring events)
per update. With ``--baseline-ref REF`` the library as of git commit ``REF`` runs the same
sequence first, in its own subprocess (fresh compile caches for both).

    # the CPU comparison of docs/PERFORMANCE.md (rows: a BabyAI run's batch/rows / 4)
    python3 benchmarks/contenders/row_counts.py --baseline-ref f50b026 --json out.json

The default ``--rows`` are the first 26 ``batch/rows`` of
``results/ablations/babyai_grpo_lr1e-4/metrics.jsonl.gz`` divided by 4.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # update_pipeline

DEFAULT_ROWS = "14,6,18,18,12,12,10,18,8,10,14,12,12,10,6,14,4,16,4,10,24,8,10,16,14,20"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline-ref", default=None, help="git commit of the 'before' library")
    p.add_argument("--shape", default="tiny", help="a shape of update_pipeline.SHAPES")
    p.add_argument("--rows", default=DEFAULT_ROWS, help="comma-separated rows per update")
    p.add_argument("--length", type=int, default=256, help="longest trajectory (tokens)")
    p.add_argument("--min-frac", type=float, default=0.6, help="shortest / longest length")
    p.add_argument("--group", type=int, default=2, help="samples per task (GRPO group)")
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def worker(args) -> dict:
    """Runs in the subprocess: one learner, one update per entry of ``--rows``."""
    import jax
    from jax._src import monitoring

    from agentrl_jax.learner import Learner, LearnerConfig
    from agentrl_jax.learner.batch import UpdateOptions
    from agentrl_jax.models.config import ModelConfig
    from agentrl_jax.models.llama import init_model
    from update_pipeline import SHAPES, synthetic_batch

    compiles: list[float] = []

    def listen(event, seconds, **_):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(seconds)
    monitoring.register_event_duration_secs_listener(listen)
    on_cpu = jax.devices()[0].platform == "cpu"
    model_cfg = ModelConfig(**SHAPES[args.shape])
    learner = Learner(init_model(model_cfg, seed=0),
                      LearnerConfig(kl_coef=0.0, entropy_coef=0.0,
                                    dtype="float32" if on_cpu else "bfloat16", remat=not on_cpu,
                                    micro_batch_size=args.micro_batch, learning_rate=1e-6,
                                    pack_length=0, advantage_estimator="grpo"))
    steps = []
    for i, rows in enumerate(int(r) for r in args.rows.split(",")):
        batch = synthetic_batch(argparse.Namespace(rows=rows, length=args.length,
                                                   min_frac=args.min_frac, group=args.group),
                                model_cfg.vocab_size, seed=i)
        before = len(compiles)
        t0 = time.perf_counter()
        metrics = learner.update(batch, UpdateOptions(log=False))
        jax.block_until_ready(learner.params)
        steps.append({"rows": rows, "seconds": time.perf_counter() - t0,
                      "compiles": len(compiles) - before,
                      "compile_s": sum(compiles[before:]),
                      "padded_rows": float(metrics["batch/padded_rows"])})
    return {"steps": steps, "total_s": sum(s["seconds"] for s in steps),
            "compiles": sum(s["compiles"] for s in steps),
            "compile_s": sum(s["compile_s"] for s in steps),
            "compiles_after_step_1": sum(s["compiles"] for s in steps[1:]),
            "padded_rows": sum(s["padded_rows"] for s in steps),
            "device": str(jax.devices()[0].device_kind)}


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return
    from update_pipeline import extract, run_tree

    worker_argv = [f"--shape={args.shape}", f"--rows={args.rows}", f"--length={args.length}",
                   f"--min-frac={args.min_frac}", f"--group={args.group}",
                   f"--micro-batch={args.micro_batch}"]
    report = {"args": vars(args)}
    with tempfile.TemporaryDirectory() as tmp:
        if args.baseline_ref:
            extract(args.baseline_ref, tmp)
            report["baseline"] = run_tree(tmp, worker_argv, script=__file__)
        report["new"] = run_tree(ROOT, worker_argv, script=__file__)
    for name in ("baseline", "new"):
        if name in report:
            r = report[name]
            print(f"{name:>8}: {len(r['steps'])} updates in {r['total_s']:.1f} s; "
                  f"{r['compiles']} compiles ({r['compile_s']:.1f} s), "
                  f"{r['compiles_after_step_1']} after the first update; "
                  f"{r['padded_rows']:.0f} padded rows in all")
    if "baseline" in report:
        ratio = report["baseline"]["total_s"] / report["new"]["total_s"]
        report["baseline_over_new"] = ratio
        print(f"baseline / new wall time: {ratio:.2f}x  (device: {report['new']['device']})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
