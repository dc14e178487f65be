"""The experiment files, one per family with named variants (``experiments/<family>.py:<variant>``).

Each of the 42 files they replaced is reproduced exactly by its variant: the variant's config
against the frozen difference from ``base_config()`` that the old files produced
(``tests/data/experiment_configs_before_variants.json``, written by them before they were
deleted), key by key with each key's ``ConfigDict`` type (what ``--config.<key>=`` parses as).
"""

from __future__ import annotations

import glob
import json
import os

import pytest
from ml_collections import ConfigDict

from agentrl_jax.training.config.experiment import base_config, to_run_config
from agentrl_jax.training.config.command_line import experiment_run_name, load_config_file

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FROZEN = os.path.join(REPO, "tests", "data", "experiment_configs_before_variants.json")

#: every old experiment file -> the file:variant that replaces it (a family file alone is its
#: default, the one-GPU recipe ``grpo_gpu``)
OLD_TO_NEW = {
    "babyai_grpo_scaling": "babyai.py:grpo_scaling", "babyai_grpo_fixed": "babyai.py:grpo_fixed",
    "babyai_ppo": "babyai.py:ppo", "babyai_grpo_gpu": "babyai.py",
    "babyai_grpo_long_gpu": "babyai.py:grpo_long_gpu",
    "babyai_grpo_scaling_gpu10min": "babyai.py:grpo_scaling_gpu10min",
    "babyai_gigpo_gpu": "babyai.py:gigpo_gpu", "babyai_dpo_gpu": "babyai.py:dpo_gpu",
    "babyai_sft": "babyai.py:sft", "babyai_sft_gpu": "babyai.py:sft_gpu",
    "babyai_sft_grpo_gpu": "babyai.py:sft_grpo_gpu",
    "babyai_sft_gigpo_gpu": "babyai.py:sft_gigpo_gpu",
    "babyai_choice_tiny": "babyai.py:choice_tiny",
    "babyai_choice_tiny_t1": "babyai.py:choice_tiny_t1",
    "paper_scale_7b": "babyai.py:paper_scale_7b",
    "textcraft_grpo_scaling": "textcraft.py:grpo_scaling", "textcraft_ppo": "textcraft.py:ppo",
    "textcraft_grpo_gpu": "textcraft.py", "textcraft_gigpo_gpu": "textcraft.py:gigpo_gpu",
    "textcraft_sft": "textcraft.py:sft", "textcraft_sft_gpu": "textcraft.py:sft_gpu",
    "textcraft_sft_grpo_gpu": "textcraft.py:sft_grpo_gpu",
    "textcraft_sft_gigpo_gpu": "textcraft.py:sft_gigpo_gpu",
    "textcraft_sft_grpo_long_gpu": "textcraft.py:sft_grpo_long_gpu",
    "sciworld_grpo_scaling": "sciworld.py:grpo_scaling", "sciworld_ppo": "sciworld.py:ppo",
    "sciworld_grpo_gpu": "sciworld.py", "sciworld_sft_gpu": "sciworld.py:sft_gpu",
    "sciworld_sft_grpo_gpu": "sciworld.py:sft_grpo_gpu",
    "webnav_grpo_scaling": "webnav.py:grpo_scaling", "webnav_ppo": "webnav.py:ppo",
    "webnav_grpo_gpu": "webnav.py", "webnav_sft_gpu": "webnav.py:sft_gpu",
    "webnav_sft_grpo_gpu": "webnav.py:sft_grpo_gpu",
    "deepsearch_grpo_scaling": "deepsearch.py:grpo_scaling", "deepsearch_ppo": "deepsearch.py:ppo",
    "deepsearch_grpo_gpu": "deepsearch.py", "deepsearch_sft_gpu": "deepsearch.py:sft_gpu",
    "deepsearch_sft_grpo_gpu": "deepsearch.py:sft_grpo_gpu",
    "smoke": "smoke.py", "smoke_sft": "smoke.py:sft",
    "first_trainer_cpu": "smoke.py:first_trainer_cpu",
}
FAMILY_FILES = ("babyai.py", "textcraft.py", "sciworld.py", "webnav.py", "deepsearch.py",
                "smoke.py")


