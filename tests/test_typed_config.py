"""The typed config: one set of defaults (the sections of training/config/sections.py), each
mistake in a config reported on one line (unknown key with a did-you-mean, bad value, bad type,
missing file), and library code that reads the typed object instead of ``.get(key, default)``."""

from __future__ import annotations

import ast
import dataclasses
import glob
import importlib
import os
import re
import subprocess
import sys

import pytest

from agentrl_common.typed_sections import SectionError
from agentrl_jax.learner.config import LearnerConfig
from agentrl_jax.training.config.experiment import (ConfigError, base_config, config_problems,
                                         to_run_config)
from agentrl_jax.training.config.sections import (DERIVED_KEYS, SECTIONS, HorizonConfig,
                                                  RolloutConfig, RunConfig, TrainConfig)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _leaves(values: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in values.items():
        if isinstance(value, dict) and key in SECTIONS:
            out.update(_leaves(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def test_base_config_is_the_dataclass_defaults():
    base = base_config()
    assert to_run_config(base) == RunConfig()
    # every key of base_config is a field, every field a key, with the field's default (but
    # the keys the run derives from another key: DERIVED_KEYS)
    defaults = {k: v for k, v in _leaves(dataclasses.asdict(RunConfig())).items()
                if tuple(k.split(".")) not in DERIVED_KEYS}
    assert _leaves(base.to_dict()) == defaults
    # the values the previous hand-written base_config() held
    assert (base.train.save_every, base.train.eval_every, base.train.eval_before) == (25, 50, True)
    assert (base.model.pad_id, base.agent.prompt_style) == (2, "action")
    assert (base.learner.kl_coef, base.learner.entropy_coef, base.learner.dtype) == (
        0.001, 0.001, "float32")
    assert RunConfig().learner == LearnerConfig()  # one default: the section's own


def test_every_experiment_loads_into_a_valid_run_config():
    names = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(REPO, "experiments",
                                                                            "*.py"))
                   if not p.endswith(("__init__.py", "common.py")))
    variants = [(name, variant) for name in names
                for variant in importlib.import_module(f"experiments.{name}").VARIANTS]
    assert len(variants) >= 40
    for name, variant in variants:
        run = to_run_config(importlib.import_module(f"experiments.{name}").get_config(variant))
        assert isinstance(run, RunConfig) and isinstance(run.learner, LearnerConfig), variant
    sft = to_run_config(importlib.import_module("experiments.smoke").get_config("sft"))
    assert (sft.sft.batch_size, sft.sft.steps, sft.sft.record_horizon) == (4, 3, 8)


def test_the_learner_divides_by_the_samplers_temperature_one_setting():
    """``rollout.temperature`` is the one temperature: the run's learner takes it (a greedy
    sampler's log-probs are untempered: 1), and an old config's ``learner.temperature`` is
    refused with one line naming the key to set."""
    c = base_config()
    assert "temperature" not in c.learner and c.rollout.temperature == 1.0
    c.rollout.temperature = 0.05
    assert to_run_config(c).learner.temperature == 0.05
    c.rollout.temperature = 0.0
    assert to_run_config(c).learner.temperature == 1.0
    run = RunConfig(rollout=RolloutConfig(temperature=0.7))
    assert run.learner.temperature == 0.7
    assert run.replace(rollout=RolloutConfig(temperature=2.0)).learner.temperature == 2.0
    old = base_config()
    old.learner.temperature = 0.05  # ConfigDict takes the new key
    assert config_problems(old) == [
        "learner.temperature: set rollout.temperature instead (one setting: the learner divides "
        "the logits by the sampler's temperature)"]


def test_an_unknown_key_gets_one_line_with_the_closest_name():
    c = base_config()
    c.train.total_step = 2  # a typo: ConfigDict takes a new key
    c.trian = {"total_steps": 2}
    assert config_problems(c) == [
        "trian: no such key (did you mean train?)",
        "train.total_step: no such key (did you mean train.total_steps?)"]
    c = base_config()
    c.learner.lr = 1e-5  # the initials of learning_rate
    assert config_problems(c) == ["learner.lr: no such key (did you mean learner.learning_rate?)"]


def test_a_bad_value_and_a_bad_type_get_one_line_each():
    values = base_config().to_dict()
    values["train"]["save_every"] = 0
    values["train"]["eval_min_scored"] = 1.5
    values["rollout"]["max_batch"] = "many"
    values["agent"]["response_prefix"] = 3
    values["learner"]["remat"] = "yes"
    values["horizon"]["phases"] = (6, 0)
    assert config_problems(values) == [
        "rollout.max_batch: must be an integer >= 1 (got 'many')",
        "agent.response_prefix: must be a string (got 3)",
        "horizon.phases: must be a non-empty sequence of integers >= 1 (got (6, 0))",
        "train.save_every: must be an integer >= 1 (got 0)",
        "train.eval_min_scored: must be a finite number in [0, 1] (got 1.5)",
        "learner.remat: must be True or False (got 'yes')"]
    with pytest.raises(ConfigError) as info:
        to_run_config(values)
    assert str(info.value).startswith("invalid config (6 problems):\n  rollout.max_batch: ")


def test_checks_spanning_sections_are_reported_beside_a_bad_section():
    values = base_config().to_dict()
    values["train"]["tasks_per_step"] = 0  # the train section is bad ...
    values["learner"]["pack_length"] = 100  # ... and the packing is shorter than the context
    values["rollout"]["release_kv_during_update"] = True  # (needs train: not checked)
    values["train"]["max_staleness"] = 1
    assert config_problems(values) == [
        "train.tasks_per_step: must be an integer >= 1 (got 0)",
        "learner.pack_length: must be 0 (off) or >= rollout.max_context=4096 (a packed row "
        "holds a whole trajectory; got 100)"]
    values["train"]["tasks_per_step"] = 1  # now the train section is valid: its check runs
    assert config_problems(values) == [
        "rollout.release_kv_during_update: needs train.max_staleness = 0 (with 1 the next "
        "rollout decodes during the update)",
        "learner.pack_length: must be 0 (off) or >= rollout.max_context=4096 (a packed row "
        "holds a whole trajectory; got 100)"]


def test_values_are_converted_to_the_fields_types():
    run = to_run_config({"train": {"max_seconds": 60}, "horizon": {"phases": [4, 8]},
                         "learner": {"length_buckets": [512, 256], "tis_cap": None}})
    assert run.train.max_seconds == 60.0 and isinstance(run.train.max_seconds, float)
    assert run.horizon.phases == (4, 8)
    assert run.learner.length_buckets == (256, 512) and run.learner.tis_cap is None
    assert run.learner.kl_coef == 0.001  # the run's learner defaults under the given keys
    assert run.learner.mesh == {"data": 1, "fsdp": -1, "tensor": 1}
    assert to_run_config({"learner": {"mesh": {"data": 2}}}).learner.mesh == {
        "data": 2, "fsdp": -1, "tensor": 1}  # an axis not named keeps its default size


def test_a_section_checks_itself_when_built():
    with pytest.raises(SectionError) as info:
        TrainConfig(total_steps=-1, tasks_per_step=0)
    assert info.value.problems == ["train.total_steps: must be an integer >= 0 (got -1)",
                                   "train.tasks_per_step: must be an integer >= 1 (got 0)"]
    with pytest.raises(ValueError, match="unknown horizon schedule 'cosine'"):
        HorizonConfig(type="cosine")
    with pytest.raises(SectionError, match="learner.learning_rate: must be a finite number > 0"):
        LearnerConfig(learning_rate=-1.0)
    assert TrainConfig().replace(save_every=5).save_every == 5


def test_run_py_prints_one_line_per_mistake_and_exits_2(tmp_path):
    """The two mistakes that gave 53-line tracebacks: a typo and a key that does not exist;
    then a missing file."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    workdir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "launch/run.py", "--config", "experiments/smoke.py", "--workdir",
         str(workdir), "--config.train.total_step=2", "--config.learner.lr=-1"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [
        "invalid config (2 problems):",
        "  --config.train.total_step: no such key (did you mean --config.train.total_steps?)",
        "  --config.learner.lr: no such key (did you mean --config.learner.learning_rate?)"]
    assert proc.stdout == "" and not workdir.exists()
    proc = subprocess.run([sys.executable, "launch/run.py", "--config", str(tmp_path / "no.py")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stderr.splitlines()) == (2, [
        "invalid config (1 problem):", f"  --config: no such file: {tmp_path / 'no.py'}"])


# --------------------------------------------------------------------------- one set of defaults
_CONFIG_NAMES = {"config", "cfg", "settings", "mc"} | set(SECTIONS)


def _chain(node: ast.AST) -> bool:
    """``a``, ``a.b.c``: a name and attributes, nothing called."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name)


def _config_receiver(node: ast.AST, aliases: set[str]) -> bool:
    """Whether ``node`` is a config object: ``config``, ``self.config``, ``cfg.train``, or a
    name assigned from such an expression in the same function."""
    if not _chain(node):
        return False
    parts = ast.unparse(node).split(".")
    return (parts[-1] in _CONFIG_NAMES or parts[0] in aliases
            or parts[:2] == ["self", "config"])


_FROM_CONFIG = re.compile(r"^(self\.)?(config|cfg)(\.\w+)*$|\b(config|cfg)(\.\w+)*\.get\(")


def _config_gets(path: str) -> list[str]:
    tree = ast.parse(open(path).read(), path)
    found = []
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        aliases = {t.id for a in ast.walk(func) if isinstance(a, ast.Assign)
                   for t in a.targets if isinstance(t, ast.Name)
                   and _FROM_CONFIG.search(ast.unparse(a.value))}
        for call in ast.walk(func):
            if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                    and call.func.attr == "get" and call.args
                    and _config_receiver(call.func.value, aliases)):
                found.append(f"{os.path.relpath(path, REPO)}:{call.lineno}: "
                             f"{ast.unparse(call)}")
    return found


