"""benchmarks/gpu/speed_round2.sh engine_dtype: the five runs in order, each its own process,
with the dtype overrides each arm names and nothing else (a stand-in ``python3`` on PATH records
every command line), and the timeouts within one 10-minute call."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu" / "speed_round2.sh"
BASE = ["--config", "experiments/babyai.py:grpo_gpu"]
STEP = [*BASE, "--steps", "6", "--variants", "packed", "--fresh-process"]
LEARNER = ["--set", "learner.dtype='bfloat16'"]
ENGINE = ["--set", "rollout.engine_dtype='bfloat16'"]
F32_LEARNER = ["--set", "learner.dtype='float32'"]
F32_ENGINE = ["--set", "rollout.engine_dtype='float32'"]


def recorded_commands(tmp_path: Path, part: str, with_xla_flags: bool = False,
                      baseline: Path | None = None, with_cwd: bool = False
                      ) -> list[list[str]]:
    """Run ``speed_round2.sh PART [baseline]`` with a stand-in ``python3`` that records its
    arguments; the command lines it ran, in order (``with_xla_flags``: each line starts with
    the ``XLA_FLAGS`` it saw, "" when unset; the script starts without it; ``with_cwd``: with
    the directory it ran in)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.jsonl"
    fake = bin_dir / "python3"
    head = "[os.environ.get(\'XLA_FLAGS\', \'\')] + " if with_xla_flags else ""
    head += "[os.getcwd()] + " if with_cwd else ""
    fake.write_text("#!/bin/sh\nexec " + json.dumps(sys.executable) +
                    ' -c "import json, os, sys; open(sys.argv[1], \'a\').write(json.dumps('
                    + head + 'sys.argv[2:]) + chr(10))" ' + json.dumps(str(calls)) + ' "$@"\n')
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    extra = [str(baseline)] if baseline is not None else []
    done = subprocess.run(["bash", str(SCRIPT), part, str(tmp_path / "out"), *extra],
                          capture_output=True, text=True, timeout=60, check=False,
                          env={**env, "PATH": f"{bin_dir}:{env['PATH']}"})
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in calls.read_text().splitlines()]


def test_engine_dtype_runs_the_three_steps_then_the_two_profiles(tmp_path):
    runs = recorded_commands(tmp_path, "engine_dtype")
    assert [r[0] for r in runs] == ["benchmarks/speed/rl_step.py"] * 3 + [
        "benchmarks/speed/rollout_profile.py"] * 2

    def sets(run: list[str]) -> list[str]:
        return [run[k + 1] for k, a in enumerate(run) if a == "--set"]

    # every arm names both dtypes (the recipe's defaults changed on 2026-12-03)
    assert [sets(r) for r in runs] == [
        [F32_ENGINE[1], F32_LEARNER[1]], [F32_ENGINE[1], LEARNER[1]], [ENGINE[1], LEARNER[1]],
        [F32_ENGINE[1]], [ENGINE[1]]]
    for run in runs[:3]:
        assert run[1:1 + len(STEP)] == STEP
    for run in runs[3:]:
        assert run[1:3] == BASE and "--fresh-process" not in run
    jsons = [r[r.index("--json") + 1] for r in runs]
    assert len(set(jsons)) == 5  # no run overwrites another's file
    # every run under a timeout, together within ~9 minutes (one 10-minute call)
    text = SCRIPT.read_text()
    part = text[text.index("  engine_dtype)"):]
    part = part[:part.index(";;")]
    limits = [int(t) for t in re.findall(r"timeout (\d+) python3", part)]
    assert len(limits) == 5 and sum(limits) <= 540


def test_gil_profiles_the_rollout_with_each_gil_variant_in_one_process(tmp_path):
    """``gil``: one rollout_profile.py process (one engine, the variants in turn) with the
    switch-interval and actor-worker variants beside the base, under one timeout."""
    (run,) = recorded_commands(tmp_path, "gil")
    assert run[0] == "benchmarks/speed/rollout_profile.py" and run[1:3] == BASE
    variants = run[run.index("--variants") + 1].split(",")
    assert variants[0] == "base" and {"switch", "workers"} <= set(variants)
    assert "--set" not in run  # the recipe as committed (bfloat16 engine and learner)
    text = SCRIPT.read_text()
    part = text[text.index("  gil)"):]
    part = part[:part.index(";;")]
    assert [int(t) for t in re.findall(r"timeout (\d+) python3", part)] == [240]


