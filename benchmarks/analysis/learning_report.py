"""A learning run's figure and numbers, from its own files: curves (PNG) drawn from
``metrics.jsonl`` and the held-out gain with a paired bootstrap 95% interval computed from
``trajectories_eval.jsonl`` (evaluation at the first and the last evaluated step).

    python benchmarks/analysis/learning_report.py runs/babyai_gpu --out results/babyai_gpu
    python benchmarks/analysis/learning_report.py runs/a runs/b --labels scaling,fixed --out results/cmp

Writes to ``--out``: ``curves.png``, ``gain.json`` (before / after Avg@k, the gain and its
interval, number of tasks and samples) and copies of the runs' small files (``metrics.jsonl``,
``summary.json``, ``config.json``, and ``eval_episodes.jsonl`` when the run has it: one line
per evaluation episode with its task, step, status, score, turns, invalid actions, parse
failures and final context tokens, :data:`EPISODE_FIELDS`) so every figure can be checked.
Full trajectory files are not copied (large); a copied JSON-lines file over 64 KiB is stored
gzip-compressed (``X.jsonl.gz``, lossless: the GPU machine copies the tracked tree under a
64 MiB limit), and every script here reads both forms.

The interval: tasks are resampled with replacement (10,000 draws, seeded), each draw's gain is
the mean over its tasks of (after success rate - before success rate) on the same task: a
paired bootstrap over held-out tasks, the unit the evaluation samples. ``--metric`` picks the
metric (``agentrl_jax/training/evaluation/eval_metrics.py``): ``avg`` (default: Avg@k, the mean task
score in [0, 1]; ScienceWorld's 0-100 score / 100), ``pass`` (Pass@k: a task passes when any of
its episodes scores > 0) or ``success`` (the environment's completion flag; on ScienceWorld the
task completed, not any partial score). Before 2026-12 the default counted an episode that had
the flag or any positive score (the old Avg@k); ``strict_success`` and ``reward`` are accepted
as the old names of ``success`` and ``avg``.

Comparisons between runs evaluated on the same held-out tasks (``--diff``, comma-separated
``B:A`` pairs of labels, each optionally ``@first``, ``@last`` (default) or ``@<step>``): the
difference B - A with the same paired bootstrap, e.g. GiGPO against GRPO after training, or an
SFT policy against the base model (the RL run's step-0 evaluation)::

    python benchmarks/analysis/learning_report.py runs/grpo runs/gigpo runs/sft --labels grpo,gigpo,sft \
        --diff gigpo:grpo,sft:grpo@first --out results/cmp

They go to ``gain.json`` under ``"differences"``. A run directory that is missing or has no
evaluation episodes gets ``{"missing": why}`` (and so does every difference naming it): the
other numbers are still computed.

Evaluation episodes are read from ``trajectories_eval*.jsonl[.gz]`` (a run's full files) or
``*_trajectories.jsonl`` (``launch/eval.py --output X.json``: step 0), else from
``eval_episodes*.jsonl[.gz]`` (the small per-episode files this script writes), never both.
``--collect`` only copies each run's small files, with ``eval_episodes.jsonl`` extracted from
its full trajectories, to ``--out/<label>/`` (what a GPU machine sends back; the report can be
made from those directories later)::

    python benchmarks/analysis/learning_report.py runs/a runs/b --labels a,b --collect --out small/
    python benchmarks/analysis/learning_report.py small/a small/b --labels a,b --diff b:a --out cmp/

Several training seeds of one configuration (``--seeds``): labels ``<name>_s<k>`` are seed k of
``<name>`` (a label without the suffix is seed 0). ``gain.json`` then also holds
``"seed_level"``: per configuration the mean over seeds, the spread (min, max, std) and a
two-level bootstrap 95% interval (seeds, then tasks within each seed) of its first and last
evaluations, and the ``--diff`` pairs between configurations, paired over tasks and over the
seeds both sides share (``base``, one evaluation of the untrained model, pairs with every seed;
``benchmarks/analysis/seed_stats.py`` states the formulas). With one seed the
interval is flagged as covering evaluation sampling only::

    python benchmarks/analysis/learning_report.py r/grpo r/grpo_s1 r/grpo_s2 r/gigpo r/gigpo_s1 \
        r/gigpo_s2 --seeds --diff gigpo:grpo --out cmp/
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
from collections import defaultdict

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # agentrl_jax
from agentrl_jax.agent.trajectory import record_context_tokens
from agentrl_jax.training.evaluation import eval_metrics  # noqa: E402

from agentrl_common.jsonl_files import (GZIP_SUFFIX, find_run_file, read_records,  # noqa: E402
                                        read_run_file, run_file_name, store_compact,
                                        trajectory_files)

PANELS = (  # (title, metric keys tried in order, y label)
    ("train reward", ("rollout/mean_reward",), "mean episode reward"),
    ("train success", ("rollout/success_rate",), "success rate"),
    ("held-out Avg@k", ("eval/avg@4", "eval/avg@1", "eval/avg@8"),
     "Avg@k (mean score; old runs: share > 0)"),
    ("entropy", ("actor/entropy",), "nats / token"),
    ("KL (to reference; else old -> new)", ("actor/ref_kl", "actor/ppo_kl"), "nats"),
    ("sampler vs learner log-prob", ("rollout/logprob_abs_diff_mean",), "mean |diff|"),
    ("step time", ("train/step_seconds",), "seconds"),
    ("horizon", ("train/horizon",), "turns"),
)


def read_jsonl(path: str) -> list[dict]:
    """The JSON objects of a plain or ``.jsonl.gz`` file ([] when it does not exist)."""
    return read_records(path)


def series(rows: list[dict], keys: tuple[str, ...]) -> tuple[list[int], list[float], str]:
    for key in keys:
        pts = [(r["step"], r[key]) for r in rows if key in r]
        if pts:
            return [p[0] for p in pts], [p[1] for p in pts], key
    return [], [], keys[0]


#: the fields of an evaluation episode kept in ``eval_episodes.jsonl``: the episode's identity
#: and outcome (``status``: done / max_turns / context_limit / env_error / engine_error, the
#: ending reason), its turns and :data:`COUNT_FIELDS`
EPISODE_FIELDS = ("env", "task_id", "group_id", "sample_index", "step", "status", "reward",
                  "success", "num_turns", "invalid_actions", "parse_failures", "context_tokens")
#: integer fields left out of a written file when unknown (None: a small file written before
#: them, or full trajectories from before ``Trajectory.parse_failures``): ``parse_failures`` =
#: turns whose reply the parser could not read (a part of ``invalid_actions``, whose rest the
#: environment refused); ``context_tokens`` = the final context length, prompt + every turn
#: (``Trajectory.context_tokens``: the last chunk with a history window; the limit it is held
#: to is ``rollout.max_context`` of the run's ``config.json``)
COUNT_FIELDS = ("parse_failures", "context_tokens")
#: list fields kept where an episode has them (``Trajectory.option_picks`` / ``letter_picks``:
#: per turn the chosen option's index in the environment's order and as shown, -1 for none)
PICK_FIELDS = ("option_picks", "letter_picks")
SMALL_FILES = ("metrics.jsonl", "summary.json", "config.json", "eval.json")


def eval_episode_files(run: str) -> list[str]:
    """The files holding ``run``'s evaluation episodes: the full trajectory files if any,
    else the small ``eval_episodes*.jsonl`` (never both: they hold the same episodes). Each
    may be gzip-compressed (``.jsonl.gz``, as committed to ``results/``); of a file present in
    both forms the plain one is read."""
    if not os.path.isdir(run):
        return []
    names = sorted(os.listdir(run))
    plain = sorted({run_file_name(n) for n in names})
    found = {n: find_run_file(run, n) for n in plain}
    full = [os.path.basename(p) for p in trajectory_files(run, "eval")] + [
        n for n in plain if n.endswith("_trajectories.jsonl")]
    small = [n for n in plain if n.startswith("eval_episodes") and n.endswith(".jsonl")]
    return [found.get(n) or os.path.join(run, n) for n in (full or small)]


def small_record(record: dict, default_step: int = 0) -> dict:
    """An episode record (full trajectory or small) reduced to :data:`EPISODE_FIELDS`
    (``step`` ``default_step`` when the record has none: ``launch/eval.py``'s output; a
    :data:`COUNT_FIELDS` value None when unknown), plus :data:`PICK_FIELDS` where recorded and
    ``shaping`` when it is not 0
    (``Trajectory.shaping``: the training-only part of ``reward``, which the score leaves out,
    ``eval_metrics.task_reward``)."""
    e = {k: record.get(k) for k in EPISODE_FIELDS}
    step = record.get("step")
    e["step"] = int(step if step is not None else default_step)
    e["context_tokens"] = record_context_tokens(record)
    if record.get("shaping"):  # kept where there is any: the score is reward - shaping
        e["shaping"] = record["shaping"]
    for key in PICK_FIELDS:  # kept where recorded: a multiple-choice run since 2026-12-04
        if record.get(key):
            e[key] = list(record[key])
    return e


def eval_episodes(run: str, style: str = "") -> list[dict]:
    """``run``'s evaluation episodes, each reduced to :data:`EPISODE_FIELDS`
    (:func:`small_record`); ``run`` may also be one JSONL file of episodes (e.g.
    ``launch/record_experts.py``'s). ``style``: only the records whose ``style`` is it (an
    ``action_format.py --episodes_out`` file holds one set of episodes per answer style).
    Episodes without a step take the checkpoint step of the folder's ``eval.json``
    (``launch/eval.py --output``: its ``step``, none for the base model), else 0."""
    out = []
    step = 0 if os.path.isfile(run) else eval_json_step(run)
    for path in [run] if os.path.isfile(run) else eval_episode_files(run):
        out.extend(small_record(t, step) for t in read_jsonl(path)
                   if not style or t.get("style") == style)
    return out


def eval_json_step(run: str) -> int:
    """The checkpoint step ``launch/eval.py`` wrote in ``run/eval.json`` (0 when there is no
    such file, no step or the base model's)."""
    path = find_run_file(run, "eval.json")
    if not path:
        return 0
    with open(path) as f:
        step = json.load(f).get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else 0


#: what ``--metric`` can be (``eval_metrics.METRICS``) and the old names still accepted
METRICS = eval_metrics.METRICS
OLD_METRIC_NAMES = {"strict_success": "success", "reward": "avg"}


def metric_name(metric: str) -> str:
    """``metric`` with an old name (:data:`OLD_METRIC_NAMES`) replaced; an unknown one raises
    ``ValueError``."""
    metric = OLD_METRIC_NAMES.get(metric, metric)
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r} (one of {', '.join(METRICS)})")
    return metric


