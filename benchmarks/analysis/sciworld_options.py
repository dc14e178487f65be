"""How much of ScienceWorld's gold paths a lettered-choice agent can follow: the share of the
gold action sequences' steps whose action is among the first ``--limit`` listed actions.

    python benchmarks/analysis/sciworld_options.py --split test --per-task 2 \\
        --json results/sciworld_options/test_after.json

No model. For ``--per-task`` variations of each of the 30 task types of ``--split`` (evenly
spaced over the type's ids), the script loads the variation, walks its gold action sequence
(``environments.scienceworld.expert.gold_path``, which completes the task) on the package's
simulator through ``ScienceWorldEnvironment``, and before each gold action asks the
environment for its listed order (``valid_actions()``: what the server's ``list_actions``
shows after that observation) and the simulator's whole valid list. A gold step is:

* **listed** when its action, or the same action with its object's location spelled out (the
  gold ``focus on thermometer in inventory`` is listed as ``focus on thermometer``), is among
  the first ``--limit`` of the order;
* **valid, not listed** when it is in the simulator's valid list but not among those;
* **not in the valid list** (set apart, not counted in the shares): actions the simulator
  accepts without listing them (``examine``, ``use``, ``open door to X`` that is already open,
  names its list spells otherwise).

A **scoring step** is one whose action raised the simulator's score: the steps a policy must
take to earn any reward. Also counted, per step: the ``focus on`` actions among the first
``--limit`` (a focus on a wrong object fails the task, so each is a way to lose). Per task
type and per command: steps, listed, and the shares; in all: the step-weighted share and the
mean over task types (long tasks have hundreds of steps).

The script uses only ``ScienceWorldEnvironment`` (its ``valid_actions`` and ``_valid_actions``)
and the expert, so the same file measures an older checkout: ``git archive <commit> | tar -x -C
/tmp/old``, copy this file into ``/tmp/old/benchmarks/analysis/`` and run it there (it puts its
own tree first on the import path).
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import statistics
import sys
import time
from typing import Any, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from environments.scienceworld.catalog import ScienceWorldCatalog  # noqa: E402
from environments.scienceworld.env import ScienceWorldEnvironment  # noqa: E402
from environments.scienceworld.expert import gold_path  # noqa: E402


def command_of(action: str) -> str:
    """``"look at pot"`` -> ``"look at"``, ``"move a to b"`` -> ``"move"``. The rule of
    ``environments.scienceworld.shortlist.command_of``, kept here so that this file also runs
    in trees from before that module (the "before" measurement)."""
    words = action.split()
    if len(words) > 1 and words[1] in ("on", "at", "in", "up", "down", "to"):
        return " ".join(words[:2])
    return words[0] if words else ""


def listed_forms(gold: str, valid: Sequence[str]) -> list[str]:
    """The valid actions that do what ``gold`` does: itself, or a valid ``a`` with ``gold ==
    a + " in <location>"``; [] when the valid list has neither."""
    if gold in valid:
        return [gold]
    return [a for a in valid if gold.startswith(a + " in ")]


def spaced_sample(task_ids: Sequence[str], per_task: int) -> list[str]:
    """``per_task`` ids of each task type, evenly spaced over the type's ids, in catalog order."""
    by_type: dict[str, list[str]] = collections.defaultdict(list)
    for task_id in task_ids:
        by_type[task_id.split("/")[0]].append(task_id)
    sample = []
    for ids in by_type.values():
        count = min(per_task, len(ids))
        sample.extend(ids[i * len(ids) // count] for i in range(count))
    return sample


def walk(env: ScienceWorldEnvironment, task_id: str, limit: int) -> list[dict[str, Any]]:
    """One gold path's steps: ``{"action", "command", "form": "listed" | "valid" | "not_valid",
    "rank", "scoring", "listed_count", "focus_listed"}`` (``focus_listed``: the ``focus on``
    actions among the first ``limit``, each a way to fail the task). The simulator's valid list
    is asked once a step."""
    steps: list[dict[str, Any]] = []
    env.reset(task_id)
    for action in gold_path(task_id):
        full = env._valid_actions()
        fetch = env._valid_actions
        env._valid_actions = lambda: full  # the order below re-reads this step's list
        try:
            order = env.valid_actions() or []
        finally:
            env._valid_actions = fetch
        forms = listed_forms(action, full)
        ranks = [order.index(a) for a in forms if a in order]
        rank = min(ranks) if ranks else None
        listed = rank is not None and rank < limit
        form = "not_valid" if not forms else "listed" if listed else "valid"
        result = env.step(action)
        focus = sum(a.startswith("focus on ") for a in order[:limit])
        steps.append({"action": action, "command": command_of(action), "form": form, "rank": rank,
                      "scoring": result.reward > 0, "listed_count": len(order),
                      "focus_listed": focus})
        if result.done or result.truncated:
            break
    return steps


def shares(steps: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Counts and the listed share over the steps that have a valid form."""
    comparable = [s for s in steps if s["form"] != "not_valid"]
    listed = sum(s["form"] == "listed" for s in comparable)
    return {"steps": len(steps), "comparable": len(comparable), "listed": listed,
            "share": round(listed / len(comparable), 4) if comparable else None}


def summarise(walks: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The shares over all steps, the scoring steps, per task type and per command."""
    steps = [s for w in walks.values() for s in w]
    by_type: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for task_id, w in walks.items():
        by_type[task_id.split("/")[0]].extend(w)
    by_command: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for s in steps:
        by_command[s["command"]].append(s)
    per_type = {t: shares(w) for t, w in by_type.items()}
    type_shares = [v["share"] for v in per_type.values() if v["share"] is not None]
    scoring = [s for s in steps if s["scoring"]]
    return {
        "all": shares(steps),
        "scoring_steps": shares(scoring),
        "mean_over_task_types": round(statistics.mean(type_shares), 4) if type_shares else None,
        "scoring_mean_over_task_types": _type_mean(by_type, scoring_only=True),
        "listed_count_median": statistics.median(s["listed_count"] for s in steps) if steps else 0,
        "focus_listed_mean": (round(statistics.mean(s.get("focus_listed", 0) for s in steps), 3)
                              if steps else 0),
        "per_task_type": per_type,
        "per_command": {c: shares(w)
                        for c, w in sorted(by_command.items(), key=lambda x: -len(x[1]))},
    }


def _type_mean(by_type: dict[str, list[dict[str, Any]]], scoring_only: bool) -> float | None:
    values = [shares([s for s in w if s["scoring"] or not scoring_only])["share"]
              for w in by_type.values()]
    values = [v for v in values if v is not None]
    return round(statistics.mean(values), 4) if values else None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--split", default="test", choices=("train", "dev", "test"))
    parser.add_argument("--per-task", type=int, default=2, help="variations per task type")
    parser.add_argument("--limit", type=int, default=26, help="the listed actions an agent sees")
    parser.add_argument("--json", default="", help="write the numbers here (every step beside it)")
    args = parser.parse_args(argv)
    if args.per_task < 1 or args.limit < 1:
        parser.error("--per-task and --limit must be >= 1")
    sample = spaced_sample(ScienceWorldCatalog().task_ids(args.split), args.per_task)
    env = ScienceWorldEnvironment(max_steps=1000)
    walks: dict[str, list[dict[str, Any]]] = {}
    start = time.perf_counter()
    try:
        for task_id in sample:
            walks[task_id] = walk(env, task_id, args.limit)
            s = shares(walks[task_id])
            print(f"{task_id}: {s['listed']}/{s['comparable']} gold steps listed "
                  f"({s['steps'] - s['comparable']} not in the valid list)", flush=True)
    finally:
        env.close()
    seconds = round(time.perf_counter() - start, 1)
    report = {"args": vars(args), "seconds": seconds, **summarise(walks)}
    a, sc = report["all"], report["scoring_steps"]
    print(f"{args.split}, {len(sample)} gold paths, the first {args.limit} listed: "
          f"{a['listed']}/{a['comparable']} steps listed ({a['share']}), mean over task types "
          f"{report['mean_over_task_types']}; scoring steps {sc['listed']}/{sc['comparable']} "
          f"({sc['share']}), mean over task types {report['scoring_mean_over_task_types']}; "
          f"{report['listed_count_median']} actions listed a step (median), "
          f"{report['focus_listed_mean']} of the first {args.limit} a focus (mean); "
          f"{report['seconds']} s")
    if args.json:
        write_report(args.json, report, walks)
    return 0


def write_report(path: str, report: dict[str, Any], walks: dict[str, list[dict[str, Any]]]) -> None:
    """The summary to ``path`` (JSON) and every walk's steps beside it, one line per task id, to
    ``<path less .json>_walks.jsonl.gz``."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    with gzip.open(walks_path(path), "wt") as f:
        for task_id, steps in walks.items():
            f.write(json.dumps({"task_id": task_id, "steps": steps}) + "\n")


def walks_path(path: str) -> str:
    """``out/test_after.json`` -> ``out/test_after_walks.jsonl.gz``."""
    return (path[:-5] if path.endswith(".json") else path) + "_walks.jsonl.gz"


if __name__ == "__main__":
    raise SystemExit(main())
