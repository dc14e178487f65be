"""Where each environment family stands against issue 47's targets for RL from the base model
(no SFT), from the committed run folders only: per family the best from-scratch held-out (or
dev) mean score and its gap to the target, and from the evaluation episodes why.

    python benchmarks/analysis/family_shortfall.py --out results/family_shortfall

Targets (issue 47 item 3): BabyAI Avg@4 >= 0.80, TextCraft >= 0.40, ScienceWorld a gain of
+10 points of score over step 0, web navigation >= 0.40 on the non-trivial tasks
(``environments.miniwob.family.TRIVIAL_TASKS`` apart), deep search >= 0.30 on the new task set
(``fact-`` / ``hop-`` questions; the committed GPU runs used the old ``lookup`` set, ``wiki-``
ids, so they do not count towards it).

Inputs (listed in ``family_arms.py``; the table is ``family_shortfall_table.py``): the
from-scratch arms of :data:`ARMS` (run folders under ``results/``, each with
``eval_episodes.jsonl[.gz]``, ``metrics.jsonl[.gz]`` and ``config.json``), the step-0 CPU
measurements of ``results/choice_step0_cpu/`` (:data:`CPU_STEP0`) and the diagnosis files
written by ``episode_diagnosis.py`` on full trajectories (:data:`DIAGNOSIS_FILES`). Episodes
are read with ``learning_report.eval_episodes``; per-evaluation numbers come from
``episode_diagnosis.summarise`` and ``eval_breakdown.breakdown``; scores from
``agentrl_jax/training/evaluation/eval_metrics.py``.

Per evaluation (one run, one step; N episodes, T = their turns):

* ``avg`` = Avg@k = (1/tasks) sum_t mean_j s_tj (the mean task score, s in [0, 1]); ``headline``
  = ``avg`` over the target's tasks (web navigation: the non-trivial ones);
* ``valid_action_share`` = 1 - sum(invalid_actions) / T; ``reward_rate`` = share of the N
  episodes with score > 0;
* ``endings`` = shares of the N episodes that ended ``success`` (the completion flag),
  ``turn_limit`` (status ``max_turns``, no success), ``context_limit`` (the history outgrew
  ``rollout.max_context``) and ``other`` (the environment ended it without success, errors);
* ``parse_failures_per_turn`` = sum(parse_failures) / T, ``tokens_mean`` / ``tokens_max`` over
  the episodes' final context lengths (``context_tokens``: prompt + every turn): from the
  evaluation records' own ``parse_failures`` and ``context_tokens`` where every episode has
  them (``learning_report.EPISODE_FIELDS``), else where a diagnosis file of the full
  trajectories exists (the older committed ``eval_episodes`` keep neither), else None.

Per run, the training rollouts of its last horizon phase (``metrics.jsonl``): mean training
success, the share of flat GRPO groups (all samples scored alike: no gradient) =
flat_groups_skipped / (episodes / samples_per_task), the share of episodes ended by the context
limit, and the learner rows' length (``sequence_length``, mean and max; None when every group
was flat and nothing was trained).

Per family: ``best`` = the arm (a recipe over its training seeds) with the highest mean over
seeds of the final headline score (``gain`` targets: of final - step 0; ``best_split`` its
split, as a recipe's name may repeat on another), ``gap`` = target - best (> 0: short of it). A family with no evaluation after training on the target's task set
says so (``best`` None) and its step-0 numbers stand: the GPU run's step 0 and the CPU
measurement of its ``choice_gpu`` recipe (16-22 train tasks x 1, 5-10 turns: not held-out).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(1, REPO)
import episode_diagnosis
import eval_breakdown
from family_arms import ARMS, CPU_STEP0, DIAGNOSIS_FILES, TARGETS, Arm
from family_shortfall_table import markdown
from learning_report import eval_episodes

from agentrl_common import jsonl_files
from agentrl_jax.training.evaluation import eval_metrics
from environments.miniwob.family import is_trivial_task


def endings(episodes: list[dict]) -> dict[str, float]:
    """Shares of ``episodes`` that ended ``success`` / ``turn_limit`` / ``context_limit`` /
    ``other`` (module docstring); each success counts as success whatever its status."""
    n = len(episodes)
    counts = {"success": 0, "turn_limit": 0, "context_limit": 0, "other": 0}
    for e in episodes:
        if e.get("success"):
            counts["success"] += 1
        elif e.get("status") == "max_turns":
            counts["turn_limit"] += 1
        elif e.get("status") == "context_limit":
            counts["context_limit"] += 1
        else:
            counts["other"] += 1
    return {k: (v / n if n else 0.0) for k, v in counts.items()}


def avg_at_k(episodes: list[dict]) -> float | None:
    """Avg@k of ``episodes`` (``eval_metrics``: the mean over tasks of the mean episode
    score); None without a scored task."""
    items = eval_metrics.outcomes(episodes)
    return eval_metrics.score(items, 1).avg_at_k if items else None


def headline_episodes(episodes: list[dict], tasks: str) -> list[dict]:
    """The episodes a target counts: all, or (``"non_trivial"``) those of MiniWoB tasks not in
    ``TRIVIAL_TASKS``."""
    if tasks == "non_trivial":
        return [e for e in episodes if not is_trivial_task(e["task_id"])]
    return list(episodes)


def evaluation(
    episodes: list[dict], step: int, tasks: str = "all", diagnosis: dict | None = None
) -> dict[str, Any]:
    """The numbers of the module docstring for the evaluation at ``step`` of ``episodes``, over
    the target's tasks (``tasks``; web navigation: the trivial tasks apart under ``trivial``,
    and ``avg_all_tasks``); ``diagnosis`` (an ``episode_diagnosis.summarise`` of the full
    trajectories of the whole evaluation) supplies the parse failures and token counts when
    the episodes' own records do not hold them."""
    every = [e for e in episodes if int(e["step"]) == step]
    eps = headline_episodes(every, tasks)
    out = _numbers(eps, step)
    out.update(headline=out["avg"], avg_all_tasks=avg_at_k(every))
    if "non_trivial" in eval_breakdown.breakdown(every, step):
        out["trivial"] = _numbers([e for e in every if is_trivial_task(e["task_id"])], step)
    if (
        not out["diagnosed"]
        and diagnosis is not None
        and diagnosis.get("episodes") == len(every)
        and len(eps) == len(every)
    ):
        out.update(
            parse_failures_per_turn=diagnosis["parse_failures_per_turn"],
            tokens_mean=diagnosis["tokens_mean"],
            tokens_max=diagnosis["tokens_max"],
            diagnosed=True,
        )
    return out