def test_no_config_value_is_read_with_a_second_default():
    """``config.train.get("save_every", 1)`` and the like held defaults that disagreed with
    base_config (save_every 25 vs 1, eval_every 50 vs 0, pad_id 2 vs 0, ...): the library reads
    the typed config's fields instead."""
    # models/ reads Hugging Face config.json files and viewer/ the config.json of stored runs
    # of any version: their optional keys are not this run config's
    files = [p for p in glob.glob(os.path.join(REPO, "agentrl_jax", "**", "*.py"),
                                  recursive=True)
             if not re.search(r"agentrl_jax/(models|viewer)/", p)]
    files += glob.glob(os.path.join(REPO, "launch", "*.py"))
    found = [hit for path in sorted(files) for hit in _config_gets(path)]
    assert found == []


def test_the_scan_finds_a_config_get(tmp_path):
    source = ("def f(config, rows):\n    s = config.sft\n    a = s.get('steps', 0)\n"
              "    b = config.train.get('save_every', 1)\n    c = rows.get('x')\n")
    path = tmp_path / "probe.py"
    path.write_text(source)
    assert [h.split(": ", 1)[1] for h in _config_gets(str(path))] == [
        "s.get('steps', 0)", "config.train.get('save_every', 1)"]


# --------------------------------------------------------------------------- converted once
#: where a ``ConfigDict`` becomes a ``RunConfig`` (``to_run_config``): the conversion itself,
#: the launch scripts' ``run_main``, the preflight checks (``check_config`` / ``check_run``),
#: the memory estimate's command line (``config_for``) and the ``Trainer`` (the entry point
#: that tests and benchmarks/speed/rl_step.py call with a ConfigDict); everything else takes
#: the ``RunConfig``
_CONVERTERS = {"agentrl_jax/training/config/experiment.py",
               "agentrl_jax/training/config/command_line.py",
               "agentrl_jax/training/preflight/validate.py",
               "agentrl_jax/training/preflight/memory_estimate.py",
               "agentrl_jax/training/rl/trainer.py"}


