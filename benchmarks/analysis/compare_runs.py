"""Compare two runs' logged metrics step by step (e.g. 2 processes x 1 GPU vs 1 process x 2 GPUs
of the same config and seed).

    python benchmarks/analysis/compare_runs.py RUN_A RUN_B [--keys k1,k2] [--json out.json]

Reads ``metrics.jsonl`` (or ``.gz``) of both workdirs; for every step both logged, prints each key's values
and absolute / relative difference, and checks that each step appears exactly once per run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from agentrl_common.jsonl_files import read_run_file  # noqa: E402

KEYS = ("rollout/episodes", "rollout/mean_reward", "rollout/generated_tokens",
        "rollout/mean_turns", "batch/real_tokens", "actor/pg_loss", "actor/entropy",
        "actor/grad_norm", "actor/ppo_kl", "eval/avg@1", "eval/pass@1")


def read_rows(workdir: str) -> list[dict]:
    """``workdir``'s ``metrics.jsonl`` rows (or ``metrics.jsonl.gz``'s: a committed run)."""
    return read_run_file(workdir, "metrics.jsonl")


def by_step(rows: list[dict]) -> dict[int, dict]:
    """Rows of one step merged (training and evaluation rows of a step are logged apart)."""
    merged: dict[int, dict] = {}
    for row in rows:
        merged.setdefault(int(row["step"]), {}).update(row)
    return merged


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run_a")
    p.add_argument("run_b")
    p.add_argument("--keys", default=",".join(KEYS))
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    rows_a, rows_b = read_rows(args.run_a), read_rows(args.run_b)
    report: dict = {"run_a": args.run_a, "run_b": args.run_b, "steps": {}}
    for name, rows in (("run_a", rows_a), ("run_b", rows_b)):
        counts = Counter((int(r["step"]), "eval" if any(k.startswith("eval/") for k in r)
                          else "train") for r in rows)
        report[f"{name}_duplicate_rows"] = sorted(f"{s}:{k}" for (s, k), n in counts.items()
                                                  if n > 1)
    a, b = by_step(rows_a), by_step(rows_b)
    keys = [k for k in args.keys.split(",") if k]
    print(f"{'step':>4} {'key':<26} {'A':>12} {'B':>12} {'|A-B|':>10} {'rel':>8}")
    for step in sorted(set(a) & set(b)):
        out = {}
        for key in keys:
            if key in a[step] and key in b[step]:
                x, y = float(a[step][key]), float(b[step][key])
                rel = abs(x - y) / max(abs(x), abs(y), 1e-12)
                out[key] = {"a": x, "b": y, "abs_diff": abs(x - y), "rel_diff": rel}
                print(f"{step:>4} {key:<26} {x:>12.5g} {y:>12.5g} {abs(x - y):>10.3g} "
                      f"{rel:>8.2%}")
        report["steps"][str(step)] = out
    print("duplicate step rows:", report["run_a_duplicate_rows"] or "none (A)",
          report["run_b_duplicate_rows"] or "none (B)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return report


if __name__ == "__main__":
    main()
