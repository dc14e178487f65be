"""Regenerate the results table: every training job of the table for each training seed, then
the paper-layout table (families x base / SFT / RL only / SFT+RL, mean over seeds with a
two-level bootstrap interval) from whatever results exist.

    python benchmarks/analysis/results_table.py --gpus 4 --budget 3000            # jobs, then the table
    python benchmarks/analysis/results_table.py --gpus 2 --per-gpu 2 --seeds 1,2  # 4 lanes on 2 GPUs
    python benchmarks/analysis/results_table.py --dry-run                         # the job plan only
    python benchmarks/analysis/results_table.py --stage table --doc docs/RESULTS.md
    python benchmarks/analysis/results_table.py --smoke                           # CPU, tiny model

Stage ``jobs``: for each seed in ``--seeds`` (0,1,2), one call of ``benchmarks/gpu/sft_rl_comparison.sh
--seed S --stage record,wave1,wave2 --wave2-pair2 horizons`` on 4 lanes (``--gpus`` x
``--per-gpu``: one or two jobs per GPU, ``CUDA_VISIBLE_DEVICES`` per lane). That script holds the
job logic: every job under ``timeout`` (its cap, and no later than ``--budget``), a done marker
in ``<out>/.done`` (a job done before is skipped, so the command resumes after a cut-off), and
right after each job its small files (config.json, metrics.jsonl, summary.json,
eval_episodes.jsonl) and log copied to ``<results>/<job>/``. Runs keep their full length
(``--fixed-length``): a job that does not fit in the budget left is not started, so the seeds
stay comparable; run the same command again (a later call) to go on. The jobs per seed: BabyAI and
TextCraft SFT, SFT+GRPO and SFT+GiGPO (wave1; the base-model evaluations and expert recordings
once), BabyAI GRPO (RL only, ScalingInter-RL 6 -> 13 -> 20) and GiGPO from the base model and
GRPO with a fixed 6-turn and a fixed 20-turn horizon at the same wall time (wave2). Then the
ScienceWorld and deep-search rows: ``benchmarks/gpu/jobs.sh`` on ``--family-jobs``
(``benchmarks/jobs/families_table.txt``: their experts, then SFT -> SFT+GRPO and RL only for
seeds 0, 1, 2, whatever ``--seeds`` says), on the same lanes, ``--out`` and ``--results``;
last the web-navigation row, ``--web-jobs`` (``benchmarks/jobs/webnav_table.txt``), where
Chromium is found (``MINIWOB_CHROME_BINARY`` or ``PATH``).

Stage ``table``: reads the runs under ``--from`` directories (default ``--results``; a label is
a subdirectory ``<job>`` or ``<job>_s<k>`` with evaluation episodes; ``--alias job=dir`` names
single runs kept elsewhere, as seed 0) and writes ``<results>/table.md`` and ``table.json``:
the family table of Avg@k (the mean task score, the paper's headline metric) with the
comparisons, then the same cells for Pass@k and for the success rate (the environment's
completion flag), all three from ``agentrl_jax/training/evaluation/eval_metrics.py``; each cell
``seed_stats`` over the seeds that exist (``benchmarks/analysis/seed_stats.py``), "no runs yet" where
none do. ``tests/test_results_doc.py`` rebuilds the tables of docs/RESULTS.md from the
committed runs (:data:`DOC_SOURCES`) and fails when a printed number differs. A comparison of two training
configurations from one start (``SAME_START``: GiGPO vs GRPO, ScalingInter-RL vs a fixed horizon,
the twice-evaluated SFT policy) pairs a seed's two runs only when both started from the same
policy (:func:`start_policy`); a seed whose runs did not is left out of it and named.
``--doc FILE`` replaces the part of FILE between ``<!-- results-table:begin -->`` and
``<!-- results-table:end -->`` with it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # environments
import learning_report  # noqa: E402
import seed_stats  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: (row name, job-name prefix) of the paper's families
FAMILIES = (("BabyAI", "babyai"), ("TextCraft", "textcraft"), ("ScienceWorld", "sciworld"),
            ("web navigation", "webnav"), ("deep search", "deepsearch"))
#: column -> the (job, evaluation) that measures it, first one present wins
#: (``final``: the last evaluation after the first; a run cut off before it has no entry, never
#: its untrained step-0 evaluation in a trained column)
COLUMNS = {"base": (("{p}_base", "first"), ("{p}_grpo", "first")),
           "SFT": (("{p}_sft_grpo", "first"), ("{p}_sft_gigpo", "first")),
           "RL only": (("{p}_grpo", "final"),),
           "SFT+RL": (("{p}_sft_grpo", "final"),)}
#: comparisons (name, alternatives of "B[@which]:A[@which]"), per family prefix
COMPARISONS = (("SFT - base",
                 ("{p}_sft_grpo@first:{p}_base", "{p}_sft_grpo@first:{p}_grpo@first")),
               ("SFT+GRPO - SFT", ("{p}_sft_grpo@final:{p}_sft_grpo@first",)),
               ("SFT+GiGPO - SFT", ("{p}_sft_gigpo@final:{p}_sft_gigpo@first",)),
               ("SFT+GiGPO - SFT+GRPO", ("{p}_sft_gigpo@final:{p}_sft_grpo@final",)),
               ("RL only - base", ("{p}_grpo@final:{p}_grpo@first",)),
               ("GiGPO - GRPO (RL only)", ("{p}_gigpo@final:{p}_grpo@final",)),
               ("ScalingInter-RL - fixed 6 turns",
                ("{p}_hscaling@final:{p}_fixed6@final", "{p}_grpo@final:{p}_fixed6@final")),
               ("ScalingInter-RL - fixed 20 turns",
                ("{p}_hscaling@final:{p}_fixed20@final", "{p}_grpo@final:{p}_fixed20@final")),
               ("control: the SFT policy evaluated twice",
                ("{p}_sft_gigpo@first:{p}_sft_grpo@first",)))
#: comparisons whose two runs of one seed must start from the same policy to be a paired
#: comparison (a seed whose runs started from different policies is left out of them)
SAME_START = frozenset({"SFT+GiGPO - SFT+GRPO", "GiGPO - GRPO (RL only)",
                        "ScalingInter-RL - fixed 6 turns", "ScalingInter-RL - fixed 20 turns",
                        "control: the SFT policy evaluated twice"})
BEGIN, END = "<!-- results-table:begin -->", "<!-- results-table:end -->"
#: the metrics of the tables, headline first (``eval_metrics.METRICS``)
TABLE_METRICS = ("avg", "pass", "success")
#: ``--from`` directories and ``--alias`` entries of docs/RESULTS.md's table (relative to ROOT)
DOC_SOURCES = ("results/table", "results/issue15_gpu_wave1",
               "results/families_gpu", "results/webnav")
DOC_ALIASES = {"textcraft_grpo": "results/textcraft_shared_gpu",
               "sciworld_sft_grpo": "results/families_gpu/sciworld_sft_grpo_long"}


# ------------------------------------------------------------------------------------ jobs
def job_commands(args: argparse.Namespace, budget_left: int | None) -> list[list[str]]:
    """One ``sft_rl_comparison.sh`` call per seed (the job logic lives there)."""
    cmds = []
    for s in args.seeds:
        cmd = ["bash", os.path.join(ROOT, "benchmarks", "gpu", "sft_rl_comparison.sh"), "--seed", str(s),
               "--stage", args.waves, "--wave2-pair2", args.pair2, "--out", args.out,
               "--results", args.results, "--gpus", str(args.gpus), "--per-gpu", str(args.per_gpu),
               "--fixed-length"]
        if budget_left is not None:
            cmd += ["--budget", str(budget_left)]
        cmd += ["--smoke"] * args.smoke + ["--dry-run"] * args.dry_run
        cmds.append(cmd)
    return cmds


def family_command(args: argparse.Namespace, budget_left: int | None,
                   jobs: str | None = None) -> list[str]:
    """The ``jobs.sh`` call of a jobs file (default ``--family-jobs``: the ScienceWorld and
    deep-search rows, seeds 0-2 as that file lists them; ``--web-jobs``: web navigation) on the
    same lanes, ``--out`` and ``--results``."""
    cmd = ["bash", os.path.join(ROOT, "benchmarks", "gpu", "jobs.sh"), "--jobs",
           os.path.join(ROOT, jobs or args.family_jobs), "--out", args.out, "--results", args.results,
           "--gpu-ids", ",".join(str(g) for g in range(args.gpus)),
           "--per-gpu", str(args.per_gpu)]
    if budget_left is not None:
        cmd += ["--budget", str(budget_left)]
    return cmd + ["--dry-run"] * args.dry_run


def run_jobs(args: argparse.Namespace) -> int:
    """Run the seeds' calls one after the other (each fills the lanes), then the families'
    jobs file; returns the number of calls that reported a failed or skipped job."""
    t0, failed = time.time(), 0
    calls = [(f"seed {s}", lambda left, s=s: job_commands(
        argparse.Namespace(**{**vars(args), "seeds": [s]}), left)[0]) for s in args.seeds]
    if args.family_jobs and not args.smoke:
        calls.append(("ScienceWorld and deep search", lambda left: family_command(args, left)))
    if args.web_jobs and not args.smoke:
        missing = "" if args.dry_run else no_browser()
        if missing:
            print(f"[results_table] web navigation: {missing}; its jobs not started "
                  "(benchmarks/gpu/chromium_portable.sh makes a portable Chromium)", flush=True)
            failed += 1
        else:
            calls.append(("web navigation",
                          lambda left: family_command(args, left, args.web_jobs)))
    for what, command in calls:
        left = None if not args.budget else int(args.budget - (time.time() - t0))
        if left is not None and left < 60:
            print(f"[results_table] {what}: {left} s of the budget left, not started")
            failed += 1
            continue
        cmd = command(left)
        print(f"[results_table] {what}: {' '.join(cmd)}", flush=True)
        failed += subprocess.call(cmd, cwd=ROOT) != 0
    return failed


def no_browser() -> str:
    """Why the web-navigation jobs cannot run here ("" when Chromium and chromedriver exist)."""
    from environments.miniwob.browser import BrowserUnavailableError, chrome_paths

    try:
        chrome_paths()
    except BrowserUnavailableError as error:
        return str(error)
    return ""


# ------------------------------------------------------------------------------------ table
def find_runs(dirs: list[str], aliases: dict[str, str]) -> dict[str, str]:
    """``{label: run directory}``: ``--alias`` entries, then every subdirectory of ``dirs``
    with evaluation episodes (the first directory holding a label wins)."""
    runs = dict(aliases)
    for d in dirs:
        if not os.path.isdir(d):
            continue
        for name in sorted(os.listdir(d)):
            path = os.path.join(d, name)
            if name not in runs and learning_report.eval_episode_files(path):
                runs[name] = path
    return runs


def _group(runs: dict[str, str], job: str) -> list[str]:
    """The labels of ``job``'s seeds among ``runs`` (``job`` and ``job_s<k>``)."""
    return [label for label in runs if label == job or (
        label.startswith(job + "_s") and label[len(job) + 2:].isdigit())]


