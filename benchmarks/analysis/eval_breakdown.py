"""Where a policy's held-out failures are, from a run's committed evaluation episodes: per run,
at its first and final evaluation, how episodes ended, how long the successes took, and success
per level (the task id's part before ``/``, e.g. ``BabyAI-GoTo-v0``); over all runs given, the
levels no final evaluation solved once, and (``--level-scores``) each level's mean score at the
first and final evaluation, which says where a partial-credit family (ScienceWorld) gained when
no episode succeeds.

    python benchmarks/analysis/eval_breakdown.py results/table/babyai_grpo{,_s1,_s2} \
        --labels rl,rl_s1,rl_s2 --out breakdown.json
    python benchmarks/analysis/eval_breakdown.py runs/experts/babyai.jsonl   # recorded expert episodes
    R=results/sciworld_choice_dev
    python benchmarks/analysis/eval_breakdown.py $R/sciworld_choice_dev_s{0,1} --level-scores \
        --out $R/breakdown.json

Per evaluation with N episodes (``eval_episodes.jsonl`` or full trajectory files, read by
``learning_report.eval_episodes``):

* ``success_rate`` = successes / N; ``status`` = {status: episodes / N} (``done``: the
  environment ended the episode, ``max_turns``: the horizon did, ``context_limit``: the history
  outgrew ``rollout.max_context``);
* ``failed_status`` = {status: failed episodes with it / N}: what ended the failures;
* ``turns_success_mean`` = mean turns of the successful episodes (None without any);
* ``invalid_per_episode`` = mean ``invalid_actions``; ``parse_failures_per_episode`` = mean
  ``parse_failures`` (the part of them the parser could not read; None when an episode's is
  unknown: files written before the field);
* ``levels`` = {level: [successes, episodes]}; ``level_scores`` = {level: mean score of its
  episodes} (the score as in ``share`` below);
* web navigation (an evaluation with a MiniWoB++ trivial task,
  ``environments.miniwob.family.TRIVIAL_TASKS``): ``trivial`` and ``non_trivial`` = {"episodes",
  "success_rate", "mean_score"} over the episodes of those four tasks and of the others; the
  headline is ``non_trivial``;
* a lettered-choice run whose episodes record their picks (``Trajectory.option_picks`` /
  ``letter_picks``, kept in ``eval_episodes`` since 2026-12-04): ``picks`` = {"turns": T,
  "listed": {position: share of T}, "shown": {...}}, the chosen option's position in the
  environment's order and as shown (``0`` = the first / letter ``a``, ``1``, ``2``, ``3+``,
  ``none`` = the reply chose no option), and ``repeats`` = {"pairs": P, "listed": r, "shown":
  r'}: over the P pairs of consecutive turns of an episode that both chose an option, the
  share whose pick is the previous turn's (the same position in the environment's list; the
  same letter): a policy that repeats its last letter shows it in "shown".

A JSONL file instead of a run directory (``launch/record_experts.py``'s episodes) is one
evaluation at step 0 (``learning_report.eval_episodes``). An ``action_format.py --episodes_out``
file holds one set of episodes per answer style: ``--styles`` names the one each run reads
(records whose ``style`` is it), e.g. one file twice::

    python benchmarks/analysis/eval_breakdown.py F.jsonl.gz F.jsonl.gz --labels ordered,shuffled \
        --styles choice_option_limits,choice_shuffled

Across runs: ``never_solved`` = levels with no success in any run's final evaluation, and
``never_solved_share`` = their episodes / all episodes of the final evaluations;
``level_scores`` = {level: {"first": m0, "final": m1}}, the mean over the runs that have both
evaluations of each run's ``level_scores`` there (a level missing from a run's evaluation is
left out of that mean).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter, defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # environments
from learning_report import eval_episodes  # noqa: E402
from agentrl_jax.training.evaluation.eval_metrics import task_reward  # noqa: E402
from environments.miniwob.family import TRIVIAL_TASKS, is_trivial_task  # noqa: E402


def level_of(task_id: str) -> str:
    """The level of a task id: its part before the first ``/`` (the whole id without one)."""
    return str(task_id).split("/", 1)[0]


def evaluation_steps(episodes: list[dict]) -> dict[str, int]:
    """``{"first": step, "final": step}`` of a run's evaluations (``final`` only when a later
    evaluation than the first exists)."""
    steps = sorted({int(e["step"]) for e in episodes})
    if not steps:
        return {}
    return {"first": steps[0], **({"final": steps[-1]} if len(steps) > 1 else {})}


def score(episode: dict) -> float:
    """An episode's score: its task reward (``eval_metrics.task_reward``: ``reward`` less its
    training-only ``shaping``), 0.0 when missing."""
    return float(task_reward(episode.get("reward"), episode.get("shaping")) or 0.0)


def share(episodes: list[dict]) -> dict:
    """``{"episodes", "success_rate", "mean_score"}`` of ``episodes`` (:func:`score`)."""
    n = len(episodes)
    return {"episodes": n,
            "success_rate": sum(bool(e.get("success")) for e in episodes) / n if n else None,
            "mean_score": sum(score(e) for e in episodes) / n if n else None}


#: the positions :func:`pick_shares` tells apart (``3+`` pools the rest)
PICK_POSITIONS = ("0", "1", "2", "3+", "none")


def pick_shares(episodes: list[dict], key: str) -> dict[str, float]:
    """``{position: share of the turns}`` of the picks under ``key`` (``option_picks`` or
    ``letter_picks``) over ``episodes``' turns (:data:`PICK_POSITIONS`; ``{}``: none recorded)."""
    picks = [p for e in episodes for p in e.get(key) or ()]
    if not picks:
        return {}
    counts = Counter("none" if p < 0 else str(p) if p < 3 else "3+" for p in picks)
    return {pos: counts[pos] / len(picks) for pos in PICK_POSITIONS}


