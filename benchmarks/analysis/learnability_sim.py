"""How many GRPO groups a task sampler leaves flat, simulated from measured per-task success.

    python benchmarks/analysis/learnability_sim.py \
        --runs results/textcraft_shuffled_dev/textcraft_shuffled_dev_s0 \
               results/textcraft_shuffled_dev_h100/textcraft_shuffled_dev_s{1,2} \
        --tasks 391 --json results/learnability_sim/textcraft_shuffled.json

A group (``--samples`` episodes of one task) is *flat* when all its episodes pass or all fail:
GRPO's advantages are then all zero and the group trains nothing. Each simulated task gets a
fixed success probability drawn (with replacement, seeded) from the per-task success shares of
the runs' final evaluations (``eval_episodes.jsonl.gz``: score > 0 at the runs' last evaluated
step, pooled over the runs); a step draws ``--tasks-per-step`` tasks with the real sampler
(``training/rl/task_sampler.make_task_sampler``: ``permutation`` or ``learnability`` with its
``rate`` and ``eps``), plays each as ``--samples`` Bernoulli episodes and shows them to the
sampler (``observe``), as the trainer does. Printed and written: the mean flat share per third
of ``--steps`` and overall, per sampler, over ``--seeds`` simulations.

What it leaves out: the policy does not learn (a task's success is fixed), and the horizon does
not grow, so a task failed early is as hard later; the shares bound how far a sampler can tilt
the draws towards groups with a gradient, not how much a run learns.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
from collections import defaultdict
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from agentrl_jax.agent.actor_pool import TaskRef  # noqa: E402
from agentrl_jax.training.rl.task_sampler import make_task_sampler  # noqa: E402

#: the samplers compared: name -> make_task_sampler's keywords
SAMPLERS: dict[str, dict[str, Any]] = {
    "permutation": {"sampling": "permutation"},
    "learnability rate 0.25": {"sampling": "learnability", "rate": 0.25, "eps": 0.05},
    "learnability rate 1": {"sampling": "learnability", "rate": 1.0, "eps": 0.05},
}


def final_success_shares(runs: list[str]) -> np.ndarray:
    """Per task, the share of its episodes with score > 0 at each run's last evaluated step,
    pooled over the runs (``[tasks]``: the runs evaluate the same tasks, so a task's share
    rests on ``runs x k`` episodes)."""
    by_task: dict[str, list[float]] = defaultdict(list)
    for run in runs:
        with gzip.open(os.path.join(run, "eval_episodes.jsonl.gz"), "rt") as f:
            rows = [json.loads(line) for line in f]
        last = max(r["step"] for r in rows)
        for r in rows:
            if r["step"] == last:
                by_task[r["task_id"]].append(float(r["reward"] > 0))
    return np.asarray([float(np.mean(v)) for v in by_task.values()])


def simulate(success: dict[str, float], sampler_kw: dict[str, Any], steps: int,
             tasks_per_step: int, samples: int, seed: int) -> np.ndarray:
    """The flat share of each step's groups (``[steps]``) under one sampler."""
    tasks = [TaskRef("env", name) for name in success]
    sampler = make_task_sampler(tasks, seed, **sampler_kw)
    rng = np.random.default_rng([seed, 1])
    flat = np.zeros(steps)
    for step in range(steps):
        episodes = []
        for task in sampler.next(tasks_per_step):
            wins = rng.random(samples) < success[task.task_id]
            flat[step] += bool(wins.all() or not wins.any())
            episodes += [{"env": "env", "task_id": task.task_id, "status": "done",
                          "reward": float(w), "success": bool(w)} for w in wins]
        if sampler.observes:
            sampler.observe(episodes)
    return flat / tasks_per_step


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", nargs="+", required=True, help="run folders with eval_episodes")
    p.add_argument("--tasks", type=int, required=True, help="simulated train tasks")
    p.add_argument("--steps", type=int, default=45)
    p.add_argument("--tasks-per-step", type=int, default=32)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    shares = final_success_shares(args.runs)
    report: dict[str, Any] = {
        "runs": args.runs, "measured_tasks": int(shares.size),
        "measured_mean_success": float(shares.mean()),
        "measured_never": float((shares == 0).mean()),
        "measured_always": float((shares == 1).mean()),
        "settings": {k: getattr(args, k) for k in ("tasks", "steps", "tasks_per_step", "samples",
                                                    "seeds")},
        "samplers": {}}
    print(f"{shares.size} measured task shares: mean {shares.mean():.3f}, never solved "
          f"{report['measured_never']:.3f}, always {report['measured_always']:.3f}")
    thirds = np.array_split(np.arange(args.steps), 3)
    print("| sampler | flat groups, steps by thirds | all steps |\n|---|---|---|")
    for name, kw in SAMPLERS.items():
        per_seed = []
        for seed in range(args.seeds):
            rng = np.random.default_rng([seed, 0])
            success = {f"t{i}": float(s) for i, s in enumerate(rng.choice(shares, args.tasks))}
            per_seed.append(simulate(success, kw, args.steps, args.tasks_per_step, args.samples,
                                     seed))
        flat = np.mean(per_seed, axis=0)
        by_third = [float(flat[idx].mean()) for idx in thirds]
        report["samplers"][name] = {"settings": kw, "flat_by_third": by_third,
                                    "flat": float(flat.mean())}
        print(f"| {name} | {' / '.join(f'{x:.2f}' for x in by_third)} | {flat.mean():.2f} |")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