def start_policy(run_dir: str) -> str | None:
    """The policy a run started from: its ``config.json``'s ``model.name`` as its last two path
    parts (``babyai_sft_s2/model``: the SFT run that made it, wherever its folder was; a known
    name such as ``smollm2`` as is), or None when the run has no ``config.json``."""
    try:
        with open(os.path.join(run_dir, "config.json")) as f:
            name = str(json.load(f)["model"]["name"]).rstrip("/")
    except (OSError, KeyError, TypeError, ValueError):
        return None
    return "/".join(name.split("/")[-2:])


def _seeds(runs: dict[str, str], job: str) -> dict[int, str]:
    """``{training seed: label}`` of ``job``'s runs (``learning_report.seed_groups``)."""
    return learning_report.seed_groups(_group(runs, job)).get(job, {})


def different_starts(runs: dict[str, str], b_job: str, a_job: str) -> dict[int, str]:
    """``{seed: why}`` for the seeds whose ``b_job`` and ``a_job`` runs started from different
    policies (:func:`start_policy`; a run without a config counts as the same start)."""
    a_runs = _seeds(runs, a_job)
    out = {}
    for seed, lab in _seeds(runs, b_job).items():
        if seed not in a_runs:
            continue
        b, a = start_policy(runs[lab]), start_policy(runs[a_runs[seed]])
        if b is not None and a is not None and b != a:
            out[seed] = (f"seed {seed} left out: its runs started from different policies "
                         f"({b} vs {a})")
    return out