def _untyped_configs(path: str) -> list[str]:
    """``path:line: what`` for each call of ``to_run_config`` and each parameter named
    ``config`` / ``cfg`` that is annotated ``Any`` or not at all."""
    tree = ast.parse(open(path).read(), path)
    where = os.path.relpath(path, REPO)
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "to_run_config"):
            found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            for arg in args.posonlyargs + args.args + args.kwonlyargs:
                hint = ast.unparse(arg.annotation) if arg.annotation else None
                if arg.arg in ("config", "cfg") and hint in (None, "Any"):
                    found.append(f"{where}:{node.lineno}: {node.name}({arg.arg}: {hint})")
    return found


def test_the_config_is_converted_once_at_the_entry_point():
    """Library code takes the typed ``RunConfig`` (or its section): no ``config: Any`` that
    may be a ConfigDict, and no conversion inside (``to_run_config`` was called again in 22
    places, issue 46); the entry points convert once."""
    files = glob.glob(os.path.join(REPO, "agentrl_jax", "**", "*.py"), recursive=True)
    found = [hit for path in sorted(files)
             if os.path.relpath(path, REPO) not in _CONVERTERS
             for hit in _untyped_configs(path)]
    assert found == []


def test_the_scan_finds_an_untyped_config_and_a_conversion(tmp_path):
    source = ("from typing import Any\n"
              "def f(config: Any, n: int):\n    return to_run_config(config).seed\n"
              "def g(cfg, config: RunConfig):\n    return cfg\n"
              "def h(config: LearnerConfig):\n    return config\n")
    path = tmp_path / "probe.py"
    path.write_text(source)
    assert sorted(h.split(": ", 1)[1] for h in _untyped_configs(str(path))) == [
        "f(config: Any)", "g(cfg: None)", "to_run_config(config)"]


def test_the_agent_and_the_batch_stage_take_the_configs_settings_without_second_defaults():
    """The actor pool, an episode, an actor worker's setup and the batch stage's settings have
    no default of their own for a setting of a typed section (one source per setting: the
    config); ``make_actor_pool`` / ``BatchSettings.from_config`` pass the config's."""
    import inspect

    from agentrl_jax.agent.actor_pool import ActorPool
    from agentrl_jax.agent.episode import Episode, start_episode
    from agentrl_jax.agent.workers import WorkerSetup
    from agentrl_jax.training.rl.stages import BatchSettings

    agent = {"parser", "prompt_style", "response_prefix", "history_turns", "max_context",
             "option_limits"}
    for fn, names in ((ActorPool.__init__, agent | {"max_concurrency"}), (Episode.__init__, agent),
                      (start_episode, agent), (WorkerSetup, agent | {"max_concurrency"})):
        params = inspect.signature(fn).parameters
        defaulted = {n for n in names if params[n].default is not inspect.Parameter.empty}
        assert not defaulted, (fn.__qualname__, defaulted)
    defaulted = [f.name for f in dataclasses.fields(BatchSettings)
                 if f.default is not dataclasses.MISSING
                 or f.default_factory is not dataclasses.MISSING]
    assert defaulted == []
