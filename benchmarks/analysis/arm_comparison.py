"""Two arms of a recipe comparison, seed by seed, from their committed evaluation episodes:
Avg@k / Pass@k / success rate before and after (``training/evaluation/eval_metrics.py``), the invalid-action
share per turn and the context-limit share of the episodes, the gains over the first evaluation
and the paired difference B - A at the last one, each with a Student-t 95% interval over the
seeds (``seed_stats.t_interval``).

    python benchmarks/analysis/arm_comparison.py \\
        --a results/choice_dev/babyai_action_dev{,_s1,_s2} \\
        --b results/choice_dev/babyai_choice_dev{,_s1,_s2} --k 4

Run folders are paired in the order given (the same training seed at the same position). A
run folder without evaluation episodes (they did not come back from the machine) is read from
its ``summary.json`` evaluations instead, when they were scored with the paper's metric at the
same k: Avg@k, Pass@k and the success rate only, the folder named under ``"from_summary"``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
from typing import Any, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from agentrl_common.jsonl_files import find_run_file, read_run_file  # noqa: E402
from agentrl_jax.training.evaluation import eval_metrics  # noqa: E402
from benchmarks.analysis.seed_stats import t_interval  # noqa: E402

METRICS = ("avg_at_k", "pass_at_k", "success_rate")


def summary_evaluations(run: str, k: int) -> dict[int, dict[str, Any]]:
    """``{step: {metric: value}}`` of :data:`METRICS` from ``run``'s ``summary.json``
    (``evals``), refused (SystemExit) unless each was scored with the paper's metric at ``k``."""
    path = os.path.join(run, "summary.json")
    if not os.path.exists(path):
        raise SystemExit(f"{run}: neither eval_episodes.jsonl[.gz] nor summary.json")
    with open(path) as f:
        evals = json.load(f).get("evals") or {}
    out = {}
    for step, entry in evals.items():
        if entry.get("scoring") != "paper" or int(entry.get("k", -1)) != k:
            raise SystemExit(f"{path}: the evaluation of step {step} is not scored with the "
                             f"paper's metric at k = {k} (scoring {entry.get('scoring')!r}, "
                             f"k {entry.get('k')!r})")
        out[int(step)] = {m: float(entry[m]) for m in METRICS}
    if not out:
        raise SystemExit(f"{path}: no evaluations")
    return out


def evaluations(run: str, k: int) -> dict[int, dict[str, Any]]:
    """``{step: {metric: value, "invalid_per_turn", "context_limit_share"}}`` of one run's
    ``eval_episodes.jsonl`` (or ``eval_episodes.jsonl.gz``); without that file,
    :func:`summary_evaluations` (the metrics alone)."""
    if find_run_file(run, "eval_episodes.jsonl") is None:
        return summary_evaluations(run, k)
    by_step: dict[int, list[dict]] = collections.defaultdict(list)
    for episode in read_run_file(run, "eval_episodes.jsonl"):
        by_step[int(episode["step"])].append(episode)
    out = {}
    for step, episodes in sorted(by_step.items()):
        scores = eval_metrics.score(eval_metrics.outcomes(episodes), k)
        turns = sum(int(e.get("num_turns") or 0) for e in episodes)
        out[step] = {**{m: getattr(scores, m) for m in METRICS},
                     "invalid_per_turn": sum(int(e.get("invalid_actions") or 0)
                                             for e in episodes) / max(turns, 1),
                     "context_limit_share": sum(e.get("status") == "context_limit"
                                                for e in episodes) / len(episodes)}
    return out


def _fmt(entry: dict[str, float]) -> str:
    return (f"{100 * entry['mean']:+.1f} [{100 * entry['ci95_low']:+.1f}, "
            f"{100 * entry['ci95_high']:+.1f}]")


def compare(a_runs: Sequence[str], b_runs: Sequence[str], k: int) -> dict[str, Any]:
    """The comparison's numbers (the module docstring), printed and returned."""
    if len(a_runs) != len(b_runs) or len(a_runs) < 2:
        raise SystemExit("give the same number (>= 2) of run folders for --a and --b")
    arms = {"a": [evaluations(r, k) for r in a_runs], "b": [evaluations(r, k) for r in b_runs]}
    report: dict[str, Any] = {"runs": {"a": list(a_runs), "b": list(b_runs)}}
    from_summary = [r for r in (*a_runs, *b_runs) if find_run_file(r, "eval_episodes.jsonl")
                    is None]
    if from_summary:
        report["from_summary"] = from_summary
        print("read from summary.json (no evaluation episodes): " + ", ".join(from_summary))
    for name, runs in arms.items():
        for run, evals in zip(report["runs"][name], runs):
            for step, row in evals.items():
                print(f"{name} {run} step {step}: " + ", ".join(
                    f"{key} {value:.3f}" for key, value in row.items()))
    for metric in METRICS:
        gains = {name: [e[max(e)][metric] - e[min(e)][metric] for e in runs]
                 for name, runs in arms.items()}
        diff = [b[max(b)][metric] - a[max(a)][metric] for a, b in zip(arms["a"], arms["b"])]
        entry = {"gain_a": t_interval(gains["a"]), "gain_b": t_interval(gains["b"]),
                 "last_b_minus_a": t_interval(diff), "per_seed_b_minus_a": diff}
        report[metric] = entry
        print(f"{metric}: gain A {_fmt(entry['gain_a'])}, gain B {_fmt(entry['gain_b'])}, "
              f"B - A at the last evaluation {_fmt(entry['last_b_minus_a'])} points "
              f"(per seed {', '.join(f'{100 * d:+.1f}' for d in diff)})")
    return report


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--a", nargs="+", required=True, help="arm A's run folders, one per seed")
    p.add_argument("--b", nargs="+", required=True, help="arm B's run folders, same seeds")
    p.add_argument("--k", type=int, default=4, help="samples per task of the evaluations")
    p.add_argument("--json", default=None, help="write the numbers here")
    args = p.parse_args(argv)
    report = compare(args.a, args.b, args.k)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
