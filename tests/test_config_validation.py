"""The whole config is validated before anything starts.

Before: ``learning_rate=-1e-4``, ``rollout.temperature=-1``, ``train.total_steps=-1`` and
``train.tasks_per_step=0`` ran to completion with exit 0, an unknown advantage estimator was
reported after 21 s (servers, model and the first rollout started), and an unknown environment
did not list the known families.
"""

from __future__ import annotations

import glob
import importlib
import os
import subprocess
import sys
import uuid

import pytest

from agentrl_jax.algorithms import ADVANTAGE_ESTIMATORS
from agentrl_jax.training.config.experiment import base_config
from agentrl_jax.training.preflight.validate import ConfigError, check_config, config_problems
from environments.registry import family_names
from process_helpers import processes_with

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _smoke():
    return importlib.import_module("experiments.smoke").get_config()


def _problems(**overrides) -> list[str]:
    """Problems of the smoke config with ``section__key=value`` overrides."""
    c = _smoke()
    for dotted, value in overrides.items():
        section, key = dotted.split("__")
        c[section][key] = value
    return config_problems(c)


def test_every_experiment_config_is_valid():
    names = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(REPO, "experiments",
                                                                            "*.py"))
                   if not p.endswith(("__init__.py", "common.py")))
    assert "smoke" in names and len(names) >= 6
    variants = [(name, variant) for name in names
                for variant in importlib.import_module(f"experiments.{name}").VARIANTS]
    assert len(variants) >= 40
    for name, variant in variants:
        config = importlib.import_module(f"experiments.{name}").get_config(variant)
        assert config_problems(config) == [], (name, variant)
    assert config_problems(base_config()) == []


@pytest.mark.parametrize("key,value,line", [
    ("learner__learning_rate", -1e-4, "learner.learning_rate: must be a finite number > 0 "
                                      "(got -0.0001)"),
    ("learner__learning_rate", 0.0, "learner.learning_rate: must be a finite number > 0"),
    ("learner__learning_rate", float("nan"), "learner.learning_rate: must be a finite number"),
    ("rollout__temperature", -1.0, "rollout.temperature: must be 0 (greedy) or a number in "
                                   "[1e-06, 1000] (got -1.0)"),
    ("rollout__top_k", 2**31, "rollout.top_k: must be -1 (off) or an integer in "
                              "[1, 2147483647] (got 2147483648)"),
    ("rollout__top_k", 0, "rollout.top_k: must be -1 (off) or an integer in [1, 2147483647]"),
    ("train__total_steps", -1, "train.total_steps: must be an integer >= 0 (got -1)"),
    ("train__tasks_per_step", 0, "train.tasks_per_step: must be an integer >= 1 (got 0)"),
    ("train__samples_per_task", 0, "train.samples_per_task: must be an integer >= 1 (got 0)"),
    ("learner__loss_agg_mode", "sum", "learner.loss_agg_mode: unknown loss aggregation mode "
                                      "'sum'; known: seq_mean_token_mean"),
    ("learner__kl_estimator", "k9", "learner.kl_estimator: unknown KL estimator 'k9'"),
    ("rollout__top_p", 0.0, "rollout.top_p: must be a number in (0, 1] (got 0.0)"),
    ("rollout__backend", "vllm", "rollout.backend: unknown rollout backend 'vllm'; known: "
                                 "embedded, engine_servers, sglang"),
    ("train__max_staleness", -1, "train.max_staleness: must be an integer >= 0"),
    ("learner__mini_batches", 0, "learner.mini_batches: must be an integer >= 1"),
    ("rollout__prefill_kv_buckets", "512,x", "rollout.prefill_kv_buckets: "
                                             "rollout.prefill_kv_buckets must be '', 'auto'"),
    ("rollout__prefill_kv_buckets", "0,512", "rollout.prefill_kv_buckets: "
                                             "rollout.prefill_kv_buckets: lengths must be >= 1"),
    ("learner__attention_impl", "None", "learner.attention_impl: unknown attention implementation "
                                        "'None'; known: chunked, xla, cudnn, pallas, "
                                        "pallas_segments, or 'auto'"),
])
def test_each_bad_key_is_reported_on_one_line(key, value, line):
    problems = _problems(**{key: value})
    assert len(problems) == 1, problems
    assert problems[0].startswith(line), problems


def test_attention_impl_auto_is_the_command_lines_none(tmp_path):
    """A GPU config's ``learner.attention_impl`` ("pallas_segments") can be set back to the
    backend's choice from the command line: ml_collections keeps a string field a string, so
    "None" is refused with a pointer to "auto", which the learner hands the model as None."""
    from agentrl_jax.learner.config import model_attention_impl
    from agentrl_jax.training.config.command_line import load_with_overrides

    gpu = os.path.join(REPO, "experiments", "babyai.py:grpo_gpu")
    config, _, problems = load_with_overrides(
        ["--config", gpu, "--config.learner.attention_impl=auto"], "config")
    assert problems == [] and config.learner.attention_impl == "auto"
    assert config_problems(config) == []
    assert model_attention_impl("auto") is None and model_attention_impl(None) is None
    assert model_attention_impl("pallas_segments") == "pallas_segments"
    config, _, _ = load_with_overrides(["--config", gpu, "--config.learner.attention_impl=None"],
                                       "config")
    assert config.learner.attention_impl == "None"
    assert any("'auto'" in p for p in config_problems(config))