def eval_success_by_task(run: str, metric: str = "avg") -> dict[int, dict[str, list[float]]]:
    """``{step: {task key: values}}`` of ``run``'s evaluation episodes: per task the values
    whose mean is its ``metric`` (``eval_metrics.task_values``: ``avg`` the episodes' scores,
    ``success`` their completion flags, ``pass`` one 0/1); error episodes left out."""
    metric = metric_name(metric)
    episodes: dict[int, list[dict]] = defaultdict(list)
    for t in eval_episodes(run):
        episodes[int(t["step"])].append(t)
    out = {step: eval_metrics.task_values(eval_metrics.outcomes(eps), metric)
           for step, eps in sorted(episodes.items())}
    return {step: values for step, values in out.items() if values}


def collect_run(run: str, dest: str) -> int:
    """Copy ``run``'s small files to ``dest`` and write its evaluation episodes there as
    ``eval_episodes.jsonl``; returns the number of episodes (0: none, nothing written). JSON-lines
    files over 64 KiB are stored gzip-compressed (``store_compact``: ``X.jsonl.gz``, lossless),
    as committed run folders keep them (results/README.md: the GPU machine's copy limit)."""
    os.makedirs(dest, exist_ok=True)
    for name in SMALL_FILES:
        src = find_run_file(run, name) if os.path.isdir(run) else None
        target = os.path.join(dest, os.path.basename(src)) if src else None
        if src and os.path.abspath(src) != os.path.abspath(target):
            shutil.copy(src, target)
            if target.endswith(GZIP_SUFFIX) and os.path.exists(target[:-len(GZIP_SUFFIX)]):
                os.remove(target[:-len(GZIP_SUFFIX)])  # a stale plain copy would be read first
        if name.endswith(".jsonl") and os.path.isfile(os.path.join(dest, name)):
            store_compact(os.path.join(dest, name))
    episodes = eval_episodes(run)
    if episodes:
        tmp = os.path.join(dest, "eval_episodes.jsonl.tmp")
        with open(tmp, "w") as f:
            # an unknown count is left out, not written as null
            f.writelines(json.dumps({k: v for k, v in e.items()
                                     if v is not None or k not in COUNT_FIELDS}) + "\n"
                         for e in episodes)
        os.replace(tmp, os.path.join(dest, "eval_episodes.jsonl"))
        store_compact(os.path.join(dest, "eval_episodes.jsonl"))
    return len(episodes)


