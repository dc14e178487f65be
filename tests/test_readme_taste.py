"""The README's CPU taste command, as ``.ci/check_taste.py`` reads it (the CI step that runs it
takes minutes; these checks are quick): it can be extracted, every override names a key
of its experiment config, and the summary check accepts a finished run and names what a
broken one lacks."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _check_taste():
    spec = importlib.util.spec_from_file_location("check_taste",
                                                  os.path.join(ROOT, ".ci", "check_taste.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _readme_command() -> str:
    with open(os.path.join(ROOT, "README.md")) as f:
        return _check_taste().extract_command(f.read())


def test_extract_joins_continuation_lines():
    ct = _check_taste()
    text = ("intro\n" + ct.MARKER + "\n\n```bash\npython launch/run.py --a=1 \\\n"
            "  --b=2 \\\n  --c=3\n```\nafter\n```bash\nother\n```\n")
    assert ct.extract_command(text) == "python launch/run.py --a=1 --b=2 --c=3"
    with pytest.raises(ValueError, match="marker"):
        ct.extract_command("```bash\npython x\n```\n")
    with pytest.raises(ValueError, match="not closed"):
        ct.extract_command(ct.MARKER + "\n```bash\npython x\n")


def test_readme_taste_command_names_real_config_keys():
    from ml_collections import ConfigDict

    command = _readme_command()
    args = shlex.split(command)
    assert args[:2] == ["python", "launch/run.py"]
    config_file = next(a.split("=", 1)[1] if "=" in a else args[i + 1]
                       for i, a in enumerate(args) if a.split("=", 1)[0] == "--config")
    from agentrl_jax.training.config.command_line import load_config_file

    config, problem = load_config_file(os.path.join(ROOT, config_file))  # FILE[:VARIANT]
    assert problem is None, problem
    overrides = [a for a in args if a.startswith("--config.")]
    assert overrides, "the taste command overrides nothing"
    for arg in overrides:
        node = config
        for part in arg[len("--config."):].split("=", 1)[0].split("."):
            assert isinstance(node, ConfigDict) and part in node, f"{arg}: no such config key"
            node = node[part]
    workdir, steps = _check_taste().workdir_and_steps(command)
    assert workdir.startswith("runs/") and steps >= 1


def _finished_run(tmp_path, steps: int = 2, final_eval: bool = True) -> str:
    run = tmp_path / "run"
    (run / "checkpoints" / str(steps)).mkdir(parents=True, exist_ok=True)
    for name in ("metrics.jsonl", "trajectories_train.jsonl.gz", "trajectories_eval.jsonl.gz"):
        (run / name).write_text("{}\n")
    evals = {str(steps): {"avg_at_k": 0.25, "pass_at_k": 0.5}} if final_eval else {}
    (run / "summary.json").write_text(json.dumps({
        "start_step": 0, "final_step": steps, "finished_step": steps, "first_reward": 0.0,
        "last_reward": 0.5, "mean_step_seconds": 100.0, "evals": evals, "sessions": [{}]}))
    return str(run)


def test_check_summary(tmp_path):
    ct = _check_taste()
    assert ct.check_summary(_finished_run(tmp_path), 2) == []
    assert any("final_step" in p for p in ct.check_summary(_finished_run(tmp_path), 3))
    broken = _finished_run(tmp_path / "b", final_eval=False)
    os.remove(os.path.join(broken, "trajectories_eval.jsonl.gz"))
    problems = ct.check_summary(broken, 2)
    assert any("final evaluation" in p for p in problems)
    assert any("trajectories_eval.jsonl" in p for p in problems)
    assert ct.check_summary(str(tmp_path / "missing"), 2) == [
        f"{tmp_path / 'missing' / 'summary.json'} does not exist"]
