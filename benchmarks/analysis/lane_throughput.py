"""How fast runs that shared a GPU went, read from their own ``metrics.jsonl`` over time windows
(docs/PERFORMANCE.md, "Lanes on one H200": three RL runs at once against one alone).

    R=results/scaling_equal_steps
    python benchmarks/analysis/lane_throughput.py \\
        --run $R/babyai_eq_fixed20_s0 --run $R/babyai_eq_scaling_s0 --run $R/babyai_eq_fixed6_s0 \\
        --window three_lanes=1796337660:1796337960 --window alone=1796338230:1796338400

A window is ``LABEL=START:END`` in Unix seconds (the training rows' ``time`` column; a call's
start and its lanes' start and end are in the jobs driver's ``timings.jsonl``). For each window
and run, over the training rows (those with ``batch/generated_tokens``) whose ``time`` t has
START <= t < END:

* steps = the rows; tokens = sum ``rollout/generated_tokens`` (every token the rollout
  generated; ``batch/generated_tokens`` counts only those of the groups trained on, without the
  flat groups skipped: ``trained_tokens``); turns = mean ``rollout/mean_turns``;
* seconds a step = (t_last - t_first) / (steps - 1) (from two rows on);

and over all runs: generated tok/s = sum tokens / (END - START), steps/s = sum steps /
(END - START).
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


def parse_window(text: str) -> tuple[str, float, float]:
    """``LABEL=START:END`` -> (label, start, end), END > START."""
    label, sep, span = text.partition("=")
    start, colon, end = span.partition(":")
    try:
        if not (sep and colon and label):
            raise ValueError
        lo, hi = float(start), float(end)
    except ValueError:
        raise ValueError(f"window {text!r}: expected LABEL=START:END (Unix seconds)") from None
    if hi <= lo:
        raise ValueError(f"window {text!r}: END must be after START")
    return label, lo, hi


def run_in_window(rows: list[dict], start: float, end: float) -> dict[str, Any]:
    """One run's training rows with ``start <= time < end``: their count, generated tokens,
    mean turns and seconds a step."""
    inside = sorted((r for r in rows if "batch/generated_tokens" in r and "time" in r
                     and start <= float(r["time"]) < end), key=lambda r: float(r["time"]))
    turns = [float(r["rollout/mean_turns"]) for r in inside if "rollout/mean_turns" in r]
    return {
        "steps": len(inside),
        "first_step": int(inside[0]["step"]) if inside else None,
        "last_step": int(inside[-1]["step"]) if inside else None,
        "generated_tokens": sum(float(r["rollout/generated_tokens"]) for r in inside),
        "trained_tokens": sum(float(r["batch/generated_tokens"]) for r in inside),
        "turns_mean": sum(turns) / len(turns) if turns else None,
        "seconds_per_step": ((float(inside[-1]["time"]) - float(inside[0]["time"]))
                             / (len(inside) - 1) if len(inside) > 1 else None),
    }


def throughput(runs: Sequence[str], windows: Sequence[tuple[str, float, float]]
               ) -> dict[str, Any]:
    """Per window: every run's numbers and the totals over runs (module docstring)."""
    rows = {run: read_rows(run) for run in runs}
    out: dict[str, Any] = {}
    for label, start, end in windows:
        per_run = {run: run_in_window(rows[run], start, end) for run in runs}
        seconds = end - start
        out[label] = {"start": start, "end": end, "seconds": seconds, "runs": per_run,
                      "generated_tok_s": sum(r["generated_tokens"] for r in per_run.values())
                      / seconds,
                      "steps_s": sum(r["steps"] for r in per_run.values()) / seconds}
    return out


def markdown(report: dict[str, Any]) -> str:
    lines = ["| window | run | steps | generated tok/s | s a step | turns |",
             "|---|---|---|---|---|---|"]
    for label, w in report.items():
        for run, r in w["runs"].items():
            if not r["steps"]:
                continue
            sps = "-" if r["seconds_per_step"] is None else f"{r['seconds_per_step']:.2f}"
            turns = "-" if r["turns_mean"] is None else f"{r['turns_mean']:.1f}"
            lines.append(f"| {label} | {os.path.basename(run)} | {r['first_step']}-"
                         f"{r['last_step']} | {r['generated_tokens'] / w['seconds']:,.0f} | "
                         f"{sps} | {turns} |")
        lines.append(f"| {label} | all ({w['seconds']:.0f} s) | {w['steps_s']:.2f}/s | "
                     f"{w['generated_tok_s']:,.0f} | | |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", action="append", required=True, help="a run folder (repeat)")
    p.add_argument("--window", action="append", required=True, help="LABEL=START:END (repeat)")
    p.add_argument("--json", default=None, help="also write the numbers here")
    args = p.parse_args(argv)
    try:
        windows = [parse_window(w) for w in args.window]
    except ValueError as e:
        p.error(str(e))
    report = throughput(args.run, windows)
    print(markdown(report), end="")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