def repeat_shares(episodes: list[dict]) -> dict[str, float | int] | None:
    """``{"pairs": P, "listed": r, "shown": r'}``: of the P pairs of consecutive turns within an
    episode that both chose an option (picks >= 0 under ``option_picks`` and ``letter_picks``),
    the share whose pick equals the previous turn's, in the environment's order (``listed``)
    and as shown (``shown``); None when no pair."""
    pairs = same_listed = same_shown = 0
    for e in episodes:
        listed, shown = e.get("option_picks") or (), e.get("letter_picks") or ()
        for t in range(1, min(len(listed), len(shown))):
            if min(listed[t - 1], listed[t], shown[t - 1], shown[t]) < 0:
                continue
            pairs += 1
            same_listed += listed[t] == listed[t - 1]
            same_shown += shown[t] == shown[t - 1]
    if not pairs:
        return None
    return {"pairs": pairs, "listed": same_listed / pairs, "shown": same_shown / pairs}


def breakdown(episodes: list[dict], step: int) -> dict:
    """The numbers of the module docstring for the evaluation at ``step``."""
    eps = [e for e in episodes if int(e["step"]) == step]
    n = len(eps)
    if not n:
        raise ValueError(f"no evaluation episodes at step {step}")
    wins = [e for e in eps if e.get("success")]
    levels: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    scores: dict[str, list[float]] = defaultdict(list)
    for e in eps:
        level = level_of(e["task_id"])
        levels[level][0] += bool(e.get("success"))
        levels[level][1] += 1
        scores[level].append(score(e))
    trivial = [e for e in eps if is_trivial_task(e["task_id"])]
    web = {"trivial": share(trivial), "non_trivial": share([e for e in eps if not is_trivial_task(e["task_id"])])} \
        if trivial else {}
    listed = pick_shares(eps, "option_picks")
    picks = {"picks": {"turns": sum(len(e.get("option_picks") or ()) for e in eps),
                       "listed": listed, "shown": pick_shares(eps, "letter_picks"),
                       "repeats": repeat_shares(eps)}} \
        if listed else {}
    return {
        **web, **picks,
        "step": step, "episodes": n, "success_rate": len(wins) / n,
        "status": {k: v / n for k, v in Counter(e["status"] for e in eps).most_common()},
        "failed_status": {k: v / n for k, v in Counter(
            e["status"] for e in eps if not e.get("success")).most_common()},
        "turns_success_mean": (sum(e["num_turns"] for e in wins) / len(wins)) if wins else None,
        "invalid_per_episode": sum(e.get("invalid_actions") or 0 for e in eps) / n,
        "parse_failures_per_episode": (
            None if any(e.get("parse_failures") is None for e in eps)
            else sum(int(e["parse_failures"]) for e in eps) / n),
        "levels": dict(sorted(levels.items())),
        "level_scores": {lv: sum(v) / len(v) for lv, v in sorted(scores.items())},
    }


