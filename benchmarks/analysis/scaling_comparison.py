"""ScalingInter-RL against fixed horizons, seed by seed (issue 48): final held-out scores, the
paired differences with a Student-t interval over seeds, the training curves, and the numbers
that say why per horizon phase (flat GRPO groups, entropy, training success, episode lengths,
endings) and at the final evaluation (endings, success per BabyAI level).

The command of ``benchmarks/jobs/babyai_scaling_equal_steps.txt`` (equal steps: 120 a run,
phases of 40), once the seeds' folders are under ``results/scaling_equal_steps/``::

    R=results/scaling_equal_steps
    python benchmarks/analysis/scaling_comparison.py \\
        --arm scaling=$R/babyai_eq_scaling_s{0,1,2} --arm fixed6=$R/babyai_eq_fixed6_s{0,1,2} \\
        --arm fixed20=$R/babyai_eq_fixed20_s{0,1,2} --out $R/comparison

An ``--arm`` takes ``NAME=DIR[,DIR...]`` words (the shell's braces give one word a folder);
the same name twice appends. Seeds are paired by position: the i-th folder of every arm is
training seed i. A position where some arm's folder is missing or has no evaluation after
training is left out of everything (listed under ``left_out``), so the next sessions can name
all three seeds before they all exist. The first arm (``--reference`` to pick another) is B
in every difference B - A against each other arm A.

The earlier comparison in ``results/table/`` (``babyai_grpo*`` = ScalingInter-RL 6 -> 13 -> 20,
15 steps a phase; ``babyai_fixed6*``, ``babyai_fixed20*``) gave every arm EQUAL WALL TIME
(360 s), not equal steps; the table of steps says so for any set of runs::

    T=results/table
    python benchmarks/analysis/scaling_comparison.py --arm scaling=$T/babyai_grpo{,_s1,_s2} \\
        --arm fixed6=$T/babyai_fixed6{,_s1,_s2} --arm fixed20=$T/babyai_fixed20{,_s1,_s2} \\
        --out /tmp/scaling_equal_time

Writes to ``--out``: ``scaling_comparison.json``, ``scaling_comparison.md``, ``curves.csv``
and, where matplotlib is installed, ``curves.png``.

Numbers (S seeds kept, every arm's runs read the same way):

* final scores: Avg@k / Pass@k / success rate (``training/evaluation/eval_metrics.py``) of each
  run's first and last evaluation (``arm_comparison.evaluations``); trained steps = the last
  step with a training row of ``metrics.jsonl``;
* differences: d_s = B_s - A_s per seed and metric; with S >= 2 the Student-t 95% interval
  mean -+ t_{0.975, S-1} sd / sqrt(S) (``seed_stats.t_interval``); with S = 1 "1 seed, no
  interval";
* curves: per arm and step, the mean over the seeds that logged the step of
  ``rollout/mean_reward`` and ``rollout/success_rate``;
* per phase (rows grouped by the row's ``train/horizon``) and per window (steps grouped by the
  reference arm's phases: the step ranges where its horizon is constant, the last one open),
  pooled over seeds and steps, with E = sum of ``rollout/episodes`` and G = sum of E / n
  (n = ``train.samples_per_task`` of the run's ``config.json``, so G = groups):
  train reward / success / turns = episode-weighted means of ``rollout/mean_reward`` /
  ``rollout/success_rate`` / ``rollout/mean_turns``; flat share = sum
  ``rollout/flat_groups_skipped`` / G (groups scored alike: no gradient); entropy = mean
  ``actor/entropy`` over the rows that have it (a step whose groups were all flat trains
  nothing and logs none: ``entropy_steps`` counts the others); turn-limit / context-limit share
  = sum ``rollout/status/max_turns`` / ``rollout/status/context_limit`` over E (a status the
  row does not name counted 0 episodes; None where no row has any ``rollout/status/`` count);
  ``missing_metrics`` lists the keys no row of the arm has;
* final evaluation: endings (``family_shortfall.endings``: success / turn_limit /
  context_limit / other, shares of the episodes) per seed and pooled, turns per success, and
  success per level (``eval_breakdown.breakdown``'s ``levels``: [successes, episodes] summed
  over the seeds); ``only_solved_by`` = per ordered pair of arms the levels the first solved at
  least once and the second never did (over all its seeds, having evaluated the level);
* per seed and window (``windows_by_seed``, every seed an arm has finished, kept or not): the
  same window numbers from one seed's rows, for "why" claims that must hold seed by seed
  (entropy, flat groups);
* ``differences_shared``: B - A over every seed position where B and A both have an
  evaluation after training, whether or not the other arms have it (a pair's interval before
  the last arm's seeds exist; it equals ``differences`` when no seed is left out).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from itertools import pairwise
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks.analysis.arm_comparison import METRICS, evaluations
from benchmarks.analysis.compare_runs import by_step, read_rows
from benchmarks.analysis.eval_breakdown import breakdown
from benchmarks.analysis.family_shortfall import endings
from benchmarks.analysis.learning_report import eval_episodes
from benchmarks.analysis.seed_stats import t_interval

#: the metrics.jsonl keys the phase numbers read (``rollout/status/*`` apart)
TRAIN_KEYS = ("rollout/episodes", "rollout/mean_reward", "rollout/success_rate",
              "rollout/mean_turns", "rollout/flat_groups_skipped", "actor/entropy",
              "train/horizon")
STATUS = "rollout/status/"
NO_INTERVAL = "1 seed, no interval"


def parse_arms(specs: Iterable[Sequence[str]]) -> dict[str, list[str]]:
    """``--arm`` words (``NAME=DIR[,DIR...]``) -> ``{name: [folder per seed]}`` in the order
    given (a name given again appends)."""
    arms: dict[str, list[str]] = {}
    for words in specs:
        for word in words:
            name, sep, dirs = word.partition("=")
            if not sep or not name or not dirs:
                raise ValueError(f"--arm takes NAME=DIR[,DIR...], got {word!r}")
            arms.setdefault(name, []).extend(d for d in dirs.split(",") if d)
    return arms


def training_rows(run: str) -> list[dict]:
    """``run``'s training rows of ``metrics.jsonl[.gz]`` (one per step, those with
    ``rollout/episodes``), each with ``_samples`` = the run's ``train.samples_per_task``."""
    with open(os.path.join(run, "config.json")) as f:
        samples = int(json.load(f)["train"]["samples_per_task"])
    merged = by_step(read_rows(run)) if os.path.isdir(run) else {}
    return [{**row, "_samples": samples} for step, row in sorted(merged.items())
            if "rollout/episodes" in row]


