"""The job lists of ``benchmarks/jobs/`` name configs that load: every ``launch/run.py``,
``launch/sft.py`` and ``launch/sft_rl.py`` command's ``--config`` (and ``--sft_config``) file,
variant and ``--config.<key>=<value>`` overrides pass the launch scripts' own checks
(``training/config/command_line.py``, then ``training/preflight/validate.py:check_config``).
A typo in a job list otherwise shows only on the GPU machine, as a job that exits 2 in its
first second while the device time of the call runs on."""

from __future__ import annotations

import pathlib
import shlex

import pytest

from agentrl_jax.training.config.command_line import load_with_overrides
from agentrl_jax.training.preflight.validate import check_config

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAUNCHERS = ("launch/run.py", "launch/sft.py", "launch/sft_rl.py")


def _commands(path: pathlib.Path) -> list[tuple[str, list[str]]]:
    """(job name, the launcher's arguments) of each job of ``path`` that runs a launcher."""
    jobs = []
    for line in path.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        words = shlex.split(line)
        script = next((w for w in words if w in LAUNCHERS), None)
        if script is not None:
            jobs.append((words[0], words[words.index(script) + 1:]))
    return jobs


def _problems(argv: list[str]) -> list[str]:
    """Every problem of the command line's configs: its flags, then the whole config."""
    problems = []
    for name in ("config", "sft_config"):
        if f"--{name}" not in argv and not any(a.startswith(f"--{name}=") for a in argv):
            continue
        config, _, found = load_with_overrides(argv, name)  # cli_problems first, then loads
        if not found:
            try:
                check_config(config)
            except Exception as error:  # ConfigError: one line per problem
                found = [str(error)]
        problems += [f"--{name}: {p}" for p in found]
    return problems


JOB_FILES = sorted((ROOT / "benchmarks" / "jobs").glob("*.txt"))


@pytest.mark.parametrize("path", JOB_FILES, ids=[p.name for p in JOB_FILES])
def test_every_launch_command_of_a_job_list_has_a_config_that_loads(path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the commands name their files from the repository root
    jobs = _commands(path)
    bad = {name: problems for name, argv in jobs if (problems := _problems(argv))}
    assert not bad, f"{path.name}: {bad}"


def test_the_check_catches_a_misspelt_key_a_bad_value_and_an_unknown_variant(monkeypatch):
    """The same check on commands with one mistake each finds each mistake."""
    monkeypatch.chdir(ROOT)
    base = ["--config", "experiments/babyai.py:grpo_gpu", "--workdir", "/tmp/w"]
    assert _problems(base) == []
    assert "horizon.phase" in " ".join(_problems(base + ["--config.horizon.phase=(6,)"]))
    assert "train.total_steps" in " ".join(_problems(base + ["--config.train.total_steps=many"]))
    # a value of the right type that the typed config refuses (check_config, not the flags)
    assert "must be an integer >= 0" in " ".join(
        _problems(base + ["--config.train.total_steps=-5"]))
    unknown = _problems(["--config", "experiments/babyai.py:grpo_gpuu"])
    assert unknown and "grpo_gpu" in unknown[0]
    sft_rl = ["--sft_config", "experiments/babyai.py:sft_gpu", "--config",
              "experiments/babyai.py:grpo_long_gpu", "--sft_config.sed=0"]
    assert any(p.startswith("--sft_config:") and "sed" in p for p in _problems(sft_rl))
    assert len(JOB_FILES) >= 20 and sum(len(_commands(p)) for p in JOB_FILES) >= 150
