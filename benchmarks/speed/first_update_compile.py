"""Wall time of compiling the first packed update's programs (``learner/ahead.py``) from a run
config's description alone (``policy.abstract_learner``: no weights loaded), one program after
another against side by side, each variant in a fresh process (nothing in jit's caches).

    python benchmarks/speed/first_update_compile.py --config experiments/babyai.py:grpo_gpu
    python benchmarks/speed/first_update_compile.py --config experiments/smoke.py \\
        --pack-length 1024                                     # CPU taste (smoke has no packing)

``--workers 1,0``: 1 = one after another, 0 = the default (one thread a program, at most the CPU
count). Prints one line per variant (wall time and each program's seconds) and, with
``--json``, writes them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)


def compile_once(config: str, pack_length: int, workers: int) -> dict:
    """In this process: describe the learner of ``config`` and compile its first update."""
    from agentrl_jax.learner.ahead import compile_first_update
    from agentrl_jax.training.config.command_line import load_experiment
    from agentrl_jax.training.config.experiment import to_run_config
    from agentrl_jax.training.rl.schedule import HorizonSchedule, scored_tokens_bound
    from agentrl_jax.training.runtime.policy import abstract_learner

    c = load_experiment(config)
    if pack_length:
        c.learner.pack_length = pack_length
    run = to_run_config(c)
    described = abstract_learner(run)
    # the scored-head capacity the trainer reserves before it compiles ahead
    described.scored_capacity.reserve(scored_tokens_bound(
        HorizonSchedule.from_config(run.horizon), run.rollout.max_new_tokens))
    t0 = time.monotonic()
    seconds = compile_first_update(described, workers=workers or None,
                                   option_counts=run.agent.option_limits)
    return {"workers": workers, "wall_s": round(time.monotonic() - t0, 2),
            "programs_s": {k: round(v, 2) for k, v in seconds.items()},
            "cpu_count": os.cpu_count()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="experiments/babyai.py:grpo_gpu")
    p.add_argument("--pack-length", type=int, default=0, help="0: the config's")
    p.add_argument("--workers", default="1,0")
    p.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if args.one is not None:  # the child process
        print(json.dumps(compile_once(args.config, args.pack_length, args.one)))
        return
    rows = []
    for workers in (int(w) for w in args.workers.split(",")):
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--config", args.config,
                              "--pack-length", str(args.pack_length), "--one", str(workers)],
                             cwd=ROOT, capture_output=True, text=True, check=False)
        if out.returncode:
            raise SystemExit(f"workers={workers} failed:\n{out.stderr[-3000:]}")
        row = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(f"workers={workers or 'default'}: {row['wall_s']:.1f} s wall; "
              + ", ".join(f"{k} {v:.1f} s" for k, v in row["programs_s"].items()), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": args.config, "pack_length": args.pack_length, "runs": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