def test_trace_profiles_one_more_rollout_under_the_profiler(tmp_path):
    """``trace``: the base rollout profile with ``--trace`` (one extra traced rollout), the
    recipe as committed, under one timeout."""
    (run,) = recorded_commands(tmp_path, "trace")
    assert run[0] == "benchmarks/speed/rollout_profile.py" and run[1:3] == BASE
    assert "--trace" in run and run[run.index("--variants") + 1] == "base"
    assert "--set" not in run
    text = SCRIPT.read_text()
    part = text[text.index("  trace)"):]
    part = part[:part.index(";;")]
    assert [int(t) for t in re.findall(r"timeout (\d+) python3", part)] == [240]


def test_env_profiles_each_horizon_with_one_and_four_babyai_servers(tmp_path):
    """``env``: four rollout_profile.py processes, horizons 6 and 20 each with the recipe's one
    BabyAI server and with four, every file its own, the timeouts within one 10-minute call."""
    runs = recorded_commands(tmp_path, "env")
    assert [r[0] for r in runs] == ["benchmarks/speed/rollout_profile.py"] * 4
    arms = [(r[r.index("--horizon") + 1], r[r.index("--set") + 1]) for r in runs]
    assert arms == [("6", "env.replicas=1"), ("6", "env.replicas=4"),
                    ("20", "env.replicas=1"), ("20", "env.replicas=4")]
    for run in runs:
        assert run[1:3] == BASE and run[run.index("--replicas") + 1] == "1"
    assert len({r[r.index("--json") + 1] for r in runs}) == 4
    text = SCRIPT.read_text()
    part = text[text.index("  env)"):]
    part = part[:part.index(";;")]
    limits = [int(t) for t in re.findall(r"timeout (\d+) python3", part)]
    assert limits == [110] and 4 * limits[0] <= 540


def test_launch_profiles_the_rollout_without_then_with_the_loop_on_the_device(tmp_path):
    """``launch``: two rollout_profile.py processes of the recipe as committed, the second (only)
    with XLA's command buffers over while loops and conditionals, their files apart."""
    (plain, buffered) = recorded_commands(tmp_path, "launch", with_xla_flags=True)
    assert plain[0] == "" and plain[1] == "benchmarks/speed/rollout_profile.py"
    flag = buffered[0].split("--xla_gpu_enable_command_buffer=")[1].split()[0].split(",")
    assert {"WHILE", "CONDITIONAL", "FUSION", "CUBLAS"} <= set(flag)
    for run in (plain, buffered):
        assert run[2:4] == BASE and run[run.index("--variants") + 1] == "base"
        assert "--set" not in run
    assert plain[plain.index("--json") + 1] != buffered[buffered.index("--json") + 1]


def test_decode_loop_splits_the_sampler_from_the_loop_then_profiles_both_loops(tmp_path):
    """``decode_loop``: the engine benchmark greedy and at temperature 1, each running both
    loops at the recipe's 8 steps a call; then two rollout profiles of the recipe, the second
    (only) with ``rollout.decode_loop`` "fixed"; every file its own, within one call."""
    runs = recorded_commands(tmp_path, "decode_loop")
    assert [r[0] for r in runs] == ["benchmarks/speed/engine.py"] * 2 + [
        "benchmarks/speed/rollout_profile.py"] * 2
    for run, temp in zip(runs[:2], ("0", "1")):
        assert run[run.index("--temperature") + 1] == temp
        assert run[run.index("--decode-loop") + 1] == "while,fixed"
        assert run[run.index("--decode-steps") + 1] == "8"
        assert run[run.index("--shape") + 1] == "smollm2-135m"
    plain, fixed = runs[2:]
    assert "--set" not in plain and fixed[fixed.index("--set") + 1] == "rollout.decode_loop='fixed'"
    for run in (plain, fixed):
        assert run[1:3] == BASE and run[run.index("--variants") + 1] == "base"
    assert len({r[r.index("--json") + 1] for r in runs}) == 4
    text = SCRIPT.read_text()
    part = text[text.index("  decode_loop)"):]
    part = part[:part.index(";;")]
    # the engine line runs twice (greedy, temperature 1), each profile line once
    assert [int(t) for t in re.findall(r"timeout (\d+) python3", part)] == [150, 110, 110]
    assert 2 * 150 + 2 * 110 <= 540