def flat(c: ConfigDict, prefix: str = "") -> dict[str, tuple]:
    """{dotted key: (JSON value, ConfigDict field type name)} of every leaf of ``c``."""
    out = {}
    for key in c.keys():
        value = c[key]
        if isinstance(value, ConfigDict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            plain = value.to_dict() if hasattr(value, "to_dict") else value
            out[prefix + key] = (json.loads(json.dumps(plain)), c.get_type(key).__name__)
    return out


def load(spec: str, **kwargs) -> ConfigDict:
    config, problem = load_config_file(os.path.join(REPO, "experiments", spec), **kwargs)
    assert problem is None, problem
    return config


def expected(name: str) -> dict[str, tuple]:
    """The old file's config: base_config() with the frozen difference applied."""
    with open(FROZEN) as f:
        frozen = json.load(f)[name]
    want = flat(base_config())
    for key in frozen["removed"]:
        del want[key]
    want.update({k: (v, frozen["types"][k]) for k, v in frozen["set"].items()})
    return want


def test_every_old_file_has_a_variant():
    with open(FROZEN) as f:
        names = {n for n in json.load(f) if not n.startswith("_")}
    assert {n.split("(")[0] for n in names} == set(OLD_TO_NEW)
    assert sorted(os.path.basename(p) for p in glob.glob(os.path.join(REPO, "experiments",
                                                                      "*.py"))) == \
        sorted(["__init__.py", "common.py", *FAMILY_FILES])


@pytest.mark.parametrize("old", sorted(OLD_TO_NEW))
def test_variant_reproduces_the_old_file(old, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert flat(load(OLD_TO_NEW[old])) == expected(old)


@pytest.mark.parametrize("num_gpus", [1, 4])
def test_paper_scale_7b_by_gpu_count(num_gpus, monkeypatch):
    """The 7B sizing config offloads the AdamW moments on one GPU, by argument or by
    CUDA_VISIBLE_DEVICES, as the old file did."""
    want = expected(f"paper_scale_7b(num_gpus={num_gpus})")
    assert flat(load("babyai.py:paper_scale_7b", num_gpus=num_gpus)) == want
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(map(str, range(num_gpus))))
    assert flat(load("babyai.py:paper_scale_7b")) == want


def test_a_drifted_variant_is_caught():
    """The comparison sees a one-key change (the fixture is not compared with itself)."""
    c = load("babyai.py:grpo_gpu")
    c.learner.clip_ratio_high = 0.2
    assert flat(c) != expected("babyai_grpo_gpu")


@pytest.mark.parametrize("family", FAMILY_FILES)
def test_every_variant_is_a_valid_run_config(family):
    import importlib

    module = importlib.import_module(f"experiments.{family[:-3]}")
    assert module.DEFAULT in module.VARIANTS
    assert flat(module.get_config()) == flat(module.get_config(module.DEFAULT))
    for name in module.VARIANTS:
        to_run_config(load(f"{family}:{name}"))  # raises ConfigError on a bad value


def test_unknown_variant_lists_the_variants():
    config, problem = load_config_file(os.path.join(REPO, "experiments", "babyai.py:grpo_gpux"))
    assert config is None
    assert "no variant 'grpo_gpux'" in problem and "did you mean grpo_gpu?" in problem
    for name in ("grpo_scaling", "grpo_gpu", "sft_gpu", "paper_scale_7b"):
        assert name in problem
    assert problem.count("\n") == 0
    import experiments.textcraft as textcraft
    from experiments.common import UnknownVariant

    with pytest.raises(UnknownVariant, match="its variants: grpo_scaling, ppo"):
        textcraft.get_config("nope")


def test_a_variant_of_a_file_without_variants_is_refused(tmp_path):
    path = tmp_path / "plain.py"
    path.write_text("from agentrl_jax.training.config.experiment import base_config\n\n"
                    "def get_config():\n    return base_config()\n")
    config, problem = load_config_file(f"{path}:grpo_gpu")
    assert config is None and "takes no variant" in problem and "grpo_gpu" in problem
    assert load_config_file(str(path))[1] is None


@pytest.mark.parametrize("spec, name", [
    ("experiments/babyai.py", "babyai"), ("experiments/babyai.py:grpo_gpu", "babyai_grpo_gpu"),
    ("/a/b/smoke.py:sft", "smoke_sft"), ("my.config.py", "my.config")])
def test_run_name_of_a_config(spec, name):
    """The default workdir of a run is runs/<this>: one per variant."""
    assert experiment_run_name(spec) == name


@pytest.mark.parametrize("family, lists", [("babyai.py", False), ("sciworld.py", True),
                                           ("textcraft.py", True), ("webnav.py", True),
                                           ("deepsearch.py", True)])
def test_choice_gpu_is_grpo_gpu_answering_with_a_restricted_letter(family, lists):
    """``choice_gpu`` changes only the answer format of ``grpo_gpu`` (so the two compare at
    equal schedule, learner and evaluation): lettered options, one-token replies restricted to
    " a" .. " z" (each one token of SmolLM2's tokenizer), the server's listed valid actions
    where the observation has none (ScienceWorld, TextCraft, web navigation), no action
    list in the observation text beside the options block (``agent.actions_in_observation``),
    and each turn restricted to its listed options' letters (``agent.option_limits``). Deep
    search also widens its context to 6,144 tokens (engine and packed rows: its passages and
    options end 10-turn episodes at the 4,096-token context otherwise)."""
    from agentrl_jax.training.preflight.validate import output_token_problems

    grpo, choice = flat(load(f"{family}:grpo_gpu")), flat(load(f"{family}:choice_gpu"))
    changed = {k for k in grpo if grpo[k] != choice.get(k)}
    assert changed == {"rollout.parser", "agent.prompt_style", "model.output_tokens",
                       "rollout.max_new_tokens", "rollout.decode_steps",
                       "agent.actions_in_observation", "agent.option_limits",
                       *(["agent.list_valid_actions"] if lists else []),
                       *(["rollout.max_context", "learner.pack_length"]
                         if family == "deepsearch.py" else [])}
    if family == "deepsearch.py":
        assert (choice["rollout.max_context"][0], choice["learner.pack_length"][0]) == (6144, 6144)
    assert (grpo["agent.history_turns"][0], choice["agent.history_turns"][0]) == (0, 0)
    assert (grpo["agent.option_limits"][0], choice["agent.option_limits"][0]) == (False, True)
    assert (grpo["agent.actions_in_observation"][0], choice["agent.actions_in_observation"][0]) \
        == (True, False)
    assert choice["model.output_tokens"][0] == [" " + c for c in "abcdefghijklmnopqrstuvwxyz"]
    assert (choice["rollout.parser"][0], choice["rollout.max_new_tokens"][0],
            choice["agent.list_valid_actions"][0]) == ("choice", 1, 26 if lists else 0)
    assert output_token_problems(to_run_config(load(f"{family}:choice_gpu")).model) == []


@pytest.mark.parametrize("arm, changes", [
    ("choice_shuffled_window_gpu", {"agent.history_turns": 8, "agent.history_stride": 4}),
    ("choice_shuffled_learnability_gpu", {"train.task_sampling": "learnability",
                                          "train.learnability_ema": 1.0}),
])
def test_textcraft_shuffled_arms_change_one_thing(arm, changes):
    """Each dev arm of benchmarks/jobs/textcraft_shuffled_dev.txt is ``choice_shuffled_gpu``
    with only its own settings changed, so it compares with the GRPO arm at equal schedule,
    learner and evaluation."""
    base, other = flat(load("textcraft.py:choice_shuffled_gpu")), flat(load(f"textcraft.py:{arm}"))
    assert {k for k in base if base[k] != other.get(k)} == set(changes)
    assert {k: other[k][0] for k in changes} == changes