def samples_per_task(runs: dict[str, str]) -> int:
    """The k of the runs' evaluations: the most common number of finished episodes per task."""
    counts: dict[int, int] = {}
    for run in runs.values():
        for values in learning_report.eval_success_by_task(run, "avg").values():
            for v in values.values():
                counts[len(v)] = counts.get(len(v), 0) + 1
    return max(counts, key=lambda n: (counts[n], n)) if counts else 0


def build_table(runs: dict[str, str], draws: int = 10_000, metric: str = "avg",
                comparisons: bool = True) -> dict:
    """``{"cells": {family: {column: entry}}, "comparisons": {family: {name: entry}}}`` of
    ``metric`` (``eval_metrics.METRICS``; ``comparisons=False``: the cells only); an entry is
    ``seed_stats`` output plus ``job`` / ``which``, or ``{"missing": why}``."""
    evals: dict[str, dict] = {}

    def load(labels: list[str]) -> dict[str, dict]:
        for label in labels:
            if label not in evals:
                evals[label] = learning_report.eval_success_by_task(runs[label], metric)
        return {label: evals[label] for label in labels}

    out: dict = {"cells": {}, "comparisons": {}}
    for family, p in FAMILIES:
        row = {}
        for column, options in COLUMNS.items():
            row[column] = {"missing": "no runs yet"}
            for job_t, which in options:
                job = job_t.format(p=p)
                labels = _group(runs, job)
                if not labels:
                    continue
                rep = learning_report.seed_level_report(load(labels), draws=draws)
                entry = rep["configurations"][job].get(which)
                if not entry and row[column] == {"missing": "no runs yet"}:
                    row[column] = {"missing": f"`{job}` has no evaluation after training"}
                if entry:
                    row[column] = {**entry, "job": job, "which": which,
                                   **({"left_out": rep["configurations"][job]["missing"]}
                                      if "missing" in rep["configurations"][job] else {})}
                    break
        out["cells"][family] = row
        comps: dict = {}
        for name, options in COMPARISONS if comparisons else ():
            for spec_t in options:
                spec = spec_t.format(p=p)
                jobs = [side.partition("@")[0] for side in spec.split(":")]
                if not all(_group(runs, j) for j in jobs):
                    continue
                refs = frozenset(j for j in jobs if j.endswith("_base"))  # untrained: no seed
                unpaired = (different_starts(runs, *jobs)
                            if name in SAME_START and jobs[0] != jobs[1] else {})
                labels = [lab for j in dict.fromkeys(jobs) for seed, lab in _seeds(runs, j).items()
                          if seed not in unpaired]
                if not labels:
                    continue
                entry = learning_report.seed_level_report(load(labels), spec, draws, refs)[
                    "differences"].get(spec)
                if entry and "missing" not in entry:
                    comps[name] = {**entry, "spec": spec,
                                   **({"unpaired": list(unpaired.values())} if unpaired else {})}
                    break
        out["comparisons"][family] = comps
    return out