def _numbers(eps: list[dict], step: int) -> dict[str, Any]:
    """Avg@k, ``episode_diagnosis.summarise``'s shares and :func:`endings` of ``eps`` (one
    evaluation); the token and parse figures from the records' ``context_tokens`` and
    ``parse_failures``, None where an episode lacks them (``diagnosed``: both known)."""
    d = episode_diagnosis.summarise(eps)
    known = d["parse_failures_per_turn"] is not None and d["tokens_mean"] is not None
    return {
        "step": step,
        "episodes": len(eps),
        "avg": avg_at_k(eps),
        "valid_action_share": d["valid_action_share"],
        "reward_rate": d["reward_rate"],
        "success_rate": d["success_rate"],
        "turns_mean": d["turns_mean"],
        "endings": endings(eps),
        "status": eval_breakdown.breakdown(eps, step)["status"],
        "parse_failures_per_turn": d["parse_failures_per_turn"] if known else None,
        "tokens_mean": d["tokens_mean"] if known else None,
        "tokens_max": d["tokens_max"] if known else None,
        "diagnosed": known,
    }


def training_tail(run: str) -> dict[str, Any] | None:
    """The training rollouts of ``run``'s last horizon phase, from ``metrics.jsonl`` (module
    docstring); None without training rows."""
    rows = [
        r
        for r in jsonl_files.read_run_file(run, "metrics.jsonl", missing_ok=True)
        if "rollout/episodes" in r
    ]
    if not rows:
        return None
    with open(os.path.join(run, "config.json")) as f:
        samples = int(json.load(f)["train"]["samples_per_task"])
    horizon = rows[-1].get("train/horizon")
    tail = [r for r in rows if r.get("train/horizon") == horizon]
    episodes = sum(r["rollout/episodes"] for r in tail)
    groups = episodes / samples
    trained = [r for r in tail if "sequence_length/max" in r]
    return {
        "steps": [int(tail[0]["step"]), int(tail[-1]["step"])],
        "horizon": horizon,
        "last_step": int(rows[-1]["step"]),
        "success_rate": sum(r.get("rollout/success_rate", 0.0) for r in tail) / len(tail),
        "flat_group_share": sum(r.get("rollout/flat_groups_skipped", 0.0) for r in tail) / groups,
        "context_limit_share": sum(r.get("rollout/status/context_limit", 0.0) for r in tail)
        / episodes,
        "row_tokens_mean": (
            sum(r["sequence_length/mean"] for r in trained) / len(trained) if trained else None
        ),
        "row_tokens_max": max((int(r["sequence_length/max"]) for r in trained), default=None),
    }