def test_kv_release_during_update_needs_no_overlap():
    c = _smoke()
    c.rollout.release_kv_during_update = True
    assert config_problems(c) == []
    c.train.max_staleness = 1
    assert config_problems(c) == ["rollout.release_kv_during_update: needs train.max_staleness "
                                  "= 0 (with 1 the next rollout decodes during the update)"]
    d = c.to_dict()  # a plain mapping (a ConfigDict refuses the type change itself)
    d["train"]["max_staleness"] = 0
    d["rollout"]["release_kv_during_update"] = "yes"
    assert config_problems(d) == ["rollout.release_kv_during_update: must be True or False "
                                  "(got 'yes')"]


def test_unknown_advantage_estimator_lists_the_registry():
    problems = _problems(learner__advantage_estimator="ppo2")
    assert len(problems) == 1
    assert problems[0].startswith("learner.advantage_estimator: unknown advantage estimator "
                                  "'ppo2'; known: ")
    listed = problems[0].split("known: ")[1].split(", ")
    assert listed == sorted(ADVANTAGE_ESTIMATORS) and "grpo" in listed and "gae" in listed
    # registry names are matched as the learner matches them (case, dashes)
    assert _problems(learner__advantage_estimator="Reinforce-PP") == []


def test_unknown_environment_lists_the_families():
    problems = _problems(env__names="babyai,webshop")
    assert problems == [f"env.names: unknown environment family 'webshop'; known: "
                        f"{', '.join(family_names())}"]
    assert "textcraft" in family_names() and "babyai" in family_names()
    assert _problems(env__names="") == [f"env.names: lists no environment; known: "
                                        f"{', '.join(family_names())}"]


def test_micro_batch_must_divide_an_explicit_mesh():
    c = _smoke()
    c.learner.mesh = {"data": 1, "fsdp": 4, "tensor": 1}
    c.learner.micro_batch_size = 6
    assert config_problems(c) == ["learner.micro_batch_size: must be a multiple of the mesh's "
                                  "data x fsdp size 4 (got 6)"]
    c.learner.micro_batch_size = 8
    assert config_problems(c) == []
    c.learner.mesh = {"data": -1, "fsdp": -1, "tensor": 1}
    assert config_problems(c) == ["learner.mesh: at most one axis may be -1 "
                                  "(got {'data': -1, 'fsdp': -1, 'tensor': 1})"]


def test_all_problems_are_reported_at_once():
    c = _smoke()
    c.learner.learning_rate = -1e-4
    c.rollout.temperature = -1.0
    c.train.total_steps = -1
    c.train.tasks_per_step = 0
    c.learner.advantage_estimator = "nope"
    with pytest.raises(ConfigError) as info:
        check_config(c)
    keys = [p.split(":")[0] for p in info.value.problems]
    assert keys == ["rollout.temperature", "train.total_steps", "train.tasks_per_step",
                    "learner.learning_rate", "learner.advantage_estimator"]
    assert str(info.value).startswith("invalid config (5 problems):\n  rollout.temperature: ")


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")
def test_run_py_refuses_a_bad_config_before_starting_anything(tmp_path):
    """Exit code 2 and one line per problem; nothing started: no line on stdout (every long
    phase, servers and model included, is announced there), no workdir, no process of the run
    left (a server it started would inherit ``AGENTRL_TEST_MARKER``)."""
    workdir = tmp_path / "run"
    marker = uuid.uuid4().hex
    env = dict(os.environ, AGENTRL_TEST_MARKER=marker)
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run(
        [sys.executable, "launch/run.py", "--config", "experiments/smoke.py", "--workdir",
         str(workdir), "--config.learner.learning_rate=-1e-4", "--config.rollout.temperature=-1",
         "--config.train.total_steps=-1", "--config.train.tasks_per_step=0",
         "--config.learner.advantage_estimator=foo", "--config.env.names=babyai,nope"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0] == "invalid config (6 problems):"
    assert [ln.split(":")[0].strip() for ln in lines[1:]] == [
        "env.names", "rollout.temperature", "train.total_steps", "train.tasks_per_step",
        "learner.learning_rate", "learner.advantage_estimator"]
    assert "starting environment servers" not in proc.stdout and proc.stdout == ""
    assert not workdir.exists()  # nothing was started or written
    assert processes_with(marker) == []


def test_random_init_shapes_are_checked_by_the_model_configs_field_types():
    """A real model shape (strings, floats, booleans) is valid; bad sizes, types and unknown
    keys are each reported (the paper-scale benchmark config uses such a shape)."""
    import sys

    from agentrl_jax.training.preflight.validate import config_problems

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    from experiments.babyai import paper_scale_7b as get_config

    config = get_config()
    assert config_problems(config) == []
    config.model.random_init.num_layers = 0
    config.model.random_init.qk_norm = 1
    config.model.random_init.bogus = 3
    problems = config_problems(config)
    assert any(p.startswith("model.random_init.num_layers: must be an integer >= 1")
               for p in problems)
    assert any(p.startswith("model.random_init.qk_norm: must be true or false") for p in problems)
    assert any(p.startswith("model.random_init.bogus: is not a ModelConfig field")
               for p in problems)


def test_model_label_names_a_random_models_shape_and_tokenizer():
    from agentrl_jax.training.config.experiment import model_label

    assert model_label("smollm2", {}) == "smollm2"
    assert model_label("qwen2.5-1.5b", None) == "qwen2.5-1.5b"
    assert (model_label("smollm2", dict(num_layers=28, hidden_size=3584, num_heads=28))
            == "random 28 layers x 3584 hidden (tokenizer of smollm2)")
    assert model_label("smollm2", dict(vocab_size=512)) == "random model (tokenizer of smollm2)"