def _cell(e: dict, signed: bool = False) -> str:
    if "missing" in e:
        return e["missing"]
    n = e["n_seeds"]
    return (f"{seed_stats.fmt_points(e, signed)} ({n} seed{'s' * (n > 1)}"
            f"{'†' if e['single_seed'] else ''})")


def build_tables(runs: dict[str, str], draws: int = 10_000) -> dict:
    """``{"k": k, "avg": table, "pass": cells, "success": cells}``: :func:`build_table` of
    each of :data:`TABLE_METRICS`, the comparisons for Avg@k only."""
    return {"k": samples_per_task(runs),
            **{m: build_table(runs, draws, m, comparisons=m == "avg") for m in TABLE_METRICS}}


def metric_title(metric: str, k: int) -> str:
    """The heading naming what a table shows (``eval_metrics.METRIC_TITLES``)."""
    from agentrl_jax.training.evaluation.eval_metrics import METRIC_TITLES

    return METRIC_TITLES[metric].format(k=k or "k")


def cells_markdown(table: dict) -> list[str]:
    """The family x column table of one metric (markdown lines)."""
    cols = list(COLUMNS)
    lines = ["| family | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for family, _ in FAMILIES:
        cells = table["cells"][family]
        if all("missing" in cells[c] for c in cols):
            lines.append(f"| {family} | " + " | ".join(["no runs yet"] * len(cols)) + " |")
        else:
            lines.append(f"| {family} | " + " | ".join(_cell(cells[c]) for c in cols) + " |")
    return lines


def markdown(tables: dict, runs: dict[str, str]) -> str:
    """The tables (:func:`build_tables`) as markdown, in points (the metric x 100): Avg@k with
    the comparisons, then Pass@k and the success rate; each says which metric it shows."""
    k, table = tables["k"], tables["avg"]
    lines = [f"**{metric_title('avg', k)}**, held-out, in points:", "", *cells_markdown(table)]
    lines += ["", f"| comparison of {metric_title('avg', k).split(' (')[0]} | family | "
              "B - A, points (95% CI) | t over seeds | per seed |",
              "|---|---|---|---|---|"]
    for family, _ in FAMILIES:
        for name, e in table["comparisons"][family].items():
            diffs = list(e.get("per_pair", {}).values())
            per = ", ".join(f"{100 * v:+.1f}" for v in diffs) if diffs else "unpaired seeds"
            per += "".join(f"; {why}" for why in e.get("unpaired", []))
            t = seed_stats.fmt_points(seed_stats.t_interval(diffs), signed=True) \
                if len(diffs) > 1 else "-"
            lines.append(f"| {name} | {family} | {_cell(e, signed=True)} | {t} | {per} |")
    used = sorted({e["job"] for c in table["cells"].values() for e in c.values() if "job" in e}
                  | {j.partition("@")[0] for c in table["comparisons"].values()
                     for e in c.values() for j in e["spec"].split(":")})
    for metric in TABLE_METRICS[1:]:
        lines += ["", f"**{metric_title(metric, k)}**, held-out, in points:", "",
                  *cells_markdown(tables[metric])]
    lines += ["", "Every cell: the mean over training seeds of the metric its table names, on "
              "the held-out tasks, in points (`agentrl_jax/training/evaluation/eval_metrics.py`: Avg@k the "
              "mean task score in [0, 1], ScienceWorld's score / 100; Pass@k a task passes when "
              "any of its k episodes scores > 0, the paper's success; success rate the "
              "environment's completion flag, ScienceWorld's task completed); the "
              "interval is a two-level bootstrap 95% interval (seeds, then tasks within a seed; "
              "`benchmarks/analysis/seed_stats.py`). † one seed: the interval covers evaluation sampling "
              "only, not training variance. *t over seeds*: the Student-t 95% interval over the "
              "per-seed differences (S - 1 degrees of freedom, `seed_stats.t_interval`); with "
              "two or three seeds the bootstrap over seeds is narrower than it should be, the "
              "t-interval is the cautious reading. Runs: "
              + "; ".join(f"`{j}`: " + ", ".join(f"`{os.path.relpath(runs[lab], ROOT)}`"
                                                 for lab in sorted(_group(runs, j)))
                          for j in used) + "."]
    return "\n".join(lines) + "\n"


def write_doc(path: str, text: str) -> None:
    """Replace the marked block of ``path`` with ``text`` (error if the markers are absent)."""
    doc = open(path).read()
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"{path} has no {BEGIN} ... {END} block")
    head, rest = doc.split(BEGIN, 1)
    open(path, "w").write(head + BEGIN + "\n" + text + END + rest.split(END, 1)[1])


