"""The end-of-run report: ``report.md`` and PNG learning curves in the run's workdir.

    python -m agentrl_jax.training.outputs.report RUN_DIR [--out DIR]

Written by ``launch/run.py`` when a run ends, from the run's own files: ``metrics.jsonl``
(curves, last-step statistics), ``summary.json`` (steps, time, evaluations), ``config.json``
(what was trained) and the evaluation episodes (``trajectories_eval*.jsonl[.gz]``, or the
``eval_episodes.jsonl[.gz]`` kept with published results) for the held-out gain between the first
and the last evaluation with a paired bootstrap 95% interval over tasks (each draw resamples
tasks with replacement; a task's gain is its mean score after minus before). Avg@k, Pass@k and
the success rate are ``training/evaluation/eval_metrics.py``'s; an evaluation of an older ``summary.json``
(no ``scoring`` key) shows its Avg@k marked "(old metric)": it was the share of episodes with
the success flag or a positive score.

Every input is optional: a missing or partial file drops its section (the report says which)
and never fails the run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import time
from collections import defaultdict
from typing import Any, Callable, Sequence

import numpy as np

from agentrl_common.jsonl_files import find_run_file, iter_lines, trajectory_files
from agentrl_jax.training.evaluation import eval_metrics
from agentrl_jax.training.config.experiment import model_label

REPORT_FILE = "report.md"
CURVES_FILE = "report_curves.png"
ERROR_STATUSES = eval_metrics.ERROR_STATUSES
#: (title, metric keys tried in order, y label); ``eval/avg@*`` is the run's ``eval/avg@k``
PANELS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("train reward", ("rollout/mean_reward",), "mean episode reward"),
    ("held-out Avg@k", ("eval/avg@*",), "Avg@k (mean score; old runs: share > 0)"),
    ("train success", ("rollout/success_rate",), "success rate"),
    ("entropy", ("actor/entropy",), "nats / token"),
    ("KL", ("actor/ref_kl", "actor/kl_loss", "actor/ppo_kl"), "nats"),
    ("step time", ("train/step_seconds", "perf/step_time_s"), "seconds"),
    ("horizon", ("train/horizon",), "turns"),
    ("invalid actions / turn", ("rollout/invalid_action_rate", "rollout/invalid_actions"),
     "rate"),
)
_EVAL_AVG = re.compile(r"^eval/avg@(\d+)$")
OLD_NOTE = eval_metrics.OLD_AVG_MEANING.removeprefix("old metric: ")


def _loads(line: bytes) -> Any:
    try:
        import orjson
        return orjson.loads(line)
    except ImportError:  # pragma: no cover
        return json.loads(line)


def read_jsonl(path: str, keep: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file, plain or ``.jsonl.gz`` (malformed lines skipped; a
    missing file: []). ``keep``: only these fields of each object (large trajectory lines)."""
    out: list[dict[str, Any]] = []
    try:
        lines = iter_lines(path)
        for line in lines:
            try:
                obj = _loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                out.append({k: obj[k] for k in keep if k in obj} if keep else obj)
    except OSError:
        return out
    return out


def run_file_path(run_dir: str, name: str) -> str:
    """``run_dir``'s file ``name`` (e.g. ``metrics.jsonl``), plain or ``.gz`` (committed runs
    keep large ones compressed): ``find_run_file``, else the plain path (which reads as [])."""
    return find_run_file(run_dir, name) or os.path.join(run_dir, name)


def _read_json(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def series(rows: list[dict[str, Any]], keys: Sequence[str]) -> tuple[str | None, list[int],
                                                                         list[float]]:
    """The first of ``keys`` the rows have: (key, steps, values) with finite values only;
    ``eval/avg@*`` stands for the ``eval/avg@k`` keys present (smallest k first)."""
    expanded: list[str] = []
    for k in keys:
        if k == "eval/avg@*":
            found = {m.group(0): int(m.group(1)) for r in rows for m in map(_EVAL_AVG.match, r)
                     if m}
            expanded += sorted(found, key=found.get)
        else:
            expanded.append(k)
    for key in expanded:
        pts = [(int(r["step"]), float(r[key])) for r in rows
               if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)
               and math.isfinite(float(r[key])) and isinstance(r.get("step"), (int, float))]
        if pts:
            return key, [p[0] for p in pts], [p[1] for p in pts]
    return None, [], []