def summarize(runs: dict[str, list[dict]]) -> dict:
    """``{"runs": {label: {which: breakdown}}, "never_solved": [...], "never_solved_share"}``;
    ``runs`` maps a label to its evaluation episodes."""
    out: dict = {"runs": {}}
    finals = []
    for label, episodes in runs.items():
        out["runs"][label] = {which: breakdown(episodes, step)
                              for which, step in evaluation_steps(episodes).items()}
        if "final" in out["runs"][label]:
            finals.append(out["runs"][label]["final"])
    if finals:
        solved: Counter = Counter()
        seen: Counter = Counter()
        for f in finals:
            for level, (wins, n) in f["levels"].items():
                solved[level] += wins
                seen[level] += n
        never = sorted(level for level in seen if solved[level] == 0)
        out["never_solved"] = never
        out["never_solved_share"] = sum(seen[lv] for lv in never) / sum(seen.values())
        out["level_scores"] = mean_level_scores(
            [evals for evals in out["runs"].values() if "final" in evals])
    return out


def mean_level_scores(runs: list[dict]) -> dict[str, dict[str, float | None]]:
    """``{level: {"first": m0, "final": m1}}``: per level, the mean over ``runs`` (each
    ``{"first": breakdown, "final": breakdown}``) of their ``level_scores`` at each evaluation,
    over the runs whose evaluation has the level (None: none has it)."""
    out: dict[str, dict[str, float | None]] = {}
    for level in sorted({lv for r in runs for which in ("first", "final")
                         for lv in r[which]["level_scores"]}):
        out[level] = {}
        for which in ("first", "final"):
            values = [r[which]["level_scores"][level] for r in runs
                      if level in r[which]["level_scores"]]
            out[level][which] = sum(values) / len(values) if values else None
    return out


def level_score_table(summary: dict) -> list[str]:
    """Markdown lines: each level's mean score at the first and final evaluation, per run and
    over the runs (``summary["level_scores"]``), the largest final mean first."""
    means = summary.get("level_scores") or {}
    runs = [(label, evals) for label, evals in summary["runs"].items() if "final" in evals]
    lines = ["| level | " + " | ".join(label for label, _ in runs) + " | mean over the runs |",
             "|---|" + "---|" * (len(runs) + 1)]

    def pair(first: float | None, final: float | None) -> str:
        return "-" if first is None or final is None else f"{first:.3f} -> {final:.3f}"

    def final_first(kv: tuple[str, dict]) -> tuple[float, str]:
        final = kv[1]["final"]
        return (-final if final is not None else float("inf"), kv[0])

    for level, m in sorted(means.items(), key=final_first):
        cells = [pair(evals["first"]["level_scores"].get(level),
                      evals["final"]["level_scores"].get(level)) for _, evals in runs]
        lines.append(f"| {level} | " + " | ".join(cells) + f" | {pair(m['first'], m['final'])} |")
    return lines


