"""``Learner.update`` before and after, side by side on one machine (same inputs, same shape).

With ``--baseline-ref REF`` the library as of git commit ``REF`` is extracted
(``git archive REF agentrl_jax [agentrl_common] | tar -x``) into a temporary directory and the
same update runs in a subprocess with that tree first on ``PYTHONPATH``; then the working
tree's library runs in a second subprocess. Each subprocess builds a random-weight policy of
``--shape``, a synthetic multi-turn batch (``--rows`` trajectories, lengths drawn between
``--min-frac`` and 1 of ``--length``, alternating generated / observation spans, groups of
``--group`` samples), runs ``--warmup`` updates (compiles) and then ``--repeats`` timed updates
(wall time to ``block_until_ready`` of the parameters) per layout (padded rows, packed rows).
Reported: the median seconds per update of each tree and their ratio (new / baseline).

    # GPU (the comparison to report):
    python3 benchmarks/contenders/update_pipeline.py --baseline-ref c9c0739 --shape smollm2-135m --json out.json
    # CPU smoke run (checks the script, not a performance figure):
    python3 benchmarks/contenders/update_pipeline.py --baseline-ref c9c0739 --shape tiny --rows 8 --length 128

``--baseline-tree DIR`` takes an already extracted library instead (a machine without the git
history). ``--rounds N`` alternates baseline and new runs N times (less drift on a shared
machine). Without either only the working tree is timed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SHAPES = {
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                         num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64,
                         tie_word_embeddings=True, rope_theta=100000.0, rms_norm_eps=1e-5),
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2,
                 num_heads=4, num_kv_heads=2, head_dim=16),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline-ref", default=None, help="git commit of the 'before' library")
    p.add_argument("--baseline-tree", default=None,
                   help="a directory holding the 'before' agentrl_jax (instead of --baseline-ref)")
    p.add_argument("--rounds", type=int, default=1,
                   help="alternate baseline / new runs this many times (medians over all)")
    p.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-135m")
    p.add_argument("--rows", type=int, default=64, help="trajectories per update")
    p.add_argument("--group", type=int, default=8, help="samples per task (GRPO group)")
    p.add_argument("--length", type=int, default=2048, help="longest trajectory (tokens)")
    p.add_argument("--min-frac", type=float, default=0.25, help="shortest / longest length")
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--mini-batches", type=int, default=2)
    p.add_argument("--pack-length", type=int, default=0,
                   help="packed layout row length (default: --length)")
    p.add_argument("--layouts", default="padded,packed")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ------------------------------------------------------------------------------ worker side
def synthetic_batch(args, vocab: int, seed: int = 0) -> dict:
    import numpy as np
    rng = np.random.default_rng(seed)
    b, t = args.rows, args.length
    lens = rng.integers(max(2, int(args.min_frac * t)), t + 1, b)
    lens[0] = t
    attn = (np.arange(t)[None] < lens[:, None]).astype(np.int32)
    loss = np.zeros((b, t), np.float32)
    # turn spans [lo, hi) in tokens: trained (actions) and observation; other scripts' args
    # may not carry them
    act = getattr(args, "action_tokens", (8, 48))
    obs = getattr(args, "observation_tokens", (32, 160))
    for i in range(b):
        pos, gen = int(rng.integers(16, 64)), True  # prompt, then turns
        while pos < lens[i]:
            span = int(rng.integers(*act)) if gen else int(rng.integers(*obs))
            if gen:
                loss[i, pos:min(pos + span, lens[i])] = 1
            pos, gen = pos + span, not gen
    return {"tokens": (rng.integers(1, vocab, (b, t)) * attn).astype(np.int32),
            "attention_mask": attn, "loss_mask": loss,
            "rollout_logprobs": (-rng.random((b, t)) * loss).astype(np.float32),
            "group_id": (np.arange(b) // args.group).astype(np.int32),
            "reward": rng.random(b).astype(np.float32)}


def worker(args) -> dict:
    import jax

    from agentrl_jax.learner import Learner, LearnerConfig
    from agentrl_jax.models.config import ModelConfig
    from agentrl_jax.models.llama import init_model
    try:  # the typed options of the new pipeline; the baseline takes (batch, log)
        from agentrl_jax.learner.batch import UpdateOptions
        opts = UpdateOptions(log=False)
    except ImportError:
        opts = False

    on_cpu = jax.devices()[0].platform == "cpu"
    model_cfg = ModelConfig(**SHAPES[args.shape])
    model = init_model(model_cfg, seed=0)
    batch = synthetic_batch(args, model_cfg.vocab_size)
    results = {}
    for layout in args.layouts.split(","):
        pack = (args.pack_length or args.length) if layout == "packed" else 0
        cfg = LearnerConfig(entropy_coef=0.0, dtype="float32" if on_cpu else "bfloat16",
                            remat=not on_cpu,
                            micro_batch_size=args.micro_batch, mini_batches=args.mini_batches,
                            kl_coef=1e-3, ratio_source="recompute", pack_length=pack,
                            learning_rate=1e-6)
        learner = Learner(model, cfg)
        times = []
        for i in range(args.warmup + args.repeats):
            t0 = time.perf_counter()
            metrics = learner.update(batch, opts)
            jax.block_until_ready(learner.params)
            if i >= args.warmup:
                times.append(time.perf_counter() - t0)
        results[layout] = {"median_s": statistics.median(times), "times_s": times,
                           "pg_loss_last": float(metrics["actor/pg_loss"]),
                           "rows": float(metrics["batch/rows"])}
        del learner
    results["device"] = str(jax.devices()[0].device_kind)
    results["library"] = os.path.dirname(__import__("agentrl_jax").__file__)
    return results


# ------------------------------------------------------------------------------ driver side
def run_tree(pythonpath: str, argv: list[str], script: str = __file__) -> dict:
    """``script --worker *argv`` with ``pythonpath`` as PYTHONPATH (and working directory), in
    its own process: the JSON of its last output line."""
    env = dict(os.environ, PYTHONPATH=pythonpath)
    out = subprocess.run([sys.executable, os.path.abspath(script), "--worker", *argv],
                         env=env, capture_output=True, text=True, cwd=pythonpath)
    if out.returncode:
        sys.stderr.write(out.stderr[-4000:])
        raise SystemExit(f"the update run with PYTHONPATH={pythonpath} failed "
                         f"(exit {out.returncode})")
    return json.loads(out.stdout.strip().splitlines()[-1])


def extract(ref: str, into: str) -> None:
    """The library packages as of ``ref`` under ``into``."""
    paths = [p for p in ("agentrl_jax", "agentrl_common")
             if subprocess.run(["git", "cat-file", "-e", f"{ref}:{p}"], cwd=ROOT,
                               capture_output=True).returncode == 0]
    archive = subprocess.run(["git", "archive", ref, *paths], cwd=ROOT, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)


def merge(results: list[dict], layouts: list[str]) -> dict:
    """One entry per layout over several runs of a tree: all times, their median."""
    out = {k: v for k, v in results[-1].items() if k not in layouts}
    for layout in layouts:
        times = [t for r in results for t in r[layout]["times_s"]]
        out[layout] = {**results[-1][layout], "times_s": times,
                       "median_s": statistics.median(times)}
    return out


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return
    passthrough = [a for a in (argv if argv is not None else sys.argv[1:])]
    drop = {"--baseline-ref", "--baseline-tree", "--json", "--rounds"}
    worker_argv, skip = [], False
    for a in passthrough:
        if skip:
            skip = False
            continue
        if a.split("=")[0] in drop:
            skip = "=" not in a
            continue
        worker_argv.append(a)
    report = {"shape": args.shape, "rows": args.rows, "length": args.length,
              "baseline_ref": args.baseline_ref or args.baseline_tree}
    with tempfile.TemporaryDirectory() as tmp:
        base = os.path.abspath(args.baseline_tree) if args.baseline_tree else None
        if args.baseline_ref and not base:
            extract(args.baseline_ref, tmp)
            base = tmp
        runs: dict[str, list[dict]] = {"baseline": [], "new": []}
        for _ in range(args.rounds):
            if base:
                runs["baseline"].append(run_tree(base, worker_argv))
            runs["new"].append(run_tree(ROOT, worker_argv))
    for name, results in runs.items():
        if results:
            report[name] = merge(results, args.layouts.split(","))
    for layout in args.layouts.split(","):
        new = report["new"][layout]["median_s"]
        line = f"{layout:>7}: new {new:.3f} s/update"
        if "baseline" in report:
            old = report["baseline"][layout]["median_s"]
            report.setdefault("ratio_new_over_baseline", {})[layout] = new / old
            line += f", baseline {old:.3f} s/update, new/baseline {new / old:.3f}"
        print(line)
    print(f"device: {report['new']['device']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
