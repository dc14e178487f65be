"""Why a family does or does not learn, in numbers: per evaluation (or rollout) step of a run's
full trajectory files, the share of turns whose action the environment accepted, the parser's
failures per turn, the reward and success rates, the episode lengths in turns and tokens, and
how episodes ended (``context_limit`` = the history outgrew ``rollout.max_context``).

    python benchmarks/analysis/episode_diagnosis.py runs/families/sciworld_grpo --out diag.json
    python benchmarks/analysis/episode_diagnosis.py runs/families/experts/scienceworld.jsonl

Inputs: run directories (their ``trajectories_eval*.jsonl[.gz]``, or with ``--train``
``trajectories_train*.jsonl``) or trajectory JSONL files (``Trajectory.to_json`` lines, e.g.
recorded expert episodes). Per group (file, step), with T = all turns of its episodes:

* ``valid_action_share`` = 1 - sum(invalid_actions) / T (an invalid action is a reply the
  parser could not read, or a command the environment rejected);
* ``parse_failures_per_turn`` = (turns whose reply the parser could not read) / T, from each
  episode's ``parse_failures`` (:func:`parse_failures`; None when an episode's is unknown);
* ``reward_rate`` = share of episodes with task reward > 0; ``success_rate`` = share with the
  success flag; ``mean_reward`` (the task reward: an episode's reward less its training-only
  ``shaping``, ``eval_metrics.task_reward``) and ``mean_shaping`` (that bonus);
* ``turns_mean``, ``tokens_mean`` / ``tokens_p90`` / ``tokens_max`` (each episode's final
  context, prompt + all turns: ``Trajectory.context_tokens``; None when unknown),
  ``prompt_tokens_mean`` and ``status`` counts.

The small evaluation records of ``results/`` (``eval_episodes.jsonl``) carry ``parse_failures``
and ``context_tokens`` when written from trajectories that had them, so they are summarised
alike; the older ones give None for those figures.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from collections import Counter, defaultdict

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from agentrl_common import jsonl_files  # noqa: E402
from agentrl_jax.agent.parsing import INVALID_FORMAT_FEEDBACK  # noqa: E402
from agentrl_jax.agent.trajectory import record_context_tokens  # noqa: E402
from agentrl_jax.training.evaluation.eval_metrics import task_reward  # noqa: E402


def trajectory_files(source: str, train: bool = False) -> list[str]:
    """The trajectory JSONL files of a run directory (evaluation ones unless ``train``) or the
    file itself."""
    if os.path.isfile(source):
        return [source]
    files = jsonl_files.trajectory_files(source, "train" if train else "eval")
    if not files and not train:  # launch/eval.py --output X.json writes X_trajectories.jsonl
        plain = glob.glob(os.path.join(source, "*_trajectories.jsonl"))
        files = sorted(plain + [p for p in glob.glob(os.path.join(source, "*_trajectories.jsonl"
                                                                  + jsonl_files.GZIP_SUFFIX))
                                if p[:-len(jsonl_files.GZIP_SUFFIX)] not in plain])
    return files


def parse_failures(episode: dict) -> int | None:
    """Turns of ``episode`` whose reply the parser could not read: its ``parse_failures``
    (``Trajectory.parse_failures``, exact); else, for a full trajectory written before that
    field, its user messages that open with ``INVALID_FORMAT_FEEDBACK`` (a lower bound: a
    failure on the episode's last turn gets no feedback message); None for a small record
    without the field (unknown)."""
    if episode.get("parse_failures") is not None:
        return int(episode["parse_failures"])
    messages = episode.get("messages")
    if not isinstance(messages, list):
        return None
    return sum(1 for m in messages if m.get("role") == "user"
               and str(m.get("content", "")).startswith(INVALID_FORMAT_FEEDBACK))


def summarise(episodes: list[dict]) -> dict:
    """The numbers of the module docstring for one group of episodes (``to_json`` dicts or
    small evaluation records)."""
    turns = sum(int(e.get("num_turns") or 0) for e in episodes)
    invalid = sum(int(e.get("invalid_actions") or 0) for e in episodes)
    failures = [parse_failures(e) for e in episodes]
    known = turns and None not in failures
    contexts = [record_context_tokens(e) for e in episodes]
    tokens = np.array(contexts, dtype=np.int64) if contexts and None not in contexts else None
    rewards = np.array([float(task_reward(e.get("reward") or 0.0, e.get("shaping")))
                        for e in episodes] or [0.0])
    shaping = [float(e.get("shaping") or 0.0) for e in episodes] or [0.0]
    return {
        "episodes": len(episodes),
        "turns": turns,
        "valid_action_share": (1.0 - invalid / turns) if turns else None,
        "parse_failures_per_turn": (sum(failures) / turns) if known else None,
        "reward_rate": float(np.mean(rewards > 0)),
        "success_rate": float(np.mean([bool(e.get("success")) for e in episodes] or [0])),
        "mean_reward": float(np.mean(rewards)),
        "mean_shaping": float(np.mean(shaping)),
        "turns_mean": turns / max(len(episodes), 1),
        "tokens_mean": None if tokens is None else float(np.mean(tokens)),
        "tokens_p90": None if tokens is None else float(np.percentile(tokens, 90)),
        "tokens_max": None if tokens is None else int(tokens.max()),
        "prompt_tokens_mean": float(np.mean([int(e.get("prompt_length") or 0)
                                             for e in episodes] or [0])),
        "status": dict(Counter(str(e.get("status")) for e in episodes)),
    }


def diagnose(sources: list[str], train: bool = False) -> dict[str, dict[str, dict]]:
    """``{file: {step: summary}}`` over every trajectory file of ``sources``."""
    out: dict[str, dict[str, dict]] = {}
    for source in sources:
        for path in trajectory_files(source, train):
            groups: dict[int, list[dict]] = defaultdict(list)
            for e in jsonl_files.iter_records(path):
                groups[int(e.get("step") or 0)].append(e)
            out[path] = {str(step): summarise(eps) for step, eps in sorted(groups.items())}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sources", nargs="+", help="run directories or trajectory JSONL files")
    p.add_argument("--train", action="store_true", help="a run's training rollouts "
                   "(trajectories_train*.jsonl) instead of its evaluations")
    p.add_argument("--out", default=None, help="write the JSON here as well")
    args = p.parse_args(argv)
    result = diagnose(args.sources, args.train)
    if not result:
        print("no trajectory files found", file=sys.stderr)
        return 1
    text = json.dumps(result, indent=2)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    for path, steps in result.items():
        for step, s in steps.items():
            vas = "-" if s["valid_action_share"] is None else f"{s['valid_action_share']:.2f}"
            pft = "-" if s["parse_failures_per_turn"] is None else f"{s['parse_failures_per_turn']:.2f}"
            tok = ("-" if s["tokens_mean"] is None else f"mean {s['tokens_mean']:.0f} p90 "
                   f"{s['tokens_p90']:.0f} max {s['tokens_max']}")
            print(f"{path} step {step}: {s['episodes']} episodes, valid actions {vas}, parse "
                  f"failures/turn {pft}, reward>0 {s['reward_rate']:.2f}, success "
                  f"{s['success_rate']:.2f}, turns {s['turns_mean']:.1f}, tokens {tok}, "
                  f"{s['status']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