def eval_success_by_task(run_dir: str, metric: str = "avg") -> dict[int, dict[str, list[float]]]:
    """``{step: {env/task: values}}`` from the evaluation episodes (``trajectories_eval*.jsonl``
    or ``eval_episodes.jsonl``, each plain or ``.gz``), the values of ``metric``
    (``eval_metrics.task_values``: ``avg`` the episodes' scores, ``success`` their completion
    flags, ``pass`` one 0/1 per task); error episodes left out."""
    paths = trajectory_files(run_dir, "eval") + [
        p for p in [find_run_file(run_dir, "eval_episodes.jsonl")] if p]
    episodes: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for path in paths:
        for t in read_jsonl(path,
                            keep=("env", "task_id", "step", "status", "success", "reward")):
            if isinstance(t.get("step"), int):
                episodes[int(t["step"])].append(t)
    out = {step: eval_metrics.task_values(eval_metrics.outcomes(eps), metric)
           for step, eps in sorted(episodes.items())}
    return {step: values for step, values in out.items() if values}


def paired_bootstrap(before: dict[str, list[float]], after: dict[str, list[float]],
                     draws: int = 10_000, seed: int = 0) -> dict[str, float]:
    """Gain in the mean task value (after - before) over the tasks both sides have, with a
    paired bootstrap 95% interval ({} when no task is shared)."""
    tasks = sorted(set(before) & set(after))
    if not tasks:
        return {}
    b = np.array([np.mean(before[t]) for t in tasks])
    a = np.array([np.mean(after[t]) for t in tasks])
    diff = a - b
    rng = np.random.default_rng(seed)
    boot = diff[rng.integers(0, len(tasks), (draws, len(tasks)))].mean(axis=1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return {"tasks": len(tasks), "before": float(b.mean()), "after": float(a.mean()),
            "gain": float(diff.mean()), "ci95_low": float(lo), "ci95_high": float(hi)}


def plot_curves(rows: list[dict[str, Any]], path: str, title: str = "") -> list[str]:
    """Draw the :data:`PANELS` the run logged into ``path`` (PNG); returns their titles
    (none logged: no file, [])."""
    panels = [(t, *series(rows, keys), y) for t, keys, y in PANELS]
    panels = [p for p in panels if p[2]]
    if not panels:
        return []
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(4, len(panels))
    nrows = -(-len(panels) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.0 * nrows), squeeze=False)
    for ax, (name, key, steps, values, ylabel) in zip(axes.flat, panels):
        ax.plot(steps, values, "o-" if len(steps) < 15 else "-", markersize=3.5, color="#2f5fd0")
        ax.set_title(f"{name} ({key})", fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)
    return [p[0] for p in panels]


def _fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return "–"
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return str(x)
    if isinstance(x, int):
        return str(x)
    if x != 0 and abs(x) < 10 ** -digits:
        return f"{x:.2e}"
    return f"{x:.{digits}f}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h} h {m} min" if h else f"{m} min {s} s" if m else f"{s} s"


