"""Mistakes on the ``--config`` command line (``training/config/command_line.py``): one line each, all
at once, exit code 2 before anything starts, instead of an ``ml_collections`` traceback."""

from __future__ import annotations

import os
import subprocess
import sys

from agentrl_jax.training.config.command_line import cli_problems

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = os.path.join(REPO, "experiments", "smoke.py")


def _problems(*overrides: str, config: str = SMOKE) -> list[str]:
    return cli_problems(["--config", config, *overrides])


def test_valid_overrides_have_no_problem():
    assert _problems("--config.train.total_steps=3", "--config.learner.learning_rate", "-1e-4",
                     "--config.rollout.temperature=0.5", "--config.model.name=x",
                     "--config.env.names=babyai,textcraft") == []
    assert cli_problems(["--workdir", "x"]) == []  # no --config: the script's own usage error


def test_a_typo_gets_the_closest_key():
    assert _problems("--config.train.total_step=2") == [
        "--config.train.total_step: no such key (did you mean --config.train.total_steps?)"]


def test_an_unknown_section_gets_the_closest_section_and_key():
    assert _problems("--config.trian.total_step=2") == [
        "--config.trian.total_step: no such section (did you mean --config.train.total_steps?)"]


def test_a_key_of_another_section_is_pointed_at():
    assert _problems("--config.train.learning_rate=1e-3") == [
        "--config.train.learning_rate: no such key (did you mean "
        "--config.learner.learning_rate?)"]


def test_an_abbreviation_gets_the_key_its_initials_spell():
    assert _problems("--config.learner.lr=-1") == [
        "--config.learner.lr: no such key (did you mean --config.learner.learning_rate?)"]


def test_a_key_with_no_close_name_lists_its_section():
    (line,) = _problems("--config.train.zzz=1")
    assert line.startswith("--config.train.zzz: no such key (train has: compile_ahead, "
                           "compress_trajectories, env_error_window, ")
    assert "total_steps" in line


def test_a_value_of_the_wrong_type():
    assert _problems("--config.train.total_steps=abc", "--config.learner.learning_rate=fast",
                     "--config.rollout.temperature") == [
        "--config.train.total_steps: must be an integer (got 'abc')",
        "--config.learner.learning_rate: must be a number (got 'fast')",
        "--config.rollout.temperature: needs a value"]


def test_a_key_the_command_line_cannot_set_and_an_override_before_the_file():
    assert cli_problems(["--config.train.total_steps=2", "--config", SMOKE]) == [
        "--config.train.total_steps: must come after --config <experiment file>"]

def test_a_none_default_can_be_set_but_a_none_the_file_adds_cannot(tmp_path):
    """Settings whose default is None (``tis_cap``, ``clip_ratio_high``, ...) hold a typed
    placeholder in ``base_config()``, so the command line sets them and the run sees the
    value; a key an experiment file itself makes None has no type and is refused."""
    from agentrl_jax.training.config.experiment import to_run_config
    from agentrl_jax.training.config.command_line import load_config_file

    sft = os.path.join(REPO, "experiments", "smoke.py:sft")
    assert _problems("--config.learner.tis_cap=2.0", "--config.learner.clip_ratio_high=0.28",
                     config=sft) == []
    assert _problems("--config.learner.clip_ratio_low=low") == [
        "--config.learner.clip_ratio_low: must be a number (got 'low')"]
    config, problem = load_config_file(SMOKE)
    assert problem is None and config.learner.clip_ratio_high is None
    config.learner.clip_ratio_high = 0.28
    assert to_run_config(config).learner.clip_ratio_high == 0.28
    untyped = tmp_path / "untyped.py"
    untyped.write_text("from ml_collections import ConfigDict\n\n"
                       "def get_config():\n    return ConfigDict({'learner': {'tis_cap': None}})\n")
    assert _problems("--config.learner.tis_cap=2.0", config=str(untyped)) == [
        "--config.learner.tis_cap: is None in the experiment file, so its type is unknown and "
        "it cannot be set on the command line; set it in the file"]


def test_two_mistakes_give_two_lines():
    assert _problems("--config.train.total_step=2", "--config.train.total_steps=x") == [
        "--config.train.total_step: no such key (did you mean --config.train.total_steps?)",
        "--config.train.total_steps: must be an integer (got 'x')"]


def test_missing_or_broken_files(tmp_path):
    assert _problems(config=str(tmp_path / "nope.py")) == [
        f"--config: no such file: {tmp_path / 'nope.py'}"]
    (tmp_path / "noget.py").write_text("X = 1\n")
    assert _problems(config=str(tmp_path / "noget.py")) == [
        f"--config: {tmp_path / 'noget.py'} has no get_config() (an experiment file defines "
        "get_config() returning its ConfigDict)"]
    (tmp_path / "syntax.py").write_text("def get_config(:\n")
    assert _problems(config=str(tmp_path / "syntax.py")) == [
        f"--config: {tmp_path / 'syntax.py'} does not load: SyntaxError: invalid syntax (line 1)"]
    (tmp_path / "raises.py").write_text("def get_config():\n    return {}['model']\n")
    assert _problems(config=str(tmp_path / "raises.py")) == [
        f"--config: {tmp_path / 'raises.py'}: get_config() failed: KeyError: 'model' (line 2)"]


def test_run_py_prints_one_line_per_mistake_and_exits_2_before_starting(tmp_path):
    workdir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "launch/run.py", "--config", "experiments/smoke.py", "--workdir",
         str(workdir), "--config.train.total_step=2", "--config.learner.learning_rate=x"],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [
        "invalid config (2 problems):",
        "  --config.train.total_step: no such key (did you mean --config.train.total_steps?)",
        "  --config.learner.learning_rate: must be a number (got 'x')"]
    assert proc.stdout == "" and not workdir.exists()


def test_every_launch_script_refuses_a_missing_config_file_in_one_line(tmp_path):
    missing = str(tmp_path / "nope.py")
    for script, extra in (("run", []), ("eval", []), ("sft", []),
                          ("record_experts", ["--env", "babyai", "--out", str(tmp_path / "o")])):
        proc = subprocess.run([sys.executable, f"launch/{script}.py", "--config", missing, *extra],
                              cwd=REPO, capture_output=True, text=True, timeout=120)
        assert (proc.returncode, proc.stderr) == (
            2, f"invalid config (1 problem):\n  --config: no such file: {missing}\n"), script


def test_a_text_or_texts_setting_takes_either_form_from_the_command_line():
    """``model.output_tokens`` (typed ``str | tuple[str, ...]``) takes a string of characters
    or a tuple of token strings, from an experiment file's assignment and from the command
    line, and config.json writes both."""
    import json

    from agentrl_jax.training.config.command_line import load_with_overrides
    from agentrl_jax.training.config.experiment import base_config, to_run_config

    spec = ["launch", "--config", "experiments/babyai.py:choice_tiny_t1"]
    config, _, problems = load_with_overrides(spec + ["--config.model.output_tokens=(' a', ' b')"])
    assert problems == [] and config.model.output_tokens == (" a", " b")
    assert to_run_config(config).model.output_tokens == (" a", " b")
    config, _, problems = load_with_overrides(spec + ["--config.model.output_tokens=xyz"])
    assert problems == [] and to_run_config(config).model.output_tokens == "xyz"
    c = base_config()
    c.model.output_tokens = ("left", "right")
    c.rollout.stop = "\n"
    assert json.loads(c.to_json())["model"]["output_tokens"] == ["left", "right"]
    assert to_run_config(c).rollout.stop == "\n"