def paired_bootstrap(before: dict[str, list[float]], after: dict[str, list[float]],
                     draws: int = 10_000, seed: int = 0) -> dict[str, float]:
    """The run report's paired bootstrap (``agentrl_jax.training.outputs.report``) in this script's
    ``gain.json`` field names, plus the median samples per task."""
    from agentrl_jax.training.outputs.report import paired_bootstrap as bootstrap

    r = bootstrap(before, after, draws=draws, seed=seed)
    if not r:
        return {}
    tasks = sorted(set(before) & set(after))
    return {"tasks": r["tasks"],
            "samples_per_task": int(np.median([len(after[t]) for t in tasks])),
            "before_avg": r["before"], "after_avg": r["after"], "gain": r["gain"],
            "gain_ci95_low": r["ci95_low"], "gain_ci95_high": r["ci95_high"]}


def eval_at(evals: dict[int, dict[str, list[float]]], which: str) -> tuple[int, dict]:
    """``(step, per-task successes)`` of ``which``: ``first``, ``last``, ``final`` (the last
    evaluation after the first: a run cut off before its final evaluation has none, where
    ``last`` would be its untrained step-0 evaluation) or a step number."""
    if not evals:
        raise ValueError("the run has no evaluation episodes")
    if which == "final" and len(evals) < 2:
        raise ValueError(f"no evaluation after training (only step {min(evals)}): the run "
                         "ended before its final evaluation")
    step = (min(evals) if which == "first" else max(evals) if which in ("last", "final")
            else int(which))
    if step not in evals:
        raise ValueError(f"no evaluation at step {step} (steps {sorted(evals)})")
    return step, evals[step]