def load_diagnoses(root: str, paths: tuple[str, ...] | None = None) -> dict[tuple, dict]:
    """``{(run path relative to root, step): summary}`` of the diagnosis files ``paths``
    (default :data:`DIAGNOSIS_FILES`) that exist."""
    out: dict[tuple, dict] = {}
    for rel in DIAGNOSIS_FILES if paths is None else paths:
        path = os.path.join(root, rel)
        if not os.path.isfile(path):
            continue
        with open(path) as f:
            for traj, steps in json.load(f).items():
                run = os.path.join(os.path.dirname(rel), os.path.basename(os.path.dirname(traj)))
                for step, summary in steps.items():
                    out[(run, int(step))] = summary
    return out


def run_summary(root: str, run: str, tasks: str, diagnoses: dict[tuple, dict]) -> dict[str, Any]:
    """A run's first and final evaluations (``eval_breakdown.evaluation_steps``) and its
    training tail; ``final`` is absent when the run has no evaluation after training."""
    path = os.path.join(root, run)
    episodes = eval_episodes(path)
    out: dict[str, Any] = {"run": run}
    for which, step in eval_breakdown.evaluation_steps(episodes).items():
        out[which] = evaluation(episodes, step, tasks, diagnoses.get((run, step)))
    out["training"] = training_tail(path)
    return out


def pooled(evals: list[dict]) -> dict[str, Any]:
    """The seeds' evaluations together, episode-weighted (every seed holds the same number of
    episodes here); the token and parse figures over the seeds that have them
    (``diagnosed_seeds``); ``trivial`` likewise where every seed has it."""
    n = sum(e["episodes"] for e in evals)
    have = [e for e in evals if e["diagnosed"]]
    m = sum(e["episodes"] for e in have)

    def mean(key: str, sub: str | None = None, among: list[dict] = evals) -> float | None:
        vals = [(e[key] if sub is None else e[key][sub]) for e in among]
        if not among or any(v is None for v in vals):
            return None
        return sum(v * e["episodes"] for v, e in zip(vals, among)) / (m if among is have else n)

    out = {
        "episodes": n,
        "seeds": len(evals),
        "diagnosed_seeds": len(have),
        "avg": mean("avg"),
        "headline": mean("headline"),
        "avg_all_tasks": mean("avg_all_tasks"),
        "valid_action_share": mean("valid_action_share"),
        "reward_rate": mean("reward_rate"),
        "success_rate": mean("success_rate"),
        "turns_mean": mean("turns_mean"),
        "endings": {k: mean("endings", k) for k in evals[0]["endings"]},
        "parse_failures_per_turn": mean("parse_failures_per_turn", among=have),
        "tokens_mean": mean("tokens_mean", among=have),
        "tokens_max": max((e["tokens_max"] for e in have), default=None),
    }
    if all("trivial" in e for e in evals):
        out["trivial"] = pooled(
            [
                {
                    **e["trivial"],
                    "headline": e["trivial"]["avg"],
                    "avg_all_tasks": e["trivial"]["avg"],
                }
                for e in evals
            ]
        )
    return out


def arm_summary(root: str, arm: Arm, diagnoses: dict[tuple, dict]) -> dict[str, Any]:
    """Every run of ``arm``, its seeds' final headline scores and gains, and the pooled first
    and final evaluations."""
    target = TARGETS[arm.family]
    runs = [run_summary(root, r, target.tasks, diagnoses) for r in arm.runs]
    finished = [r for r in runs if "final" in r]
    out: dict[str, Any] = {
        "arm": arm.name,
        "split": arm.split,
        "counts": arm.counts,
        "note": arm.note,
        "runs": runs,
        "seeds_with_final": len(finished),
        "first": pooled([r["first"] for r in runs]),
    }
    if finished:
        finals = [r["final"]["headline"] for r in finished]
        gains = [r["final"]["headline"] - r["first"]["headline"] for r in finished]
        out.update(
            final=pooled([r["final"] for r in finished]),
            final_per_seed=finals,
            gain_per_seed=gains,
            final_mean=sum(finals) / len(finals),
            gain_mean=sum(gains) / len(gains),
        )
    return out


