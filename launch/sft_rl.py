"""Behaviour cloning then RL in one command: record expert episodes, SFT on them, RL from the
SFT policy. Each stage is the project's own command (``launch/record_experts.py``,
``launch/sft.py``, ``launch/run.py``) in its own process and its own folder of ``--workdir``,
and each resumes, so the same command again skips the stages that finished and resumes the one
that was cut off (a time limit, a preempted machine, Ctrl-C).

    python launch/sft_rl.py --sft_config experiments/babyai.py:sft_gpu \\
        --config experiments/babyai.py:sft_grpo_gpu --workdir runs/babyai_sft_rl
    python launch/sft_rl.py --sft_config experiments/babyai.py:sft_gpu \\
        --sft_config.sft.max_seconds=90 --config experiments/babyai.py:sft_grpo_gpu \\
        --config.train.max_seconds=270 --workdir runs/babyai_sft_rl   # overrides per stage

Folders under ``--workdir``: ``experts/`` (``<env>.jsonl`` and ``<env>.meta.json`` for each
environment of the SFT config, ``sft.record_episodes`` episodes of its ``sft.expert``;
recorded once: an environment whose meta file exists is not recorded again), ``sft/``
(``launch/sft.py``'s workdir; ``sft/model`` is the SFT policy) and ``rl/`` (``launch/run.py``'s
workdir: its step-0 evaluation is the SFT policy's, its final one SFT + RL). The pipeline sets
``sft.data`` of the SFT stage and ``model.name`` of the RL stage; giving either is refused.
``--sft_config.<key>=<value>`` goes to the recording and SFT stages, ``--config.<key>=<value>``
to the RL stage, both checked before anything starts (exit code 2, one line per mistake).
SIGTERM is passed to the running stage (which checkpoints, as its own command does); the exit
code is the first failing stage's, 0 when all finished.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from typing import Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

#: keys the pipeline sets itself, per config flag
OWNED = {"sft_config": ("sft.data",), "config": ("model.name",)}


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str], list[str], list[str]]:
    """(the launcher's own flags, the SFT stages' overrides, the RL stage's overrides,
    problems) of ``argv`` (without the program name)."""
    from agentrl_jax.training.config.command_line import load_with_overrides

    p = argparse.ArgumentParser(prog="launch/sft_rl.py", description=__doc__.split("\n")[0])
    p.add_argument("--sft_config", required=True, help="SFT experiment file (an sft section)")
    p.add_argument("--config", required=True, help="RL experiment file")
    p.add_argument("--workdir", required=True, help="experts/, sft/ and rl/ go here")
    p.add_argument("--expert_workers", type=int, default=0,
                   help="processes recording experts (0: the CPU count, at most 16)")
    p.add_argument("--dry_run", action="store_true", help="print the stages' commands only")
    own = [a for a in argv if not a.startswith(("--sft_config.", "--config."))]
    args = p.parse_args(own)
    problems, overrides, configs = [], {}, {}
    for name in ("sft_config", "config"):
        config, forwarded, found = load_with_overrides(list(argv), name)
        problems += found
        for key in OWNED[name]:
            if any(a == f"--{name}.{key}" or a.startswith(f"--{name}.{key}=") for a in argv):
                problems.append(f"--{name}.{key}: set by launch/sft_rl.py itself "
                                "(the workdir's experts/ and sft/model)")
        overrides[name], configs[name] = forwarded, config
    if configs["sft_config"] is not None and "sft" not in configs["sft_config"]:
        problems.append(f"--sft_config: {args.sft_config} has no sft section")
    args.envs = []
    if not problems:
        from agentrl_jax.training.config.experiment import to_run_config
        from agentrl_jax.training.runtime.services import env_names

        args.envs = env_names(to_run_config(configs["sft_config"]))
    return args, overrides["sft_config"], overrides["config"], problems


def stage_commands(args: argparse.Namespace, sft_overrides: list[str],
                   rl_overrides: list[str]) -> list[tuple[str, list[str] | None]]:
    """(what, command) per stage in order; command None: already done (its output exists)."""
    py, wd = sys.executable, args.workdir
    experts, sft_dir, rl_dir = (os.path.join(wd, d) for d in ("experts", "sft", "rl"))
    workers = args.expert_workers or max(1, min(16, os.cpu_count() or 1))
    stages: list[tuple[str, list[str] | None]] = []
    for env in args.envs:
        done = os.path.exists(os.path.join(experts, f"{env}.meta.json"))
        stages.append((f"record {env} experts", None if done else [
            py, os.path.join(ROOT, "launch", "record_experts.py"), "--env", env, "--out",
            experts, "--config", args.sft_config, *sft_overrides, "--workers", str(workers)]))
    stages.append(("SFT", [py, os.path.join(ROOT, "launch", "sft.py"), "--config",
                           args.sft_config, *sft_overrides, f"--config.sft.data={experts}",
                           "--workdir", sft_dir]))
    stages.append(("RL from the SFT policy", [
        py, os.path.join(ROOT, "launch", "run.py"), "--config", args.config, *rl_overrides,
        f"--config.model.name={os.path.join(sft_dir, 'model')}", "--workdir", rl_dir]))
    return stages


def run_stage(command: list[str]) -> int:
    """Run one stage to its end; SIGTERM received meanwhile is passed on to it (Ctrl-C reaches
    it from the terminal itself). Its exit code."""
    child = subprocess.Popen(command)

    def forward(signum: int, _frame: object) -> None:
        child.send_signal(signum)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        while True:
            try:
                return child.wait()
            except KeyboardInterrupt:  # the child got it too: wait for its clean stop
                continue
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str]) -> int:
    from agentrl_jax.training.config.experiment import EXIT_BAD_CONFIG, format_problems

    args, sft_overrides, rl_overrides, problems = parse(argv)
    if problems:
        print(format_problems(problems), file=sys.stderr, flush=True)
        return EXIT_BAD_CONFIG
    stages = stage_commands(args, sft_overrides, rl_overrides)
    for i, (what, command) in enumerate(stages, 1):
        head = f"[sft_rl {i}/{len(stages)}] {what}"
        if command is None:
            print(f"{head}: done before (its files are in {args.workdir})", flush=True)
            continue
        print(f"{head}: {' '.join(command)}", flush=True)
        if args.dry_run:
            continue
        code = run_stage(command)
        if code != 0:
            print(f"{head} ended with exit code {code}; the same command goes on from here",
                  file=sys.stderr, flush=True)
            return code
    if not args.dry_run:
        print(f"[sft_rl] finished: SFT policy {os.path.join(args.workdir, 'sft', 'model')}, "
              f"RL run {os.path.join(args.workdir, 'rl')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