def differences(spec: str, evals_by_label: dict[str, dict]) -> dict[str, dict]:
    """The ``--diff`` comparisons: ``"B:A,..."`` -> ``{"B:A": paired bootstrap of B - A}``."""
    out = {}
    for pair in [p.strip() for p in spec.split(",") if p.strip()]:
        sides = pair.split(":")
        if len(sides) != 2:
            raise ValueError(f"--diff takes B:A pairs, got {pair!r}")
        picked, missing = [], []
        for side in sides:
            label, _, which = side.partition("@")
            if label not in evals_by_label:
                raise ValueError(f"--diff names {label!r}; labels are {sorted(evals_by_label)}")
            try:
                picked.append((label, *eval_at(evals_by_label[label], which or "last")))
            except ValueError as e:
                missing.append(f"{label}: {e}")
        if missing:
            out[pair] = {"missing": "; ".join(missing)}
            continue
        (b_label, b_step, b), (a_label, a_step, a) = picked
        entry = paired_bootstrap(a, b)
        if not entry:
            entry = {"missing": f"no task evaluated by both {b_label}@{b_step} and "
                                f"{a_label}@{a_step}"}
        entry.update(a=a_label, a_step=a_step, b=b_label, b_step=b_step)
        out[pair] = entry
    return out


SEED_SUFFIX = re.compile(r"^(?P<name>.+)_s(?P<seed>\d+)$")


def seed_groups(labels: list[str]) -> dict[str, dict[int, str]]:
    """``--seeds``: ``{configuration: {training seed: label}}``; a label ``<name>_s<k>`` is
    seed k of ``<name>``, a label without that suffix is seed 0 of itself."""
    groups: dict[str, dict[int, str]] = defaultdict(dict)
    for label in labels:
        m = SEED_SUFFIX.match(label)
        name, s = (m["name"], int(m["seed"])) if m else (label, 0)
        if s in groups[name]:
            raise ValueError(f"{label!r} and {groups[name][s]!r} are both seed {s} of {name!r}")
        groups[name][s] = label
    return dict(groups)


def seed_level_report(evals_by_label: dict[str, dict], spec: str = "",
                      draws: int = 10_000, references: frozenset[str] = frozenset({"base"})
                      ) -> dict:
    """``--seeds``: per configuration (:func:`seed_groups`) the seed-level statistics
    (``seed_stats.seed_level``: mean over seeds, spread, two-level bootstrap interval) of its
    first and last evaluations, and the ``--diff`` pairs that name configurations
    (``seed_stats.seed_level_difference``; ``@last`` is each seed's own last evaluation; a
    configuration in ``references``, one untrained run such as the base model, pairs with every
    seed of the other side, other seeds pair seed by seed). A configuration or seed without
    evaluations is listed under ``"missing"``."""
    from seed_stats import seed_level, seed_level_difference

    groups = seed_groups(list(evals_by_label))

    def at(name: str, which: str) -> tuple[dict[int, dict], dict[int, int], list[str]]:
        per_seed, steps, missing = {}, {}, []
        for s, label in sorted(groups[name].items()):
            try:
                steps[s], per_seed[s] = eval_at(evals_by_label[label], which)
            except ValueError as e:
                missing.append(f"{label}: {e}")
        return per_seed, steps, missing

    out: dict = {"configurations": {}, "differences": {}}
    for name in groups:
        entry: dict = {"labels": groups[name]}
        for which in ("first", "last", "final"):
            per_seed, steps, missing = at(name, which)
            if per_seed:
                entry[which] = {**seed_level(per_seed, draws), "steps": steps}
            if missing:
                entry.setdefault("missing", []).extend(missing)
        out["configurations"][name] = entry
    for pair in [p.strip() for p in spec.split(",") if p.strip()]:
        sides = [side.partition("@") for side in pair.split(":")]
        if len(sides) != 2 or any(name not in groups for name, _, _ in sides):
            continue  # names a single label, not a configuration: in "differences" above
        (bn, _, bw), (an, _, aw) = sides
        (b, b_steps, b_miss), (a, a_steps, a_miss) = at(bn, bw or "last"), at(an, aw or "last")
        if not b or not a:
            out["differences"][pair] = {"missing": "; ".join(b_miss + a_miss)}
            continue
        try:
            ref = "a" if an in references else "b" if bn in references else None
            entry = seed_level_difference(b, a, draws, reference=ref)
        except ValueError as e:
            entry = {"missing": str(e)}
        entry.update(b_steps=b_steps, a_steps=a_steps)
        if b_miss or a_miss:
            entry["left_out"] = b_miss + a_miss
        out["differences"][pair] = entry
    return out


