"""A run's step time over its horizon phases, read from its own ``metrics.jsonl`` (issue 49's
mean-step target for the headline run; docs/PERFORMANCE.md, "Actor workers in the headline
run").

    R=results/loop_h100_s59/headline_workers
    python benchmarks/analysis/step_by_horizon.py --run $R/headline_w0 --run $R/headline_w4

Over a run's training rows (those with ``batch/generated_tokens``), ordered by step, a step's
wall time is ``time[k] - time[k-1]`` (the row is written when its step ends), so the first
step of a session has none and is left out (it carries the compiles). Per horizon
(``train/horizon``) and over the whole run:

* steps = the timed steps; mean step = mean of their wall times;
* rollout, update = means of ``rollout/wall_s`` and ``perf/update_time_s`` over the same steps;
* rollout tok/s = sum ``rollout/generated_tokens`` / sum ``rollout/wall_s`` over the same
  steps (every generated token of the rollout, trained or not).

A step that follows a gap longer than ``--max-gap`` seconds (an evaluation, a resumed
session's start) is not timed either.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks.analysis.compare_runs import read_rows  # noqa: E402


def timed_steps(rows: list[dict], max_gap: float) -> list[dict[str, float]]:
    """The training rows with a wall time: ``{step, horizon, seconds, rollout, update,
    tokens}`` for every row after the first whose gap to the previous row is <= ``max_gap``."""
    train = sorted((r for r in rows if "batch/generated_tokens" in r and "time" in r),
                   key=lambda r: int(r["step"]))
    out = []
    for prev, row in zip(train, train[1:]):
        seconds = float(row["time"]) - float(prev["time"])
        if int(row["step"]) != int(prev["step"]) + 1 or not 0 < seconds <= max_gap:
            continue
        out.append({"step": int(row["step"]), "horizon": int(row["train/horizon"]),
                    "seconds": seconds, "rollout": float(row["rollout/wall_s"]),
                    "update": float(row["perf/update_time_s"]),
                    "tokens": float(row["rollout/generated_tokens"])})
    return out


def summarise(steps: list[dict[str, float]]) -> dict[str, float]:
    """Means over ``steps`` (module docstring); empty -> zero steps."""
    n = len(steps)
    if not n:
        return {"steps": 0}
    wall = sum(s["seconds"] for s in steps)
    return {"steps": n, "mean_step_s": wall / n,
            "rollout_s": sum(s["rollout"] for s in steps) / n,
            "update_s": sum(s["update"] for s in steps) / n,
            "rollout_tok_s": sum(s["tokens"] for s in steps) / sum(s["rollout"] for s in steps)}


def by_horizon(run: str, max_gap: float) -> dict[str, Any]:
    """One run: its summary per horizon (ascending) and over all its timed steps."""
    steps = timed_steps(read_rows(run), max_gap)
    horizons = sorted({s["horizon"] for s in steps})
    return {"run": run,
            "horizons": {h: summarise([s for s in steps if s["horizon"] == h])
                         for h in horizons},
            "all": summarise(steps)}


def markdown(reports: Sequence[dict[str, Any]]) -> str:
    lines = ["| run | horizon | steps | mean step | rollout | update | rollout tok/s |",
             "|---|---|---|---|---|---|---|"]
    for rep in reports:
        name = os.path.basename(os.path.normpath(rep["run"]))
        for label, s in [*rep["horizons"].items(), ("all", rep["all"])]:
            if not s["steps"]:
                continue
            lines.append(f"| {name} | {label} | {s['steps']} | {s['mean_step_s']:.2f} s | "
                         f"{s['rollout_s']:.2f} s | {s['update_s']:.2f} s | "
                         f"{s['rollout_tok_s']:,.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", action="append", required=True, help="a run folder (repeat)")
    p.add_argument("--max-gap", type=float, default=60.0,
                   help="seconds; a longer gap before a row leaves its step untimed")
    p.add_argument("--json", default=None, help="also write the numbers here")
    args = p.parse_args(argv)
    reports = [by_horizon(run, args.max_gap) for run in args.run]
    print(markdown(reports), end="")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(reports, f, indent=1)
    return reports


if __name__ == "__main__":
    main()