def table_stage(args: argparse.Namespace) -> None:
    aliases = {}
    for a in args.alias:
        job, sep, path = a.partition("=")
        if not sep or not job or not path:
            raise SystemExit(f"--alias takes job=directory, got {a!r}")
        if not learning_report.eval_episode_files(path):
            raise SystemExit(f"--alias {a}: no evaluation episodes in {path}")
        aliases[job] = path
    runs = find_runs(args.sources or [args.results], aliases)
    table = build_tables(runs, args.draws)
    text = markdown(table, runs)
    os.makedirs(args.results, exist_ok=True)
    with open(os.path.join(args.results, "table.json"), "w") as f:
        json.dump({"runs": {k: os.path.relpath(v, ROOT) for k, v in runs.items()},
                   "metric": "avg", "k": table["k"], **table["avg"],  # the headline: Avg@k
                   "other_metrics": {m: table[m]["cells"] for m in TABLE_METRICS[1:]}}, f,
                  indent=1)
    with open(os.path.join(args.results, "table.md"), "w") as f:
        f.write(text)
    if args.doc:
        write_doc(args.doc, text)
    print(text)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stage", default="jobs,table", help="jobs, table or jobs,table")
    p.add_argument("--seeds", default="0,1,2", help="training seeds (comma-separated)")
    p.add_argument("--gpus", type=int, default=4)
    p.add_argument("--per-gpu", type=int, default=1, choices=(1, 2))
    p.add_argument("--budget", type=int, default=0, help="seconds for all jobs (0: no limit)")
    p.add_argument("--waves", default="record,wave1,wave2", help="sft_rl_comparison.sh stages")
    p.add_argument("--family-jobs", default="benchmarks/jobs/families_table.txt",
                   help="jobs.sh file of the other families' rows, run after the seeds' "
                        "calls ('' to leave them out)")
    p.add_argument("--web-jobs", default="benchmarks/jobs/webnav_table.txt",
                   help="jobs.sh file of the web-navigation row (needs Chromium), run last "
                        "('' to leave it out)")
    p.add_argument("--out", default="runs/table", help="runs (checkpoints, full trajectories)")
    p.add_argument("--results", default="results/table", help="the small files, the table")
    p.add_argument("--from", dest="sources", action="append", default=[],
                   help="directories of collected runs for the table (default: --results)")
    p.add_argument("--alias", action="append", default=[], help="job=directory: one run kept "
                   "elsewhere, as seed 0 of job (e.g. babyai_grpo=results/babyai_gpu_f32)")
    p.add_argument("--doc", default="", help="file whose results-table block gets the table")
    p.add_argument("--draws", type=int, default=10_000)
    p.add_argument("--dry-run", action="store_true", help="print the job plan, run nothing")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny model, seeds 0,1, BabyAI GRPO "
                   "and GiGPO from the base model only, into /tmp/results_table_smoke")
    args = p.parse_args(argv)
    args.pair2 = "horizons"
    stages = set(args.stage.split(","))
    if not stages <= {"jobs", "table"}:
        p.error(f"--stage: jobs, table or both, got {args.stage}")
    if args.smoke:
        args.seeds, args.waves, args.pair2 = "0,1", "wave2", "none"
        if args.out == "runs/table":
            args.out = "/tmp/results_table_smoke"
        if args.results == "results/table":
            args.results = os.path.join(args.out, "results")
    try:
        args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        p.error(f"--seeds takes numbers, got {args.seeds}")
    failed = 0
    if "jobs" in stages:
        failed = run_jobs(args)
    if "table" in stages and not args.dry_run:
        table_stage(args)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