def plot(runs: list[str], labels: list[str], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 4, figsize=(18, 7.5))
    for run, label in zip(runs, labels):
        rows = read_run_file(run, "metrics.jsonl", missing_ok=True)
        for ax, (title, keys, ylabel) in zip(axes.flat, PANELS):
            x, y, key = series(rows, keys)
            if x:
                style = "o-" if len(x) < 12 else "-"
                ax.plot(x, y, style, label=label, markersize=4)
            ax.set_title(title)
            ax.set_xlabel("step")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
    for ax in axes.flat:
        if ax.lines and len(runs) > 1:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+")
    p.add_argument("--labels", default=None)
    p.add_argument("--out", required=True)
    p.add_argument("--seeds", action="store_true", help="also the seed-level statistics: labels "
                   "<name>_s<k> are training seed k of <name> (a label without it: seed 0); "
                   "adds seed_level (mean over seeds, spread, two-level bootstrap) to gain.json")
    p.add_argument("--diff", default="", help="B:A pairs of labels (label[@first|@last|@step]): "
                   "the paired difference B - A on their common held-out tasks")
    p.add_argument("--collect", action="store_true", help="only copy each run's small files "
                   "and evaluation episodes to --out/<label>/")
    p.add_argument("--metric", choices=(*METRICS, *OLD_METRIC_NAMES), default="avg",
                   help="avg (Avg@k, the mean task score; default), pass (Pass@k: any episode "
                   "scores > 0) or success (the completion flag); strict_success / reward: old "
                   "names of success / avg")
    args = p.parse_args(argv)
    labels = args.labels.split(",") if args.labels else [os.path.basename(r.rstrip("/"))
                                                         for r in args.runs]
    if len(labels) != len(args.runs):
        p.error(f"{len(args.runs)} runs but {len(labels)} labels")
    os.makedirs(args.out, exist_ok=True)
    if args.collect:
        for run, label in zip(args.runs, labels):
            n = collect_run(run, os.path.join(args.out, label))
            print(f"{label}: {n} evaluation episodes from {run}"
                  + ("" if os.path.isdir(run) else " (no such directory)"))
        return 0
    try:
        plot(args.runs, labels, os.path.join(args.out, "curves.png"))
    except ImportError as e:  # the numbers do not need matplotlib
        print(f"no curves.png ({e}); pip install matplotlib for the figure")
    report = {}
    evals_by_label = {}
    for run, label in zip(args.runs, labels):
        evals = eval_success_by_task(run, args.metric)
        evals_by_label[label] = evals
        entry: dict = {"metric": args.metric, "eval_steps": sorted(evals)}
        if not evals:
            entry["missing"] = (f"no run directory {run}" if not os.path.isdir(run)
                                else f"no evaluation episodes in {run}")
        else:
            entry["avg_by_step"] = {str(k): float(np.mean([np.mean(v) for v in evals[k].values()]))
                                    for k in sorted(evals)}
        if len(evals) >= 2:
            first, last = min(evals), max(evals)
            entry.update(paired_bootstrap(evals[first], evals[last]),
                         before_step=first, after_step=last)
        report[label] = entry
        dest = os.path.join(args.out, label) if len(args.runs) > 1 else args.out
        if os.path.isdir(run):
            collect_run(run, dest)
    if args.diff:
        report["differences"] = differences(args.diff, evals_by_label)
    if args.seeds:
        report["seed_level"] = seed_level_report(evals_by_label, args.diff)
    with open(os.path.join(args.out, "gain.json"), "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
