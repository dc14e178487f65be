"""Why deep search does or does not learn in the lettered-choice format (``choice_gpu``): from a
run's committed files (``config.json``, ``metrics.jsonl[.gz]``, ``eval_episodes.jsonl[.gz]``)
and, with ``--tasks``, the environment itself (no model):

    python benchmarks/analysis/deepsearch_diagnosis.py \
        results/choice_scratch/deepsearch_choicer_dev{,_s1,_s2} --tasks --reconstruct 3 \
        --out results/choice_scratch/deepsearch_diagnosis.json

Per run:

* ``evals`` (per evaluation step, N episodes; an episode that ends ``done`` answered, since an
  answer is the only action that ends a deep-search episode): ``answered`` and
  ``never_answered`` (counts; ``max_turns`` / ``context_limit`` endings never answered),
  ``answer_turns`` = {turn: answered episodes}, ``answer_turn_mean``, ``correct`` (reward > 0),
  ``correct_when_answered`` = correct / answered, ``tasks_solved`` (tasks with a correct
  episode), ``status`` (from ``eval_breakdown.breakdown``), ``invalid_actions``;
* ``train`` (per horizon phase of ``metrics.jsonl``, G = ``train.tasks_per_step`` groups a
  step): ``steps``, ``nonflat_groups`` = sum over steps of (G - ``rollout/flat_groups_skipped``)
  (groups whose rewards differ: the only ones with a non-zero GRPO advantage),
  ``flat_share`` = 1 - nonflat_groups / (G x steps), ``steps_without_update`` (every group
  flat), ``reward_mean`` (``rollout/mean_reward``), ``answered_share`` = sum
  ``rollout/status/done`` / sum ``rollout/episodes``, ``turns_mean``, ``entropy_first`` /
  ``entropy_last`` / ``entropy_mean`` (``actor/entropy`` over the steps that updated),
  ``step_seconds_mean``, ``context_limit`` (episodes that outgrew the context).

With ``--tasks`` (the built-in ``search`` task set): per split (train, dev) ``questions``,
``kinds`` ({kind: questions}), ``oracle_reachable`` (``expert.listed_oracle_solves`` within 10
turns) with ``oracle_search_option_by_turn`` (the listed search it picks, as
``search_option_by_turn`` below), and ``overlap`` = dev questions sharing a task id / an
article of their path / a golden answer with a train question; per run and evaluation,
``solved_tasks_oracle_reachable``.

With ``--reconstruct S`` (implies ``--tasks``): an answered episode's searches are not recorded,
but its final context length is, and it is a function of them: ``context_tokens`` = the prompt
+ ``Action:`` + per search (the reply letter, the passages + options block as
``deepsearch_options.turn_tokens`` counts them, ``Action:``) + the answer's letter. For each
answered episode with at most S searches, every sequence of listed searches whose context length
equals ``context_tokens`` is a *consistent path*. Per evaluation: ``episodes_tried``,
``matched`` (at least one consistent path), ``unique`` (exactly one), and over the matched
episodes whose consistent paths all agree: ``golden_listed`` (a golden answer among the answers
listed at the answer turn), ``golden_not_listed``, ``answers_listed_mean``,
``search_option_by_turn`` = {turn: {option index: episodes}} (the listed search picked at each
search turn, where every consistent path picked the same; index 0 = "a": the question's key
phrase, 1: the question itself on turn 1, then the names in the key phrase, then the names of
the passages) and ``correct_with_golden_listed``. A correct episode whose every consistent
path has no golden answer listed would show the reconstruction wrong:
``correct_contradictions`` counts them (0 expected).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from eval_breakdown import breakdown, evaluation_steps
from learning_report import eval_episodes

from agentrl_common import jsonl_files
from agentrl_jax.training.evaluation.eval_metrics import task_reward

#: statuses of an episode that ended without an answer
UNANSWERED = ("max_turns", "context_limit")


def _task_reward(e: dict) -> float:
    """An episode record's task reward (``eval_metrics.task_reward``: the reward less its
    training-only ``shaping``, the evidence reward)."""
    return float(task_reward(e.get("reward"), e.get("shaping")) or 0.0)


def eval_counts(episodes: list[dict]) -> dict[str, dict]:
    """``{step: counts}`` of the module docstring's ``evals`` over a run's evaluation episodes
    (small records: ``task_id``, ``step``, ``status``, ``reward``, ``num_turns``)."""
    out: dict[str, dict] = {}
    for step in sorted(set(evaluation_steps(episodes).values())):
        eps = [e for e in episodes if int(e["step"]) == step]
        answered = [e for e in eps if e["status"] == "done"]
        correct = [e for e in eps if _task_reward(e) > 0]
        turns = Counter(int(e["num_turns"]) for e in answered)
        b = breakdown(episodes, step)
        out[str(step)] = {
            "episodes": len(eps),
            "answered": len(answered),
            "never_answered": sum(e["status"] in UNANSWERED for e in eps),
            "answer_turns": {str(t): n for t, n in sorted(turns.items())},
            "answer_turn_mean": (
                sum(t * n for t, n in turns.items()) / len(answered) if answered else None
            ),
            "correct": len(correct),
            "correct_when_answered": len(correct) / len(answered) if answered else None,
            "tasks_solved": sorted({e["task_id"] for e in correct}),
            "status": {k: round(v * len(eps)) for k, v in b["status"].items()},
            "invalid_actions": sum(int(e.get("invalid_actions") or 0) for e in eps),
        }
    return out


def train_signal(rows: list[dict], groups: int) -> dict[str, dict]:
    """``{horizon: numbers}`` of the module docstring's ``train`` from ``metrics.jsonl`` rows
    (the training rows: those with ``rollout/episodes``); ``groups`` = tasks a step."""
    phases: dict[int, list[dict]] = {}
    for r in rows:
        if "rollout/episodes" in r:
            phases.setdefault(int(r["train/horizon"]), []).append(r)
    out = {}
    for horizon, rs in sorted(phases.items()):
        nonflat = [groups - int(r["rollout/flat_groups_skipped"]) for r in rs]
        entropy = [float(r["actor/entropy"]) for r in rs if "actor/entropy" in r]
        episodes = sum(float(r["rollout/episodes"]) for r in rs)
        out[str(horizon)] = {
            "steps": len(rs),
            "first_step": int(rs[0]["step"]),
            "last_step": int(rs[-1]["step"]),
            "nonflat_groups": sum(nonflat),
            "flat_share": 1.0 - sum(nonflat) / (groups * len(rs)),
            "steps_without_update": sum(n == 0 for n in nonflat),
            "reward_mean": sum(float(r["rollout/mean_reward"]) for r in rs) / len(rs),
            "reward_last5_mean": sum(float(r["rollout/mean_reward"]) for r in rs[-5:])
            / len(rs[-5:]),
            "answered_share": sum(float(r.get("rollout/status/done", 0.0)) for r in rs) / episodes,
            "turns_mean": sum(float(r["rollout/mean_turns"]) for r in rs) / len(rs),
            "entropy_first": entropy[0] if entropy else None,
            "entropy_last": entropy[-1] if entropy else None,
            "entropy_mean": sum(entropy) / len(entropy) if entropy else None,
            "step_seconds_mean": sum(float(r["train/step_seconds"]) for r in rs) / len(rs),
            "context_limit": int(
                sum(float(r.get("rollout/status/context_limit", 0.0)) for r in rs)
            ),
        }
    return out


def consistent_paths(
    target: int,
    start: int,
    listed: Callable[[tuple[str, ...]], list[str]],
    increment: Callable[[tuple[str, ...]], int],
    searches: int,
) -> list[tuple[str, ...]]:
    """Every sequence of ``searches`` queries, each among the searches ``listed(path so far)``
    lists, whose context ``start + sum(increment(path[:i+1]))`` equals ``target``
    (``increment(path)``: the tokens the last search of ``path`` added). Increments are
    positive, so a branch past ``target`` is cut."""
    found: list[tuple[str, ...]] = []

    def grow(path: tuple[str, ...], context: int) -> None:
        if len(path) == searches:
            if context == target:
                found.append(path)
            return
        for query in listed(path):
            nxt = (*path, query)
            total = context + increment(nxt)
            if total <= target:
                grow(nxt, total)

    grow((), start)
    return found


class EpisodeReplayer:
    """Replays deep-search search paths for one question through the environment's own pieces
    (``admissible_actions``, the retriever, the agent's ``ChatFormatter``), cached per path."""

    def __init__(
        self, question: str, golden: Sequence[str], search: Any, formatter: Any, system: str
    ) -> None:
        from benchmarks.analysis.deepsearch_options import first_context

        self.question, self.golden, self.search = question, tuple(golden), search
        self.formatter, self.system = formatter, system
        self._states: dict[tuple[str, ...], tuple[list[str], list, list[str]]] = {
            (): ([], [], self._admissible([], []))
        }
        self._increments: dict[tuple[str, ...], int] = {}
        self.start = first_context(formatter, system, question, self._states[()][2])

    def _admissible(self, searched: list[str], seen: list) -> list[str]:
        from environments.deepsearch.admissible import admissible_actions

        return admissible_actions(self.question, searched, seen)

    def state(self, path: tuple[str, ...]) -> tuple[list[str], list, list[str]]:
        """``(searched, seen passages, listed actions)`` after the searches of ``path``."""
        if path not in self._states:
            from environments.deepsearch.admissible import after_search

            searched, seen, _ = self.state(path[:-1])
            searched, seen = after_search(searched, seen, path[-1], self.search(path[-1]))
            self._states[path] = (searched, seen, self._admissible(searched, seen))
        return self._states[path]

    def listed_searches(self, path: tuple[str, ...]) -> list[str]:
        from environments.deepsearch.env import parse_tool_call

        calls = [parse_tool_call(a) for a in self.state(path)[2]]
        return [arg for tool, arg in calls if tool == "search"]

    def increment(self, path: tuple[str, ...]) -> int:
        """The tokens the last search of ``path`` added to the context."""
        if path not in self._increments:
            from benchmarks.analysis.deepsearch_options import turn_tokens

            results = self.search.results(path[-1])
            self._increments[path] = turn_tokens(
                self.formatter, self.system, results, self.state(path)[2]
            )
        return self._increments[path]

    def answers(self, path: tuple[str, ...]) -> list[str]:
        from environments.deepsearch.env import parse_tool_call

        calls = [parse_tool_call(a) for a in self.state(path)[2]]
        return [arg for tool, arg in calls if tool == "answer"]

    def golden_listed(self, path: tuple[str, ...]) -> bool:
        from environments.deepsearch.scoring import exact_match

        return any(exact_match(a, self.golden) == 1.0 for a in self.answers(path))


def reconstruct(
    episodes: list[dict], replayers: dict[str, EpisodeReplayer], max_searches: int
) -> dict[str, Any]:
    """The module docstring's reconstruction numbers over the answered ``episodes`` of one
    evaluation with at most ``max_searches`` searches (``num_turns - 1``)."""
    tried = [
        e
        for e in episodes
        if e["status"] == "done"
        and 1 <= e["num_turns"] - 1 <= max_searches
        and e.get("context_tokens") is not None
    ]
    out: dict[str, Any] = {
        "episodes_tried": len(tried),
        "matched": 0,
        "unique": 0,
        "agreeing": 0,
        "golden_listed": 0,
        "golden_not_listed": 0,
        "correct_with_golden_listed": 0,
        "correct_contradictions": 0,
        "answers_listed": [],
        "search_option_by_turn": defaultdict(Counter),
    }
    for e in tried:
        r = replayers[e["task_id"]]
        paths = consistent_paths(
            int(e["context_tokens"]) - 1,
            r.start,
            r.listed_searches,
            r.increment,
            int(e["num_turns"]) - 1,
        )
        if not paths:
            continue
        out["matched"] += 1
        out["unique"] += len(paths) == 1
        listed = {r.golden_listed(p) for p in paths}
        correct = _task_reward(e) > 0
        out["correct_contradictions"] += correct and listed == {False}
        if len(listed) != 1:
            continue
        out["agreeing"] += 1
        golden = listed.pop()
        out["golden_listed" if golden else "golden_not_listed"] += 1
        out["correct_with_golden_listed"] += correct and golden
        out["answers_listed"].append(len(r.answers(paths[0])))
        for turn in range(int(e["num_turns"]) - 1):
            picks = {r.listed_searches(p[:turn]).index(p[turn]) for p in paths}
            if len(picks) == 1:
                out["search_option_by_turn"][turn + 1][picks.pop()] += 1
    n = out.pop("answers_listed")
    out["answers_listed_mean"] = sum(n) / len(n) if n else None
    out["search_option_by_turn"] = {
        str(turn): {str(k): v for k, v in sorted(picks.items())}
        for turn, picks in sorted(out["search_option_by_turn"].items())
    }
    return out


def read_metrics(run: str) -> list[dict]:
    """The rows of ``run``'s ``metrics.jsonl[.gz]``."""
    plain = os.path.join(run, "metrics.jsonl")
    path = plain if os.path.exists(plain) else plain + jsonl_files.GZIP_SUFFIX
    return list(jsonl_files.iter_records(path))


def diagnose_run(run: str) -> dict[str, Any]:
    """``evals`` and ``train`` of one run directory."""
    with open(os.path.join(run, "config.json")) as f:
        groups = int(json.load(f)["train"]["tasks_per_step"])
    return {
        "evals": eval_counts(eval_episodes(run)),
        "train": train_signal(read_metrics(run), groups),
    }


def task_contrast(backend: Any, search: Any) -> dict[str, Any]:
    """Per split (train, dev) the questions, kinds and oracle reach; the dev/train overlap."""
    from environments.deepsearch.admissible import admissible_actions, after_search
    from environments.deepsearch.env import parse_tool_call
    from environments.deepsearch.expert import listed_oracle_solves
    from environments.deepsearch.scoring import normalize_answer

    out: dict[str, Any] = {"splits": {}, "reachable": set()}
    items = {s: [backend.items[i] for i in backend.catalog.task_ids(s)] for s in ("train", "dev")}
    for split, its in items.items():
        reach, picks = [], defaultdict(Counter)
        for i in its:
            trace: list[tuple[str, str]] = []
            if not listed_oracle_solves(i.question, i.golden_answers, i.path, search, 10, trace):
                continue
            reach.append(i.id)
            searched: list[str] = []
            seen: list = []
            for turn, (tool, query) in enumerate(trace, 1):
                if tool != "search":
                    break
                listed = [
                    parse_tool_call(a) for a in admissible_actions(i.question, searched, seen)
                ]
                picks[turn][[a for t, a in listed if t == "search"].index(query)] += 1
                searched, seen = after_search(searched, seen, query, search(query))
        out["reachable"].update(reach)
        out["splits"][split] = {
            "questions": len(its),
            "kinds": dict(Counter(i.kind for i in its)),
            "oracle_reachable": len(reach),
            "oracle_search_option_by_turn": {
                str(t): {str(k): v for k, v in sorted(c.items())} for t, c in sorted(picks.items())
            },
        }
    train_ids = {i.id for i in items["train"]}
    train_articles = {t for i in items["train"] for t in i.path}
    train_answers = {normalize_answer(a) for i in items["train"] for a in i.golden_answers}
    dev = items["dev"]
    out["overlap"] = {
        "task_ids": sum(i.id in train_ids for i in dev),
        "path_article": sum(any(t in train_articles for t in i.path) for i in dev),
        "answer_article": sum(i.path[-1] in train_articles for i in dev),
        "golden_answer": sum(
            any(normalize_answer(a) in train_answers for a in i.golden_answers) for i in dev
        ),
    }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="run directories (config, metrics, eval episodes)")
    ap.add_argument("--tasks", action="store_true", help="also the task sets (the environment)")
    ap.add_argument(
        "--reconstruct",
        type=int,
        default=0,
        help="reconstruct the searches of answered episodes with at most this many",
    )
    ap.add_argument("--out", default="", help="write the JSON here")
    args = ap.parse_args(argv)
    report: dict[str, Any] = {"runs": {}}
    for run in args.runs:
        report["runs"][os.path.basename(os.path.normpath(run))] = diagnose_run(run)
    if args.tasks or args.reconstruct:
        report.update(environment_numbers(args.runs, report, args.reconstruct))
    text = json.dumps(report, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


def environment_numbers(runs: Sequence[str], report: dict, max_searches: int) -> dict:
    """The ``--tasks`` / ``--reconstruct`` numbers (module docstring), added to ``report``'s
    runs in place; returns ``{"tasks": ...}``."""
    from agentrl_jax.agent.chat import ChatFormatter
    from agentrl_jax.agent.prompts import system_prompt
    from agentrl_jax.models.pretrained import resolve_model_path
    from agentrl_jax.models.tokenizer import load_tokenizer
    from benchmarks.analysis.deepsearch_options import MAX_STEPS, PASSAGES, CachedSearch
    from environments.deepsearch.backend import BackendConfig, SearchBackend
    from environments.deepsearch.env import INSTRUCTIONS

    backend = SearchBackend(BackendConfig(), "search")
    search = CachedSearch(backend)
    tasks = task_contrast(backend, search)
    reachable = tasks.pop("reachable")
    formatter = system = None
    if max_searches:
        formatter = ChatFormatter(load_tokenizer(resolve_model_path("smollm2")))
        system = system_prompt(
            INSTRUCTIONS.format(k=PASSAGES, max_steps=MAX_STEPS), "deepsearch", "choice"
        )
    replayers: dict[str, EpisodeReplayer] = {}
    for run in runs:
        episodes = eval_episodes(run)
        entry = report["runs"][os.path.basename(os.path.normpath(run))]
        for step, counts in entry["evals"].items():
            counts["solved_tasks_oracle_reachable"] = sum(
                t in reachable for t in counts["tasks_solved"]
            )
            if not max_searches:
                continue
            eps = [e for e in episodes if str(e["step"]) == step]
            for e in eps:
                if e["task_id"] not in replayers:
                    item = backend.question(e["task_id"])
                    replayers[e["task_id"]] = EpisodeReplayer(
                        item.question, item.golden_answers, search, formatter, system
                    )
            counts["reconstruction"] = reconstruct(eps, replayers, max_searches)
            print(f"{run} step {step}: {counts['reconstruction']}", file=sys.stderr)
    return {"tasks": tasks}


if __name__ == "__main__":
    raise SystemExit(main())
