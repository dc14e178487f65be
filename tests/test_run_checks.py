"""Values that pass the config checks but would break the run are refused before anything
starts, and a run whose steps all fail stops.

Before: a model path that does not exist was found after the environment servers started and
the workdir was made (44-line traceback); ``train.tasks_per_step=1000000000`` spun at 100% CPU
with no output (the task sampler drew a new permutation of the family's tasks per task);
an unwritable workdir gave a 31-line traceback; ``env.names=babyai,babyai`` was accepted; a
run whose every episode ended with engine_error trained nothing for all its steps.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import uuid

import numpy as np
import pytest

from agentrl_jax.agent.actor_pool import TaskRef
from agentrl_jax.agent.trajectory import Trajectory
from agentrl_jax.models.pretrained import check_model_source
from agentrl_jax.training.config.experiment import base_config
from agentrl_jax.training.rl.failed_steps import FailedSteps
from agentrl_jax.training.rl.task_sampler import TaskSampler
from agentrl_jax.training.rl.failed_steps import RunFailure
from agentrl_jax.training.preflight.validate import (BATCH_BYTES_PER_TOKEN, ConfigError, check_run,
                                           config_problems, max_tasks_per_step, run_problems,
                                           workdir_problem)
from process_helpers import processes_with
from tests.test_trainer_failed_step import (FailingPool, RecordingBackend, RecordingLearner,
                                            fake_loop_config, run_fake_loop)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _smoke():
    return importlib.import_module("experiments.smoke").get_config()


# --------------------------------------------------------------------------- env.names
def test_an_environment_listed_twice_is_refused():
    c = _smoke()
    c.env.names = "babyai,babyai"
    assert config_problems(c) == ["env.names: lists 'babyai' more than once (got "
                                  "'babyai,babyai')"]
    c.env.names = "textcraft, babyai,textcraft,babyai"
    assert config_problems(c) == ["env.names: lists 'babyai', 'textcraft' more than once (got "
                                  "'textcraft,babyai,textcraft,babyai')"]
    c.env.names = "babyai,textcraft"
    assert config_problems(c) == []


def test_max_failed_steps_is_checked_and_defaults_to_3():
    assert base_config().train.max_failed_steps == 3
    c = _smoke()
    c.train.max_failed_steps = -1
    assert config_problems(c) == ["train.max_failed_steps: must be an integer >= 0 (got -1)"]
    c.train.max_failed_steps = 0  # never stop
    assert config_problems(c) == []


# --------------------------------------------------------------------------- model source
def test_model_paths_that_do_not_exist_are_refused(tmp_path):
    c = _smoke()
    c.model.random_init = {}
    c.model.name = str(tmp_path / "missing.gguf")
    assert run_problems(c, str(tmp_path / "w")) == [
        f"model.name: model not found: {tmp_path / 'missing.gguf'}"]
    c.model.name = str(tmp_path / "sft" / "model")
    problems = run_problems(c, str(tmp_path / "w"))
    assert len(problems) == 1 and problems[0].startswith(
        f"model.name: model '{tmp_path / 'sft' / 'model'}' (no such file or directory) is "
        "neither a known name")


def test_a_gguf_path_must_be_a_gguf_file(tmp_path):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(ValueError, match=r"is not a GGUF file \(starts with b'PK\\x03\\x04'"):
        check_model_source(str(fake))
    (tmp_path / "dir.gguf").mkdir()
    with pytest.raises(ValueError, match="is not a file"):
        check_model_source(str(tmp_path / "dir.gguf"))
    fake.write_bytes(b"GGUF\x03\x00\x00\x00")  # the magic: the loader reads the rest
    assert check_model_source(str(fake)) == str(fake)


def test_a_model_directory_needs_what_its_loader_reads(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError) as info:
        check_model_source(str(empty))
    assert str(info.value) == (
        f"model directory {empty} has no config.json; no model.safetensors or "
        "model.safetensors.index.json; no tokenizer.json or tokenizer_config.json or "
        "tokenizer.model")
    tokenizer_only = tmp_path / "tok"
    tokenizer_only.mkdir()
    (tokenizer_only / "tokenizer.json").write_text("{}")
    # a random model (model.random_init) reads only the tokenizer there
    assert check_model_source(str(tokenizer_only), weights=False) == str(tokenizer_only)
    c = _smoke()
    c.model.name = str(tokenizer_only)
    assert run_problems(c, str(tmp_path / "w")) == []
    c.model.random_init = {}
    assert run_problems(c, str(tmp_path / "w")) == [
        f"model.name: model directory {tokenizer_only} has no config.json; no "
        "model.safetensors or model.safetensors.index.json"]


def test_a_context_past_the_pretrained_models_positions_is_refused(tmp_path):
    """SmolLM2-135M was trained on 8,192 positions (its GGUF header): a run of the shipped
    model at 8,192 tokens of context is accepted, at 8,193 refused with the limit named (the
    engine only logged a warning); a random model of the same tokenizer has no such limit."""
    from agentrl_jax.models.pretrained import load_model_config

    c = _smoke()
    c.model.random_init = {}  # the shipped pretrained SmolLM2-135M
    c.train.tasks_per_step = 1
    workdir = str(tmp_path / "w")
    assert load_model_config(c.model.name).max_position_embeddings == 8192
    c.rollout.max_context = 8192
    assert run_problems(c, workdir) == []
    c.rollout.max_context = 8193
    assert run_problems(c, workdir) == [
        "rollout.max_context: 8193 tokens exceed the 8192 positions smollm2 was trained on "
        "(its max_position_embeddings); set rollout.max_context <= 8192"]
    c.model.random_init = _smoke().model.random_init
    assert run_problems(c, workdir) == []


@pytest.mark.slow
def test_an_exported_directory_is_accepted_and_loads_and_without_weights_is_refused(tmp_path):
    """The check agrees with the real loader on an SFT-style export (config.json,
    model.safetensors, tokenizer files): accepted and loaded; without its weights, refused
    by both. (Slow: it builds and loads a model; docs/PERFORMANCE.md.)"""
    from agentrl_jax.models.llama import init_model
    from agentrl_jax.models.pretrained import load_pretrained
    from agentrl_jax.models.safetensors_io import SINGLE_FILE, save_hf_directory
    from tests.rollout_helpers import TINY, byte_tokenizer

    export = str(tmp_path / "model")
    save_hf_directory(init_model(TINY, seed=0), export, byte_tokenizer(TINY.vocab_size))
    assert check_model_source(export) == export
    assert load_pretrained(export).config.num_layers == TINY.num_layers
    os.remove(os.path.join(export, SINGLE_FILE))
    with pytest.raises(FileNotFoundError, match="has no model.safetensors or "):
        check_model_source(export)
    with pytest.raises(Exception):
        load_pretrained(export)


# --------------------------------------------------------------------------- workdir
def test_a_workdir_that_cannot_be_created_or_written_is_refused(tmp_path):
    a_file = tmp_path / "afile"
    a_file.write_text("x")
    assert workdir_problem(str(a_file / "runs" / "x")) == (
        f"cannot create {a_file / 'runs' / 'x'}: {a_file} is a file, not a directory")
    assert workdir_problem(str(a_file)) == f"{a_file} is a file, not a directory"
    os.symlink(tmp_path / "gone", tmp_path / "link")
    assert workdir_problem(str(tmp_path / "link")) == (
        f"{tmp_path / 'link'} is a broken link, not a directory")
    # a new nested workdir is fine, and the check leaves nothing behind
    before = sorted(os.listdir(tmp_path))
    assert workdir_problem(str(tmp_path / "new" / "deeper" / "run")) is None
    assert workdir_problem(str(tmp_path)) is None
    assert sorted(os.listdir(tmp_path)) == before


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")
def test_an_unwritable_workdir_is_refused():
    """/proc refuses new files even to root (file modes do not stop root)."""
    problem = workdir_problem("/proc/agentrl-run")
    assert problem is not None and problem.startswith(
        "cannot write in /proc (to create /proc/agentrl-run): ")


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root writes into a read-only directory")
def test_a_read_only_directory_is_refused(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        assert workdir_problem(str(ro / "run")) == (
            f"cannot write in {ro} (to create {ro / 'run'}): Permission denied")
    finally:
        ro.chmod(0o700)


# --------------------------------------------------------------------------- tasks_per_step
def test_batch_bytes_per_token_is_what_assemble_batch_allocates():
    """Independent reference: the [rows, tokens] arrays of a real batch."""
    from agentrl_jax.training.rl.batching import assemble_batch

    trajectories = []
    for i, n in enumerate((3, 7)):
        t = Trajectory(env="babyai", task_id=str(i), group_id=i, sample_index=0, horizon=2)
        t.append(list(range(5, 5 + n)), generated=False, turn=-1)
        t.append([8, 9], generated=True, turn=0, logprobs=[-0.5, -0.5])
        t.num_turns, t.turn_states, t.turn_rewards, t.status = 1, ["s"], [0.0], "done"
        trajectories.append(t)
    batch = assemble_batch(trajectories, pad_id=0)
    rows, length = batch.shape
    per_token = sum(a.nbytes for a in batch.arrays().values() if a.shape == (rows, length))
    assert per_token / (rows * length) == BATCH_BYTES_PER_TOKEN == 20


def test_tasks_per_step_is_bounded_by_the_batch_memory(tmp_path):
    # 2 samples x 1024 tokens x 20 bytes = 40,960 bytes per task: 100 tasks in 4,096,000 bytes
    assert max_tasks_per_step(2, 1024, 4_096_000) == 100
    assert max_tasks_per_step(2, 1024, 4_096_000 - 1) == 99
    assert max_tasks_per_step(2, 1024, 4_096_000, processes=4) == 400
    c = _smoke()
    assert (c.train.samples_per_task, c.rollout.max_context) == (2, 1024)
    workdir = str(tmp_path / "w")
    c.train.tasks_per_step = 100
    assert run_problems(c, workdir, memory=4_096_000) == []
    c.train.tasks_per_step = 101
    assert run_problems(c, workdir, memory=4_096_000) == [
        "train.tasks_per_step: at most 100 on this host (got 101): one step's batch holds "
        "tasks_per_step x train.samples_per_task=2 rows of up to rollout.max_context=1024 "
        "tokens, 20 bytes each, in 0.0 GiB of memory"]
    assert run_problems(c, workdir, processes=2, memory=4_096_000) == []
    c.train.tasks_per_step = 1_000_000_000  # the reported case, against this host's memory
    problems = run_problems(c, workdir)
    assert len(problems) == 1 and problems[0].startswith("train.tasks_per_step: at most ")
    c.train.tasks_per_step = 0  # reported once, by the config check
    assert run_problems(c, workdir) == ["train.tasks_per_step: must be an integer >= 1 (got 0)"]


def test_task_sampler_draws_are_unchanged_and_no_longer_cost_a_permutation_each(monkeypatch):
    """The draws equal the documented formula (a seeded permutation per environment and
    epoch, environments in turn) across epoch boundaries, and 200,000 draws from a 48,000-task
    family make one permutation per epoch (5), not one per draw (minutes in all)."""
    tasks = ([TaskRef("babyai", str(i)) for i in range(7)]
             + [TaskRef("textcraft", str(i)) for i in range(3)])
    sampler = TaskSampler(tasks, seed=5, cursor=4)
    got = sampler.next(30) + sampler.next(11)
    by_env = {"babyai": tasks[:7], "textcraft": tasks[7:]}
    expected = []
    for cursor in range(4, 45):
        draw, env_index = divmod(cursor, 2)
        pool = by_env[("babyai", "textcraft")[env_index]]
        epoch, index = divmod(draw, len(pool))
        order = np.random.default_rng([5, env_index, epoch]).permutation(len(pool))
        expected.append(pool[int(order[index])])
    assert got == expected and sampler.cursor == 45
    big = TaskSampler([TaskRef("babyai", str(i)) for i in range(48_000)], seed=0)
    permutations = []
    real_rng = np.random.default_rng
    monkeypatch.setattr(np.random, "default_rng",
                        lambda seed=None: permutations.append(seed) or real_rng(seed))
    drawn = big.next(200_000)
    assert permutations == [[0, 0, epoch] for epoch in range(5)]  # 200,000 / 48,000 -> 5
    assert len(drawn) == 200_000 and len(set(drawn[:48_000])) == 48_000  # one epoch: each once


# --------------------------------------------------------------------------- launch/run.py
def _run(args: list[str], marker: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, AGENTRL_TEST_MARKER=marker)
    env.pop("XLA_FLAGS", None)
    return subprocess.run([sys.executable, "launch/run.py", "--config", "experiments/smoke.py",
                           *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")
def test_run_py_refuses_each_item_before_starting_anything(tmp_path):
    marker = uuid.uuid4().hex
    workdir = tmp_path / "run"
    proc = _run(["--workdir", str(workdir), f"--config.model.name={tmp_path / 'nope.gguf'}",
                 "--config.train.tasks_per_step=1000000000",
                 "--config.env.names=babyai,babyai"], marker)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0] == "invalid config (3 problems):", lines
    assert [ln.split(":")[0].strip() for ln in lines[1:]] == [
        "env.names", "model.name", "train.tasks_per_step"]
    assert lines[2] == f"  model.name: model not found: {tmp_path / 'nope.gguf'}"
    assert proc.stdout == ""  # no "starting environment servers"
    assert not workdir.exists()
    assert processes_with(marker) == []
    a_file = tmp_path / "afile"
    a_file.write_text("x")
    proc = _run(["--workdir", str(a_file / "run")], marker)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "invalid config (1 problem):",
        f"  --workdir: cannot create {a_file / 'run'}: {a_file} is a file, not a directory"]
    assert proc.stdout == "" and sorted(os.listdir(tmp_path)) == ["afile"]
    assert processes_with(marker) == []


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")
def test_run_py_refuses_settings_that_cannot_learn_or_crash_late_before_starting(tmp_path):
    """Issue 52's probes of settings that used to run to the end training nothing (exit 0) or
    crash after 14-18 s with 50-94 lines of tracebacks: one line each, exit code 2, nothing
    started (no stdout line, no workdir, no process left)."""
    marker = uuid.uuid4().hex
    workdir = tmp_path / "run"
    # (the clip ratios are None in the file, so only an experiment file sets them: their
    # checks are in tests/test_run_cannot_learn.py)
    proc = _run(["--workdir", str(workdir), "--config.env.timeout=0.001",
                 "--config.model.random_init.num_kv_heads=3"], marker)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "invalid config (2 problems):",
        "  model.random_init: num_heads=4 is not a multiple of num_kv_heads=3",
        "  env.timeout: must be a finite number >= 1 (got 0.001)"]
    assert proc.stdout == "" and not workdir.exists()
    proc = _run(["--workdir", str(workdir), "--config.rollout.max_context=48",
                 "--config.train.samples_per_task=1"], marker)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[:2] == [
        "invalid config (3 problems):",
        "  train.samples_per_task: learner.advantage_estimator='grpo' needs at least 2 samples "
        "per task (its baseline is the task's group: with 1 every advantage is 0 and no step "
        "trains anything)"], lines
    for env, line in zip(("babyai", "textcraft"), lines[2:]):
        assert line.startswith(f"  rollout.max_context: 48 tokens leave no room for the first "
                               f"turn of {env}: its first prompt takes at least "), lines
        assert line.endswith("every episode would end with context_limit before its first "
                             "turn"), lines
    assert proc.stdout == "" and not workdir.exists()
    assert processes_with(marker) == []


def test_check_run_raises_all_lines_at_once(tmp_path):
    c = _smoke()
    c.env.names = "babyai,babyai"
    c.learner.learning_rate = -1.0
    c.model.name = str(tmp_path / "nope.gguf")
    with pytest.raises(ConfigError) as info:
        check_run(c, str(tmp_path / "run"))
    assert [p.split(":")[0] for p in info.value.problems] == [
        "env.names", "learner.learning_rate", "model.name"]


# --------------------------------------------------------------------------- failed steps
def test_failed_steps_counter():
    steps = FailedSteps(3)
    failed = [Trajectory(env="babyai", task_id="0", group_id=0, sample_index=0, horizon=2)]
    failed[0].status = "engine_error"
    failed[0].error = "engine step failed: OverflowError: Python integer 2147483648 out of " \
                      "bounds for int32\nTraceback ..."
    statuses = {"engine_error": 4}
    assert steps.record(0, statuses, failed) is None
    assert steps.record(0, statuses, failed) is None
    assert steps.record(4, {"done": 4}) is None  # a step with something to train on resets
    assert steps.record(0, statuses, failed) is None
    assert steps.record(0, statuses, failed) is None
    assert steps.record(0, statuses, failed) == (
        "3 steps in a row had no episode to train on (train.max_failed_steps=3); the last "
        "one's episodes: engine_error 4; error: engine step failed: OverflowError: Python "
        "integer 2147483648 out of bounds for int32")
    # the error happened on another process: said so
    other = FailedSteps(1)
    assert other.record(0, {"engine_error": 2}, []) == (
        "1 steps in a row had no episode to train on (train.max_failed_steps=1); the last "
        "one's episodes: engine_error 2; error: on another process")
    never = FailedSteps(0)
    assert all(never.record(0, statuses, failed) is None for _ in range(50))
    with pytest.raises(ValueError):
        FailedSteps(-1)


def _loop(tmp_path, pool, total=10, **train):
    learner = RecordingLearner()
    run_fake_loop(fake_loop_config(total, save_every=1, **train), tmp_path, learner,
                  RecordingBackend(), pool)
    return learner


def test_a_run_whose_steps_all_fail_stops_after_max_failed_steps(tmp_path):
    """The trainer's real loop: every episode an engine_error -> RunFailure at step 3 (the
    default train.max_failed_steps), after checkpoints of steps 1-2 and no update."""
    pool = FailingPool(failing=range(1, 100))
    learner = RecordingLearner()
    with pytest.raises(RunFailure) as info:
        run_fake_loop(fake_loop_config(40, save_every=1), tmp_path, learner, RecordingBackend(),
                      pool)
    assert pool.rollouts == 3 and learner.updates == [] and learner.saved == [1, 2]
    assert str(info.value) == (
        "stopped at step 3: 3 steps in a row had no episode to train on "
        "(train.max_failed_steps=3); the last one's episodes: engine_error 4; error: engine "
        f"step failed: top_k out of range; once that is fixed, the same command resumes from the "
        f"checkpoint of step 2 (workdir {tmp_path})")


def test_failed_steps_that_are_not_consecutive_or_flat_groups_do_not_stop_a_run(tmp_path):
    # two failed steps, one good, two failed, then good: never 3 in a row
    pool = FailingPool(failing={1, 2, 4, 5})
    learner = _loop(tmp_path / "a", pool, total=7)
    assert pool.rollouts == 7 and learner.updates == [4, 4, 4]  # steps 3, 6, 7
    # all rewards equal and skipped as flat groups: nothing trained, but no fault
    pool = FailingPool(failing=(), flat=True)
    learner = _loop(tmp_path / "b", pool, total=5, skip_flat_groups=True)
    assert pool.rollouts == 5 and learner.updates == []
    # max_failed_steps=0: never stops
    pool = FailingPool(failing=range(1, 100))
    learner = _loop(tmp_path / "c", pool, total=6, max_failed_steps=0)
    assert pool.rollouts == 6 and learner.updates == []