def _scores_after(run: str, k: int) -> tuple[dict[str, float] | None, str | None]:
    """(the scores of ``run``'s last evaluation, None), or (None, why the run is left out: no
    folder, or no evaluation after training)."""
    if not os.path.isdir(run):
        return None, f"{run}: no such folder"
    try:
        evals = evaluations(run, k)
    except FileNotFoundError:
        evals = {}
    if len(evals) < 2:
        return None, f"{run}: no evaluation after training (steps {sorted(evals)})"
    return {m: evals[max(evals)][m] for m in METRICS}, None


def training_stats(rows: list[dict]) -> dict[str, Any]:
    """The per-phase numbers of the module docstring over ``rows`` (any seeds and steps)."""
    episodes = sum(float(r["rollout/episodes"]) for r in rows)

    def weighted(key: str) -> float | None:
        have = [r for r in rows if key in r]
        e = sum(float(r["rollout/episodes"]) for r in have)
        return sum(float(r[key]) * float(r["rollout/episodes"]) for r in have) / e if e else None

    def status_share(name: str) -> float | None:
        have = [r for r in rows if any(key.startswith(STATUS) for key in r)]
        e = sum(float(r["rollout/episodes"]) for r in have)
        return sum(float(r.get(STATUS + name, 0.0)) for r in have) / e if e else None

    flat = [r for r in rows if "rollout/flat_groups_skipped" in r]
    groups = sum(float(r["rollout/episodes"]) / r["_samples"] for r in flat)
    entropy = [float(r["actor/entropy"]) for r in rows if "actor/entropy" in r]
    steps = [int(r["step"]) for r in rows]
    return {
        "rows": len(rows), "steps": [min(steps), max(steps)] if steps else None,
        "episodes": episodes,
        "train_reward": weighted("rollout/mean_reward"),
        "train_success": weighted("rollout/success_rate"),
        "turns_mean": weighted("rollout/mean_turns"),
        "flat_group_share": (sum(float(r["rollout/flat_groups_skipped"]) for r in flat)
                             / groups if groups else None),
        "entropy": sum(entropy) / len(entropy) if entropy else None,
        "entropy_steps": len(entropy),
        "turn_limit_share": status_share("max_turns"),
        "context_limit_share": status_share("context_limit"),
    }


