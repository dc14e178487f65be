"""TextCraft success by how long the goal is: held-out success per goal against the number of
actions the recipe expert needs for it.

    python benchmarks/analysis/textcraft_depth.py \
        --runs results/textcraft_shuffled_test/textcraft_shuffled_test_s{0,1,2} \
        --json results/textcraft_depth/shuffled_test.json

Per goal of the runs' evaluations (``eval_episodes.jsonl.gz``), the expert's length: the actions
``environments/textcraft/expert.TextCraftExpertPolicy`` takes to craft it in a fresh
``TextCraftEnv`` at the goal's default seed (``get`` and ``craft`` actions, no mistakes; the
number of turns a perfect agent needs), and the share of its episodes with score > 0 at each
run's first and last evaluated step, pooled over the runs. Printed and written: per goal, and
per bin of expert lengths (``--bins``, inclusive upper ends) the goals, their mean success
before and after, and how many goals the runs never solved after. With ``--turns`` the bin
table also says which bins a turn limit leaves room for (``expert length <= turns``); with
``--chance`` (an ``action_scoring.py`` JSON: its first policy's ``task_ids`` and ``scores``,
e.g. a uniform choice among the listed actions) each goal and bin gets that policy's success
on the same goals.
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

from environments.textcraft.env import MAX_STEPS, TextCraftEnv  # noqa: E402
from environments.textcraft.expert import TextCraftExpertPolicy  # noqa: E402


def expert_length(goal: str) -> int | None:
    """The actions the recipe expert takes to craft ``goal`` (``None`` if it does not within
    the environment's ``MAX_STEPS``)."""
    env = TextCraftEnv()
    observation = env.reset(goal).observation
    policy = TextCraftExpertPolicy(goal)
    for turn in range(1, MAX_STEPS + 1):
        result = env.step(policy.act(observation))
        if result.done:
            return turn if result.reward > 0 else None
        observation = result.observation
    return None


def success_by_goal(runs: list[str]) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """``(first, last)``: per goal, the pass (score > 0) of every episode at each run's first and
    last evaluated step."""
    first: dict[str, list[float]] = defaultdict(list)
    last: dict[str, list[float]] = defaultdict(list)
    for run in runs:
        with gzip.open(os.path.join(run, "eval_episodes.jsonl.gz"), "rt") as f:
            rows = [json.loads(line) for line in f]
        steps = sorted({r["step"] for r in rows})
        for r in rows:
            if r["step"] in (steps[0], steps[-1]):
                into = first if r["step"] == steps[0] else last
                into[r["task_id"]].append(float(r["reward"] > 0))
    return first, last


def chance_by_goal(path: str) -> tuple[str, dict[str, float]]:
    """The first policy of an ``action_scoring.py`` JSON: its name and, per goal, its success
    share (score > 0)."""
    with open(path) as f:
        policy = json.load(f)["policies"][0]
    by_goal: dict[str, list[float]] = defaultdict(list)
    for task, score in zip(policy["task_ids"], policy["scores"]):
        by_goal[task].append(float(score > 0))
    return str(policy["policy"]), {g: float(np.mean(v)) for g, v in by_goal.items()}


def bin_table(goals: list[dict[str, Any]], bins: list[int]) -> list[dict[str, Any]]:
    """Per bin of expert lengths ``(previous end, end]``: goals, mean success before / after
    (and of ``chance`` where the goals have it), goals never solved after."""
    out, low = [], 0
    for high in bins:
        members = [g for g in goals if g["expert_length"] is not None
                   and low < g["expert_length"] <= high]
        if members:
            out.append({"lengths": [low + 1, high], "goals": len(members),
                        "before": float(np.mean([g["before"] for g in members])),
                        "after": float(np.mean([g["after"] for g in members])),
                        "never_solved_after": sum(g["after"] == 0 for g in members)})
            if all("chance" in g for g in members):
                out[-1]["chance"] = float(np.mean([g["chance"] for g in members]))
        low = high
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", nargs="+", required=True)
    p.add_argument("--bins", default="3,6,10,50", help="inclusive upper ends of the bins")
    p.add_argument("--turns", type=int, default=None, help="the runs' turn limit, for the table")
    p.add_argument("--chance", default=None, help="an action_scoring.py JSON of the same split")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    first, last = success_by_goal(args.runs)
    chance_policy, chance = chance_by_goal(args.chance) if args.chance else ("", {})
    goals = [{"goal": g, "expert_length": expert_length(g), "before": float(np.mean(first[g])),
              "after": float(np.mean(last[g])), "episodes_after": len(last[g]),
              **({"chance": chance[g]} if g in chance else {})}
             for g in sorted(last)]
    bins = bin_table(goals, [int(b) for b in args.bins.split(",")])
    print(f"{len(goals)} goals, {len(args.runs)} run(s)\n")
    with_chance = bool(bins) and all("chance" in b for b in bins)
    extra = [f" {chance_policy} (no model)"] if with_chance else []
    extra += [" within the turn limit"] if args.turns else []
    print("| expert actions | goals | success before | after | never solved after |"
          + "".join(f"{e} |" for e in extra))
    print("|---|---|---|---|---|" + "---|" * len(extra))
    for b in bins:
        low, high = b["lengths"]
        room = ""
        if args.turns:
            room = f" {'yes' if high <= args.turns else 'partly' if low <= args.turns else 'no'} |"
        print(f"| {low}-{high} | {b['goals']} | {b['before']:.3f} | {b['after']:.3f} | "
              f"{b['never_solved_after']} |" + (f" {b['chance']:.3f} |" if with_chance else "")
              + room)
    report = {"runs": args.runs, "chance": args.chance, "chance_policy": chance_policy,
              "goals": goals, "bins": bins}
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