def _cfg(cfg: dict[str, Any], dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def build_report(run_dir: str, curves_name: str | None = CURVES_FILE,
                 panels: Sequence[str] = ()) -> str:
    """The markdown text of the report of ``run_dir`` (``curves_name``: the PNG beside it)."""
    metrics = read_jsonl(run_file_path(run_dir, "metrics.jsonl"))
    summary = _read_json(os.path.join(run_dir, "summary.json"))
    cfg = _read_json(os.path.join(run_dir, "config.json"))
    missing = [n for n, present in (("metrics.jsonl", metrics), ("summary.json", summary),
                                    ("config.json", cfg)) if not present]
    name = os.path.basename(os.path.abspath(run_dir).rstrip("/"))
    lines = [f"# Run report: {name}", "",
             f"Workdir `{run_dir}`; written {time.strftime('%Y-%m-%d %H:%M')}."
             f" Browse every episode: `python -m agentrl_jax.viewer {run_dir}`.", ""]
    if cfg:
        items = [("model", model_label(_cfg(cfg, "model.name"), _cfg(cfg, "model.random_init"))
                  if _cfg(cfg, "model.name") else None),
                 ("environments", _cfg(cfg, "env.names")),
                 ("algorithm", _cfg(cfg, "learner.advantage_estimator")),
                 ("learning rate", _cfg(cfg, "learner.learning_rate")),
                 ("horizon", f"{_cfg(cfg, 'horizon.type')} {_cfg(cfg, 'horizon.phases')}"
                  if _cfg(cfg, "horizon.type") == "scaling_inter" else
                  f"fixed {_cfg(cfg, 'horizon.turns')}" if _cfg(cfg, "horizon.type") else None),
                 ("tasks x samples per step", f"{_cfg(cfg, 'train.tasks_per_step')} x "
                  f"{_cfg(cfg, 'train.samples_per_task')}"
                  if _cfg(cfg, "train.tasks_per_step") is not None else None)]
        lines += ["| setting | value |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in items if v is not None]
        lines.append("")

    lines += ["## Training", ""]
    train_rows = [r for r in metrics if any(k.startswith("rollout/") for k in r)]
    if summary or train_rows:
        steps = summary.get("final_step", max((int(r["step"]) for r in train_rows), default=None))
        total = _cfg(cfg, "train.total_steps")
        sessions = summary.get("sessions") or []
        # why the last session that trained stopped (later records may be evaluations, or
        # a kill noticed by the next session's workdir lock)
        stopped = next((s.get("stopped") for s in reversed(sessions) if s.get("steps")),
                       sessions[-1].get("stopped") if sessions else None)
        wall = sum(float(s.get("seconds") or 0) for s in sessions) if sessions else None
        _, rsteps, rewards = series(train_rows, ("rollout/mean_reward",))
        _, _, secs = series(train_rows, ("train/step_seconds",))
        lines += ["| | |", "|---|---|",
                  f"| steps | {_fmt(steps)}" + (f" of {total}" if total else "")
                  + (f" (stopped: {stopped})" if stopped else "") + " |",
                  f"| wall time | {_duration(wall)} ({len(sessions)} session(s)) |"
                  if sessions else "| wall time | – |",
                  f"| mean step time | {_fmt(float(np.mean(secs)) if secs else None, 1)} s |",
                  f"| train reward, first -> last step | {_fmt(rewards[0] if rewards else None)}"
                  f" -> {_fmt(rewards[-1] if rewards else None)} |",
                  f"| best train reward | {_fmt(max(rewards) if rewards else None)}"
                  + (f" (step {rsteps[int(np.argmax(rewards))]})" if rewards else "") + " |"]
        if train_rows:
            last = train_rows[-1]
            statuses = {k.split("/")[-1]: int(v) for k, v in last.items()
                        if k.startswith("rollout/status/")}
            if statuses:
                lines.append("| last step's episodes by status | "
                             + ", ".join(f"{k} {v}" for k, v in sorted(statuses.items())) + " |")
        lines.append("")
    else:
        lines += ["No training step was logged.", ""]

    if panels and curves_name:
        lines += [f"![learning curves]({curves_name})", "",
                  "Panels: " + ", ".join(panels) + " (from `metrics.jsonl`).", ""]

    lines += ["## Held-out evaluation", ""]
    evals = summary.get("evals") or {}
    eval_rows = []
    for step_s, ev in sorted(evals.items(), key=lambda kv: int(kv[0])):
        if isinstance(ev, dict):
            eval_rows.append((int(step_s), ev))
    if not eval_rows:  # a run still training: metrics only
        for r in metrics:
            k = next((m for m in map(_EVAL_AVG.match, r) if m), None)
            if k:
                kk = k.group(1)
                eval_rows.append((int(r["step"]), {
                    "k": int(kk), "avg_at_k": r.get(k.group(0)),
                    "pass_at_k": r.get(f"eval/pass@{kk}"),
                    "success_rate": r.get("eval/success_rate"),
                    **({"scoring": eval_metrics.SCORING} if "eval/success_rate" in r else {}),
                    "mean_reward": r.get("eval/mean_reward"),
                    "dropped": r.get("eval/dropped")}))
    if eval_rows:
        lines += ["| step | Avg@k | Pass@k | success rate | mean reward | tasks | k | dropped |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|"]
        old = False
        for step, ev in eval_rows:
            mark = "" if ev.get("scoring") else " (old metric)"
            old = old or (bool(mark) and ev.get("avg_at_k") is not None)
            avg = _fmt(ev.get("avg_at_k")) + (mark if ev.get("avg_at_k") is not None else "")
            lines.append(f"| {step} | {avg} | {_fmt(ev.get('pass_at_k'))} | "
                         f"{_fmt(ev.get('success_rate'))} | {_fmt(ev.get('mean_reward'))} | "
                         f"{_fmt(ev.get('num_tasks'))} | {_fmt(ev.get('k'))} | "
                         f"{_fmt(ev.get('dropped'))} |")
        lines += ["", "Avg@k: the mean task score in [0, 1]; Pass@k: the share of tasks with "
                  "an episode scoring > 0 among its k; success rate: the environment's "
                  "completion flag (`agentrl_jax/training/evaluation/eval_metrics.py`)."
                  + (f" *(old metric)*: written before these definitions, the {OLD_NOTE}."
                     if old else ""), ""]
    else:
        lines += ["No evaluation was run.", ""]
    by_task = eval_success_by_task(run_dir)
    if len(by_task) >= 2:
        first, last = min(by_task), max(by_task)
        gain = paired_bootstrap(by_task[first], by_task[last])
        if gain:
            lines += [f"Held-out Avg@k (mean task score) from step {first} to step {last}: "
                      f"{gain['before']:.3f} -> {gain['after']:.3f}, gain "
                      f"{100 * gain['gain']:+.1f} points, 95% CI "
                      f"[{100 * gain['ci95_low']:+.1f}, {100 * gain['ci95_high']:+.1f}] "
                      f"(paired bootstrap over {gain['tasks']} tasks).", ""]
    elif len(by_task) == 1 and eval_rows:
        lines += ["One evaluated step only: no before / after gain "
                  "(`train.eval_before=True` adds the step-0 evaluation).", ""]
    if missing:
        lines += [f"_Not found in the workdir: {', '.join(missing)}; their sections are "
                  "empty._", ""]
    return "\n".join(lines)


def write_report(run_dir: str, out_dir: str | None = None) -> dict[str, Any]:
    """Write ``report.md`` (and ``report_curves.png`` when any curve was logged) to ``out_dir``
    (default: the run directory). Returns ``{"report": path, "curves": path or None}``."""
    out_dir = out_dir or run_dir
    os.makedirs(out_dir, exist_ok=True)
    metrics = read_jsonl(run_file_path(run_dir, "metrics.jsonl"))
    curves_path = os.path.join(out_dir, CURVES_FILE)
    name = os.path.basename(os.path.abspath(run_dir).rstrip("/"))
    panels = plot_curves(metrics, curves_path, title=name)
    if not panels and os.path.exists(curves_path):
        os.remove(curves_path)  # a stale figure of an earlier session
    text = build_report(run_dir, CURVES_FILE if panels else None, panels)
    report = os.path.join(out_dir, REPORT_FILE)
    tmp = f"{report}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, report)
    return {"report": report, "curves": curves_path if panels else None}


def write_report_safely(run_dir: str, say: Callable[[str], None] = print) -> str | None:
    """:func:`write_report` for the end of a run: says where the report is, or why it could
    not be written; never raises."""
    try:
        out = write_report(run_dir)
    except Exception as e:  # a report must never fail (or hide the end of) a run
        say(f"run report not written: {type(e).__name__}: {e}")
        return None
    say(f"run report: {out['report']}" + (f" (curves {out['curves']})" if out["curves"] else ""))
    return out["report"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Write a run's report.md and PNG curves.")
    p.add_argument("run_dir")
    p.add_argument("--out", default=None, help="output directory (default: the run directory)")
    a = p.parse_args(argv)
    if not os.path.isdir(a.run_dir):
        p.error(f"not a directory: {a.run_dir}")
    out = write_report(a.run_dir, a.out)
    print(f"wrote {out['report']}" + (f" and {out['curves']}" if out["curves"] else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