def phase_windows(rows: list[dict]) -> list[list[int | None]]:
    """``[[first step, last step], ...]`` of the runs of equal ``train/horizon`` in ``rows``
    (one run's training rows); the last window open (``None``)."""
    starts, last = [], object()
    for r in rows:
        if r.get("train/horizon") != last:
            starts.append(int(r["step"]))
            last = r.get("train/horizon")
    if not starts:
        return []
    return [[s, e - 1] for s, e in pairwise(starts)] + [[starts[-1], None]]


def horizon_label(horizon: float) -> str:
    """``6.0`` -> ``"6"`` (the JSON key of a phase)."""
    return str(int(horizon)) if float(horizon).is_integer() else str(horizon)


def window_label(window: Sequence[int | None]) -> str:
    return f"{window[0]}-{window[1]}" if window[1] is not None else f"{window[0]}+"


def in_window(step: int, window: Sequence[int | None]) -> bool:
    return step >= window[0] and (window[1] is None or step <= window[1])


def curves(per_seed_rows: list[list[dict]]) -> dict[str, list]:
    """Per step: horizon, number of seeds that logged it, mean train reward and success over
    them."""
    steps: dict[int, list[dict]] = defaultdict(list)
    for rows in per_seed_rows:
        for r in rows:
            steps[int(r["step"])].append(r)
    out: dict[str, list] = {k: [] for k in ("step", "horizon", "n_seeds", "train_reward",
                                            "train_success")}
    for step, rows in sorted(steps.items()):
        out["step"].append(step)
        out["horizon"].append(rows[0].get("train/horizon"))
        out["n_seeds"].append(len(rows))
        for name, key in (("train_reward", "rollout/mean_reward"),
                          ("train_success", "rollout/success_rate")):
            vals = [float(r[key]) for r in rows if key in r]
            out[name].append(sum(vals) / len(vals) if vals else None)
    return out


def final_evaluation(run: str, k: int) -> dict[str, Any]:
    """A run's first and last evaluation scores, and the endings, turns per success and levels
    of its last one."""
    evals = evaluations(run, k)
    first, last = min(evals), max(evals)
    episodes = [e for e in eval_episodes(run) if int(e["step"]) == last]
    b = breakdown(episodes, last)
    return {"run": run, "first_step": first, "final_step": last,
            "before": {m: evals[first][m] for m in METRICS},
            "after": {m: evals[last][m] for m in METRICS},
            "endings": endings(episodes), "episodes": len(episodes),
            "successes": sum(bool(e.get("success")) for e in episodes),
            "turns_success_mean": b["turns_success_mean"], "levels": b["levels"]}


def difference(b: Sequence[float], a: Sequence[float]) -> dict[str, Any]:
    """B - A per seed and over seeds (a t-interval from two seeds on)."""
    d = [x - y for x, y in zip(b, a)]
    if len(d) < 2:
        return {"per_seed": d, "n_seeds": len(d), "mean": d[0], "interval": NO_INTERVAL}
    return {"per_seed": d, **t_interval(d)}