def test_host_alternates_the_baseline_and_this_tree_at_20_turns(tmp_path):
    """``host``: four rollout profiles of the recipe at horizon 20, the baseline tree's (run
    in BASELINE_DIR) and this tree's in turn, no override but the horizon, every file its own,
    within one call; without BASELINE_DIR it refuses to run."""
    base = tmp_path / "baseline"
    base.mkdir()
    runs = recorded_commands(tmp_path, "host", baseline=base, with_cwd=True)
    here = str(SCRIPT.parent.parent.parent)
    assert [r[0] for r in runs] == [str(base), here, str(base), here]
    for run in runs:
        assert run[1:4] == ["benchmarks/speed/rollout_profile.py", *BASE]
        assert run[run.index("--horizon") + 1] == "20" and "--set" not in run
        assert run[run.index("--variants") + 1] == "base"
    assert len({r[r.index("--json") + 1] for r in runs}) == 4
    text = SCRIPT.read_text()
    part = text[text.index("  host)"):]
    part = part[:part.index(";;")]
    assert [int(t) for t in re.findall(r"timeout (\d+) python3", part)] == [130, 130]
    assert 4 * 130 <= 540
    done = subprocess.run(["bash", str(SCRIPT), "host", str(tmp_path / "o2")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "host needs BASELINE_DIR" in done.stderr


def test_overlap_step_runs_both_variants_with_and_without_workers(tmp_path):
    """``overlap_step``: three rl_step.py calls (fresh processes), each the packed and the
    overlapped variant at a fixed horizon: 20 turns with 0 then 4 actor workers, then 6 turns
    with 4; every file its own."""
    runs = recorded_commands(tmp_path, "overlap_step")

    def sets(run: list[str]) -> list[str]:
        return [run[k + 1] for k, a in enumerate(run) if a == "--set"]

    assert [r[0] for r in runs] == ["benchmarks/speed/rl_step.py"] * 3
    for run in runs:
        assert run[1:3] == BASE and "--fresh-process" in run
        assert run[run.index("--variants") + 1] == "packed,overlap"
    assert [sets(r) for r in runs] == [
        ["horizon.type='fixed'", f"horizon.turns={turns}", f"rollout.actor_workers={workers}"]
        for turns, workers in ((20, 0), (20, 4), (6, 4))]
    assert len({r[r.index("--json") + 1] for r in runs}) == 3


def test_headline_workers_runs_the_headline_recipe_in_process_then_with_workers(tmp_path):
    """``headline_workers``: launch/run.py on the headline recipe cut to 240 s of training,
    in-process episodes then 4 actor workers, each in its own work directory."""
    runs = recorded_commands(tmp_path, "headline_workers")
    assert [r[0] for r in runs] == ["launch/run.py"] * 2
    for run, workers in zip(runs, (0, 4)):
        assert run[1:3] == BASE
        assert "--config.train.max_seconds=240" in run
        assert f"--config.rollout.actor_workers={workers}" in run
        assert run[run.index("--workdir") + 1].endswith(f"headline_w{workers}")


def test_donation_runs_the_donation_probe_with_its_defaults(tmp_path):
    (run,) = recorded_commands(tmp_path, "donation")
    assert run[0] == "benchmarks/speed/donation_dispatch.py"
    assert run[1] == "--json" and run[2].endswith("donation_dispatch.json") and len(run) == 3


def test_decode_call_times_steps_a_call_with_and_without_command_buffers(tmp_path):
    """``decode_call``: the engine benchmark at 16 and 64 steps a call as is, both again with
    XLA's command buffers off (only those two runs), then 16 steps under the profiler with the
    decode HLO dumped; the first run's bandwidth (none from the stand-in: ``measure``) given to
    the rest, every file its own, the timeouts within one 10-minute call."""
    runs = recorded_commands(tmp_path, "decode_call", with_xla_flags=True)
    engine = [r for r in runs if r[1] == "benchmarks/speed/engine.py"]
    assert len(engine) == 5 and len(runs) == 6  # + the bandwidth read from the first JSON
    steps = [r[r.index("--decode-steps") + 1] for r in engine]
    assert steps == ["16", "64", "16", "64", "16"]
    off = "--xla_gpu_enable_command_buffer="
    assert [off in r[0].split() for r in engine] == [False, False, True, True, False]
    for r in engine:
        assert r[r.index("--shape") + 1] == "smollm2-135m" and r[r.index("--batch") + 1] == "256"
        assert "--temperature" not in r  # greedy, as session 64's by-steps rows
    assert "--bandwidth" not in engine[0]
    assert all(r[r.index("--bandwidth") + 1] == "measure" for r in engine[1:])
    assert "--profile" in engine[4] and "--xla_dump_to=" in engine[4][0]
    assert "--profile" not in " ".join(" ".join(r) for r in engine[:4])
    assert len({r[r.index("--json") + 1] for r in engine}) == 5
    text = SCRIPT.read_text()
    part = text[text.index("  decode_call)"):]
    part = part[:part.index(";;")]
    limits = [int(t) for t in re.findall(r"timeout (\d+) python3", part)]
    assert limits == [120, 100, 150] and 120 + 3 * 100 + 150 <= 570