def cpu_step0(root: str, path: str, style: str) -> dict[str, Any]:
    """A ``results/choice_step0_cpu`` measurement of ``style`` (``action_format.py``'s JSON):
    valid = accepted / turns, parser failures = (turns - parsable) / turns, Avg@1 = score sum /
    episodes, reward rate = scored / episodes, context = final context tokens (mean, max);
    web navigation also the non-trivial tasks' Avg@1."""
    with open(os.path.join(root, path)) as f:
        data = json.load(f)
    s = next(x for x in data["styles"] if x["style"] == style)
    n, turns = s["episodes"], s["turns"]
    out = {
        "file": path,
        "style": style,
        "split": data["args"]["split"],
        "episodes": n,
        "turn_horizon": data["args"]["turns"],
        "valid_action_share": s["accepted"] / turns,
        "parse_failures_per_turn": (turns - s["parsable"]) / turns,
        "avg": s["score_sum"] / n,
        "reward_rate": s["scored"] / n,
        "turns_mean": turns / n,
        "tokens_mean": s["context_tokens"] / n,
        "tokens_max": s["max_context_tokens"],
        "context_limit": s["context_limit"],
    }
    if "webnav" in os.path.basename(path):
        rest = [float(e[1]) for e in s["episode_scores"] if not is_trivial_task(e[0])]
        out["non_trivial"] = {
            "episodes": len(rest),
            "avg": sum(rest) / len(rest),
            "reward_rate": sum(v > 0 for v in rest) / len(rest),
        }
    return out


def family_summary(root: str, family: str, diagnoses: dict[tuple, dict]) -> dict[str, Any]:
    """The family's target, arms, best arm and gap, and its CPU step-0 measurements. Without a
    best arm, ``gap_from_step0`` = target - the best step-0 figure on the target's tasks (a GPU
    arm's step 0, else the CPU ``choice_gpu`` row; a ``gain`` target: its whole value)."""
    target = TARGETS[family]
    arms = [arm_summary(root, a, diagnoses) for a in ARMS if a.family == family]
    cpu = [cpu_step0(root, p, s) for p, s in CPU_STEP0[family]]
    key = "gain_mean" if target.kind == "gain" else "final_mean"
    eligible = [a for a in arms if a["counts"] and key in a]
    best = max(eligible, key=lambda a: a[key]) if eligible else None
    out: dict[str, Any] = {"target": dataclasses.asdict(target), "arms": arms, "cpu_step0": cpu}
    if best is not None:
        out.update(
            best=best["arm"],
            best_split=best["split"],
            best_value=best[key],
            gap=target.value - best[key],
            reached=best[key] >= target.value,
            best_seed_value=max(
                best["gain_per_seed" if target.kind == "gain" else "final_per_seed"]
            ),
        )
        return out
    step0 = [a["first"]["headline"] for a in arms if a["counts"]] or [
        c.get("non_trivial", c)["avg"] for c in cpu[1:]
    ]
    out.update(
        best=None,
        best_split=None,
        best_value=None,
        gap=None,
        reached=False,
        why_no_best="no from-scratch evaluation after training on the target's tasks",
        gap_from_step0=target.value - (0.0 if target.kind == "gain" else max(step0)),
    )
    return out


def shortfall(root: str = REPO) -> dict[str, Any]:
    """``{"families": {family: family_summary}}`` over :data:`TARGETS`."""
    diagnoses = load_diagnoses(root)
    return {"families": {f: family_summary(root, f, diagnoses) for f in TARGETS}}



def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default=REPO, help="the repository root the run paths are under")
    p.add_argument("--out", default="", help="write shortfall.json and shortfall.md here")
    args = p.parse_args(argv)
    summary = shortfall(args.root)
    text = markdown(summary)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "shortfall.json"), "w") as f:
            json.dump(summary, f, indent=1)
            f.write("\n")
        with open(os.path.join(args.out, "shortfall.md"), "w") as f:
            f.write(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