def arm_summary(runs: list[str], k: int, windows: list[list[int | None]]) -> dict[str, Any]:
    """One arm's final evaluations, curves, phase and window numbers, pooled endings and
    levels, over its kept seeds."""
    finals = [final_evaluation(r, k) for r in runs]
    rows = [training_rows(r) for r in runs]
    flat = [r for seed in rows for r in seed]
    horizons = sorted({r["train/horizon"] for r in flat if r.get("train/horizon") is not None})
    present = {key for r in flat for key in r}
    n = sum(f["episodes"] for f in finals)
    levels: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for f in finals:
        for level, (wins, eps) in f["levels"].items():
            levels[level][0] += wins
            levels[level][1] += eps
    successes = sum(f["successes"] for f in finals)
    turns = sum(f["turns_success_mean"] * f["successes"] for f in finals if f["successes"])
    return {
        "runs": runs,
        "trained_steps": [max((int(r["step"]) for r in seed), default=0) for seed in rows],
        "final": finals,
        "mean_after": {m: sum(f["after"][m] for f in finals) / len(finals) for m in METRICS},
        "curves": curves(rows),
        "phases": {horizon_label(h): training_stats([r for r in flat
                                                     if r.get("train/horizon") == h])
                   for h in horizons},
        "windows": {window_label(w): training_stats([r for r in flat
                                                     if in_window(int(r["step"]), w)])
                    for w in windows},
        "missing_metrics": [key for key in TRAIN_KEYS if key not in present]
        + ([] if any(key.startswith(STATUS) for key in present) else [STATUS + "*"]),
        "endings": {key: sum(f["endings"][key] * f["episodes"] for f in finals) / n
                    for key in finals[0]["endings"]},
        "turns_success_mean": turns / successes if successes else None,
        "levels": dict(sorted(levels.items())),
    }


