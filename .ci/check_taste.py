"""CI: run the README's CPU taste command verbatim and check what it promises.

The command is read from README.md (the ``bash`` block after the ``<!-- taste-command``
marker), so the README and this check cannot drift. Checks: exit code 0; ``summary.json`` of
the run's workdir has the expected fields (finished at ``train.total_steps`` with the final
evaluation); wall time <= ``--max-seconds`` (default 900 = 15 min); peak RSS of the run
(``ru_maxrss`` of the largest process, as ``/usr/bin/time -v`` reports it) <= ``--max-rss-gb``
(default 8, GB = 1e9 bytes). Prints one line with wall time, CPU time (user + sys), peak RSS,
``nproc`` and the load average at start and end (wall times are inflated on a shared machine).
The run gets an empty ``$AGENTRL_JAX_CACHE`` (no compilation or tokenizer cache left by the test
suite's runs), as on a fresh machine.

    python3 .ci/check_taste.py            # what .ci/check_taste.sh runs
    python3 .ci/check_taste.py --print    # only print the extracted command
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shlex
import shutil
import subprocess
import tempfile
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = "<!-- taste-command"


def extract_command(readme_text: str) -> str:
    """The single command of the ``bash`` block that follows :data:`MARKER` (backslash line
    continuations joined); raises ``ValueError`` when the marker or the block is missing."""
    lines = readme_text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if MARKER in line)
    except StopIteration:
        raise ValueError(f"README.md has no {MARKER} marker") from None
    fence = next((i for i in range(start + 1, len(lines)) if lines[i].strip().startswith("```")),
                 None)
    if fence is None or lines[fence].strip() not in ("```bash", "```sh", "```"):
        raise ValueError(f"no ```bash block after {MARKER}")
    end = next((i for i in range(fence + 1, len(lines)) if lines[i].strip() == "```"), None)
    if end is None:
        raise ValueError("the taste command block is not closed")
    command = " ".join(line.rstrip().removesuffix("\\").strip()
                       for line in lines[fence + 1:end] if line.strip())
    if not command:
        raise ValueError("the taste command block is empty")
    return command


def workdir_and_steps(command: str) -> tuple[str, int]:
    """The ``--workdir`` and ``--config.train.total_steps`` the command passes."""
    args = shlex.split(command)
    workdir = next((a.split("=", 1)[1] if "=" in a else args[i + 1]
                    for i, a in enumerate(args) if a.split("=", 1)[0] == "--workdir"), None)
    steps = next((a.split("=", 1)[1] for a in args
                  if a.startswith("--config.train.total_steps=")), None)
    if workdir is None or steps is None:
        raise ValueError("the taste command must pass --workdir and --config.train.total_steps")
    return workdir, int(steps)


def check_summary(workdir: str, total_steps: int) -> list[str]:
    """Problems with the finished run in ``workdir`` (empty: all good)."""
    path = os.path.join(workdir, "summary.json")
    if not os.path.exists(path):
        return [f"{path} does not exist"]
    with open(path) as f:
        s = json.load(f)
    problems = []
    for key in ("final_step", "finished_step", "start_step", "first_reward", "last_reward",
                "mean_step_seconds", "evals", "sessions"):
        if key not in s:
            problems.append(f"summary.json lacks {key!r}")
    if s.get("final_step") != total_steps or s.get("finished_step") != total_steps:
        problems.append(f"summary.json: final_step {s.get('final_step')} / finished_step "
                        f"{s.get('finished_step')}, expected {total_steps}")
    final = (s.get("evals") or {}).get(str(total_steps))
    if not isinstance(final, dict) or not all(isinstance(final.get(k), (int, float))
                                              for k in ("avg_at_k", "pass_at_k")):
        problems.append(f"summary.json has no final evaluation at step {total_steps}")
    for name in ("metrics.jsonl", "trajectories_train.jsonl", "trajectories_eval.jsonl",
                 os.path.join("checkpoints", str(total_steps))):
        path = os.path.join(workdir, name)
        if not os.path.exists(path) and not (name.startswith("trajectories_")
                                             and os.path.exists(path + ".gz")):
            problems.append(f"the run wrote no {name}"
                            + ("[.gz]" if name.startswith("trajectories_") else ""))
    return problems


def _load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--max-seconds", type=float, default=900.0)
    p.add_argument("--max-rss-gb", type=float, default=8.0)
    p.add_argument("--print", action="store_true", help="print the command and exit")
    args = p.parse_args(argv)
    with open(os.path.join(ROOT, "README.md")) as f:
        command = extract_command(f.read())
    if args.print:
        print(command)
        return 0
    workdir, total_steps = workdir_and_steps(command)
    workdir = os.path.join(ROOT, workdir)
    if os.path.exists(workdir):  # a finished run would only say so and exit
        print(f"[taste] removing the previous run {workdir}", flush=True)
        shutil.rmtree(workdir)
    print(f"[taste] nproc {os.cpu_count()}, load average {_load()}; running:\n{command}",
          flush=True)
    # as on a fresh machine: no compilation (or tokenizer) cache from the test suite's runs
    fresh_cache = tempfile.mkdtemp(prefix="taste-cache-")
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env["AGENTRL_JAX_CACHE"] = fresh_cache
    t0 = time.monotonic()
    try:
        rc = subprocess.call(["bash", "-c", command], cwd=ROOT, env=env)
    finally:
        shutil.rmtree(fresh_cache, ignore_errors=True)
    wall = time.monotonic() - t0
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    peak_gb = usage.ru_maxrss * 1024 / 1e9
    cpu = usage.ru_utime + usage.ru_stime
    print(f"[taste] exit code {rc}; wall {wall / 60:.1f} min, CPU {cpu / 60:.1f} min (user + sys), "
          f"peak RSS {peak_gb:.2f} GB; load average at the end {_load()}", flush=True)
    problems = [] if rc == 0 else [f"exit code {rc}"]
    problems += check_summary(workdir, total_steps)
    if wall > args.max_seconds:
        problems.append(f"wall time {wall:.0f} s > {args.max_seconds:.0f} s")
    if peak_gb > args.max_rss_gb:
        problems.append(f"peak RSS {peak_gb:.2f} GB > {args.max_rss_gb} GB")
    for problem in problems:
        print(f"[taste] FAILED: {problem}", file=sys.stderr, flush=True)
    if not problems:
        print("[taste] ok", flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