def markdown(summary: dict, level_scores: bool = False) -> str:
    """One row per run and evaluation, then the never-solved levels (and, with
    ``level_scores``, :func:`level_score_table`)."""
    lines = ["| run | eval step | success | ended by (share of episodes) | failures ended by | "
             "turns per success | invalid actions per episode |", "|---|---|---|---|---|---|---|"]

    def shares(d: dict) -> str:
        return ", ".join(f"{k} {v:.2f}" for k, v in d.items())

    for label, evals in summary["runs"].items():
        for which, b in evals.items():
            turns = "-" if b["turns_success_mean"] is None else f"{b['turns_success_mean']:.1f}"
            lines.append(f"| {label} | {b['step']} ({which}) | {b['success_rate']:.3f} | "
                         f"{shares(b['status'])} | {shares(b['failed_status'])} | {turns} | "
                         f"{b['invalid_per_episode']:.1f} |")
    web = [(label, which, b) for label, evals in summary["runs"].items() for which, b in evals.items()
           if "non_trivial" in b]
    if web:
        lines += ["", "Web navigation, the trivial tasks apart (" + ", ".join(TRIVIAL_TASKS) + "):", "",
                  "| run | eval step | non-trivial success | non-trivial mean score (episodes) | "
                  "trivial success | trivial mean score (episodes) |", "|---|---|---|---|---|---|"]
        for label, which, b in web:
            rest, easy = b["non_trivial"], b["trivial"]

            def num(v):
                return "-" if v is None else f"{v:.3f}"

            lines.append(f"| {label} | {b['step']} ({which}) | {num(rest['success_rate'])} | "
                         f"{num(rest['mean_score'])} ({rest['episodes']}) | {num(easy['success_rate'])} | "
                         f"{num(easy['mean_score'])} ({easy['episodes']}) |")
    chosen = [(label, which, b) for label, evals in summary["runs"].items()
              for which, b in evals.items() if "picks" in b]
    if chosen:
        lines += ["", "The options chosen, share of turns by position (0 = the first), in the "
                      "environment's order / as shown, and the share of consecutive turns "
                      "that repeat the previous turn's pick (its position in the list / its "
                      "letter):", "",
                  "| run | eval step | turns | " + " | ".join(PICK_POSITIONS)
                  + " | same as the turn before |",
                  "|---|---|---|" + "---|" * (len(PICK_POSITIONS) + 1)]
        for label, which, b in chosen:
            p = b["picks"]
            cells = " | ".join(f"{p['listed'][k]:.2f} / {p['shown'][k]:.2f}"
                               for k in PICK_POSITIONS)
            r = p.get("repeats")
            same = "-" if r is None else f"{r['listed']:.2f} / {r['shown']:.2f}"
            lines.append(f"| {label} | {b['step']} ({which}) | {p['turns']} | {cells} | "
                         f"{same} |")
    if "never_solved" in summary:
        lines += ["", f"Levels no final evaluation solved ({len(summary['never_solved'])}, "
                      f"{summary['never_solved_share']:.1%} of the final evaluations' episodes): "
                  + ", ".join(summary["never_solved"])]
    if level_scores and summary.get("level_scores"):
        lines += ["", "Mean score per level, first -> final evaluation:", "",
                  *level_score_table(summary)]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="run directories with evaluation episodes, or "
                    "JSONL files of episodes")
    ap.add_argument("--labels", default="", help="comma-separated, one per run (default: names)")
    ap.add_argument("--styles", default="", help="comma-separated, one per run: read only the "
                    "episodes of this answer style (action_format.py --episodes_out files)")
    ap.add_argument("--out", default="", help="write the JSON here as well")
    ap.add_argument("--level-scores", action="store_true", help="also print each level's mean "
                    "score at the first and final evaluation (the JSON always has it)")
    args = ap.parse_args(argv)
    labels = args.labels.split(",") if args.labels else [
        os.path.basename(os.path.normpath(r)) for r in args.runs]
    if len(labels) != len(args.runs):
        ap.error(f"{len(labels)} labels for {len(args.runs)} runs")
    styles = args.styles.split(",") if args.styles else [""] * len(args.runs)
    if len(styles) != len(args.runs):
        ap.error(f"{len(styles)} styles for {len(args.runs)} runs")
    runs = {}
    for label, run, style in zip(labels, args.runs, styles):
        episodes = eval_episodes(run, style) if os.path.exists(run) else []
        if not episodes:
            ap.error(f"{run}: no evaluation episodes" + (f" of style {style!r}" if style else ""))
        runs[label] = episodes
    summary = summarize(runs)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1)
    print(markdown(summary, args.level_scores), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