def seed_windows(arms: dict[str, list[str]], finished: dict[str, list[int]],
                 windows: list[list[int | None]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per arm and finished seed position (``finished[arm]``; as a string), the window numbers
    of that seed's training rows alone."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for name, runs in arms.items():
        out[name] = {}
        for i in finished[name]:
            rows = training_rows(runs[i])
            out[name][str(i)] = {window_label(w): training_stats(
                [r for r in rows if in_window(int(r["step"]), w)]) for w in windows}
    return out


def pair_difference(after: dict[str, dict[int, dict[str, float]]], b: str, a: str,
                    seeds: list[int]) -> dict[str, Any]:
    """B - A per metric over the seed positions ``seeds`` (``after[arm][seed]``: the scores after
    training)."""
    return {m: difference([after[b][i][m] for i in seeds], [after[a][i][m] for i in seeds])
            for m in METRICS}


def shared_seed_differences(after: dict[str, dict[int, dict[str, float]]], reference: str
                            ) -> dict[str, dict[str, Any]]:
    """``reference`` - A per other arm A over the seed positions both have finished (an
    evaluation after training; the others' seeds aside); a pair with no such seed is absent."""
    out: dict[str, dict[str, Any]] = {}
    for name in after:
        seeds = [i for i in after[reference] if i in after[name]]
        if name != reference and seeds:
            out[f"{reference} - {name}"] = {"seeds": seeds,
                                            **pair_difference(after, reference, name, seeds)}
    return out


def compare(arms: dict[str, list[str]], k: int = 4, reference: str | None = None
            ) -> dict[str, Any]:
    """The whole comparison (module docstring) as one JSON-ready dict."""
    if len(arms) < 2:
        raise ValueError("give two arms or more")
    reference = reference or next(iter(arms))
    if reference not in arms:
        raise ValueError(f"--reference {reference!r} is not an arm ({', '.join(arms)})")
    positions = max(len(r) for r in arms.values())
    scored = {name: [_scores_after(runs[i], k) if i < len(runs) else (None, "no folder given")
                     for i in range(positions)] for name, runs in arms.items()}
    why_not = {name: [why for _, why in pairs] for name, pairs in scored.items()}
    after = {name: {i: scores for i, (scores, _) in enumerate(pairs) if scores is not None}
             for name, pairs in scored.items()}
    finished = {name: sorted(seeds) for name, seeds in after.items()}
    left_out: dict[int, list[str]] = {}
    for i in range(positions):
        why = [whys[i] for whys in why_not.values() if whys[i]]
        if why:
            left_out[i] = why
    kept = [i for i in range(positions) if i not in left_out]
    if not kept:
        raise ValueError(f"no seed has every arm's final evaluation: {left_out}")
    windows = phase_windows(training_rows(arms[reference][kept[0]]))
    summaries = {name: arm_summary([runs[i] for i in kept], k, windows)
                 for name, runs in arms.items()}
    differences = {f"{reference} - {name}": pair_difference(after, reference, name, kept)
                   for name in arms if name != reference}
    only = {}
    for a in arms:
        for b in arms:
            if a != b:
                la, lb = summaries[a]["levels"], summaries[b]["levels"]
                only[f"{a} not {b}"] = sorted(lv for lv in la if la[lv][0] > 0
                                              and lv in lb and lb[lv][0] == 0)
    steps = {name: s["trained_steps"] for name, s in summaries.items()}
    return {"k": k, "reference": reference, "seeds_kept": kept,
            "left_out": {str(i): w for i, w in left_out.items()},
            "equal_steps": len({tuple(v) for v in steps.values()}) == 1,
            "trained_steps": steps, "windows": [window_label(w) for w in windows],
            "differences": differences,
            "differences_shared": shared_seed_differences(after, reference),
            "windows_by_seed": seed_windows(arms, finished, windows),
            "only_solved_by": only, "arms": summaries}


def _num(v: float | None, fmt: str = ".3f") -> str:
    return "-" if v is None else format(v, fmt)


def _points(entry: dict[str, Any]) -> str:
    per_seed = ", ".join(f"{100 * d:+.1f}" for d in entry["per_seed"])
    if "interval" in entry:
        return f"{100 * entry['mean']:+.1f} | {entry['interval']} | {per_seed}"
    return (f"{100 * entry['mean']:+.1f} | [{100 * entry['ci95_low']:+.1f}, "
            f"{100 * entry['ci95_high']:+.1f}] | {per_seed}")


def _stats_table(report: dict[str, Any], part: str, title: str) -> list[str]:
    lines = ["", (f"| arm | {title} | rows (seed x step) | train reward | train success | "
             "flat groups | entropy (steps) | turns | turn limit | context limit |"),
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in report["arms"].items():
        for key, t in s[part].items():
            lines.append(
                f"| {name} | {key} | {t['rows']} | {_num(t['train_reward'])} | "
                f"{_num(t['train_success'])} | {_num(t['flat_group_share'])} | "
                f"{_num(t['entropy'])} ({t['entropy_steps']}) | {_num(t['turns_mean'], '.2f')} "
                f"| {_num(t['turn_limit_share'])} | {_num(t['context_limit_share'])} |")
    return lines


def markdown(report: dict[str, Any]) -> str:
    """The report's tables (scores in [0, 1], differences in points x100)."""
    k, ref = report["k"], report["reference"]
    steps = "; ".join(f"{n} {v}" for n, v in report["trained_steps"].items())
    lines = [(f"Seeds kept (by position): {report['seeds_kept']}; trained steps per seed: "
             f"{steps} ({'equal' if report['equal_steps'] else 'NOT equal'} steps)."), ""]
    lines += [f"- left out: seed {i}: {'; '.join(w)}" for i, w in report["left_out"].items()]
    lines += ["", (f"| arm | seed | steps | Avg@{k} before | Avg@{k} after | Pass@{k} after | "
              "success after | run |"), "|---|---|---|---|---|---|---|---|"]
    for name, s in report["arms"].items():
        for seed, f, n in zip(report["seeds_kept"], s["final"], s["trained_steps"]):
            lines.append(f"| {name} | {seed} | {n} | {f['before']['avg_at_k']:.3f} | "
                         f"{f['after']['avg_at_k']:.3f} | {f['after']['pass_at_k']:.3f} | "
                         f"{f['after']['success_rate']:.3f} | `{f['run']}` |")
    lines += ["", "| difference (final) | metric | mean, points | t 95% interval | per seed |",
              "|---|---|---|---|---|"]
    for pair, metrics in report["differences"].items():
        for m, entry in metrics.items():
            lines.append(f"| {pair} | {m} | {_points(entry)} |")
    shared = {pair: d for pair, d in report.get("differences_shared", {}).items()
              if d["seeds"] != report["seeds_kept"]}
    if shared:
        lines += ["", ("| difference over the seeds both arms have | seeds | metric | mean, "
                       "points | t 95% interval | per seed |"), "|---|---|---|---|---|---|"]
        for pair, d in shared.items():
            lines += [f"| {pair} | {d['seeds']} | {m} | {_points(d[m])} |" for m in METRICS]
    lines += _stats_table(report, "phases", "horizon")
    lines += _stats_table(report, "windows", f"steps ({ref}'s phases)")
    lines += ["", "| arm | seed | " + " | ".join(
        f"steps {w}: entropy / flat groups" for w in report["windows"]) + " |",
        "|---|---|" + "---|" * len(report["windows"])]
    for name, seeds in report["windows_by_seed"].items():
        for seed, by_window in seeds.items():
            lines.append(f"| {name} | {seed} | " + " | ".join(
                f"{_num(t['entropy'])} / {_num(t['flat_group_share'])}"
                for t in by_window.values()) + " |")
    lines += ["", ("| arm | final: success | turn limit | context limit | other | "
              "turns per success |"), "|---|---|---|---|---|---|"]
    for name, s in report["arms"].items():
        e = s["endings"]
        lines.append(f"| {name} | {e['success']:.3f} | {e['turn_limit']:.3f} | "
                     f"{e['context_limit']:.3f} | {e['other']:.3f} | "
                     f"{_num(s['turns_success_mean'], '.2f')} |")
    names = list(report["arms"])
    levels = sorted({lv for s in report["arms"].values() for lv in s["levels"]})
    lines += ["", "| level | " + " | ".join(f"{n} (successes/episodes)" for n in names) + " |",
              "|---|" + "---|" * len(names)]
    for lv in levels:
        cells = [report["arms"][n]["levels"].get(lv) for n in names]
        lines.append(f"| {lv} | " + " | ".join("-" if c is None else f"{c[0]}/{c[1]}"
                                              for c in cells) + " |")
    lines.append("")
    lines += [f"- solved by {pair.replace(' not ', ', never by ')}: {', '.join(lv) or 'none'}"
              for pair, lv in report["only_solved_by"].items()]
    missing = {n: s["missing_metrics"] for n, s in report["arms"].items() if s["missing_metrics"]}
    lines.append("- metrics no row records: " + ("; ".join(
        f"{n}: {', '.join(v)}" for n, v in missing.items()) or "none"))
    return "\n".join(lines) + "\n"


def write_curves(report: dict[str, Any], out: str) -> None:
    """``curves.csv`` (arm, step, horizon, seeds, train reward, train success) and, where
    matplotlib is installed, ``curves.png``."""
    with open(os.path.join(out, "curves.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["arm", "step", "horizon", "n_seeds", "train_reward", "train_success"])
        for name, s in report["arms"].items():
            c = s["curves"]
            w.writerows([name, *row] for row in zip(c["step"], c["horizon"], c["n_seeds"],
                                                     c["train_reward"], c["train_success"]))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no curves.png (matplotlib is not installed)")
        return
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for name, s in report["arms"].items():
        c = s["curves"]
        for ax, key in zip(axes, ("train_reward", "train_success", "horizon")):
            pts = [(x, y) for x, y in zip(c["step"], c[key]) if y is not None]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "-", label=name)
    for ax, title in zip(axes, ("train reward (mean over seeds)", "train success", "horizon")):
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "curves.png"), dpi=80)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arm", nargs="+", action="append", required=True,
                   help="NAME=DIR[,DIR...] (one folder per seed, paired by position)")
    p.add_argument("--reference", default=None, help="the arm B of every B - A (default: first)")
    p.add_argument("--k", type=int, default=4, help="samples per task of the evaluations")
    p.add_argument("--out", required=True, help="folder for the JSON, markdown and curves")
    args = p.parse_args(argv)
    try:
        report = compare(parse_arms(args.arm), args.k, args.reference)
    except ValueError as e:
        p.error(str(e))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "scaling_comparison.json"), "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    text = markdown(report)
    with open(os.path.join(args.out, "scaling_comparison.md"), "w") as f:
        f.write(text)
    write_curves(report, args.out)
    print(text, end="")
    return report


if __name__ == "__main__":
    main()
