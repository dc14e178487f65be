"""Extending by registration alone (docs/EXTENDING.md): a new environment family, parser, prompt
style, advantage estimator, rollout backend or model family registered in its registry is
accepted by config validation with no other edit; an unknown name gets one line with the known
names and a did-you-mean."""

from __future__ import annotations

import re
import contextlib
import importlib
from typing import Any, Iterator

import pytest

from agentrl_common.registry import Registry, UnknownNameError
from agentrl_jax.training.preflight.validate import config_problems


@contextlib.contextmanager
def registered(registry: Registry, name: str, obj: Any) -> Iterator[Any]:
    """``obj`` registered as ``name`` for the duration of the block."""
    registry.register(name, obj)
    try:
        yield obj
    finally:
        registry.unregister(name)


def _problems(**overrides: Any) -> list[str]:
    """Problems of the smoke config with ``section__key=value`` overrides."""
    c = importlib.import_module("experiments.smoke").get_config()
    for dotted, value in overrides.items():
        section, key = dotted.split("__")
        c[section][key] = value
    return config_problems(c)


def test_a_family_registered_alone_is_accepted_by_validation():
    from environments.core.base import TaskCatalog
    from environments.registry import FAMILIES, Family, family_names, get_family, register_family

    class _Catalog(TaskCatalog):
        def task_ids(self, split: str) -> list[str]:
            return ["t0"]

    known_before = family_names()
    assert "toyfam" not in FAMILIES
    assert _problems(env__names="babyai,toyfam") == [
        f"env.names: unknown environment family 'toyfam'; known: {', '.join(known_before)}"]
    family = register_family("toyfam", env_factory=lambda: None, catalog_factory=_Catalog)
    try:
        assert isinstance(family, Family) and get_family("toyfam") is family
        assert "toyfam" in family_names()
        assert _problems(env__names="babyai,toyfam") == []
        with pytest.raises(ValueError, match="'toyfam' is already registered"):
            register_family("toyfam", env_factory=lambda: None, catalog_factory=_Catalog)
    finally:
        FAMILIES.unregister("toyfam")
    assert family_names() == known_before


def test_a_family_entry_carries_its_expert_and_example_action():
    """One registration gives the family its expert (and a named variant) for the recorder
    and its example action in the ``action`` prompt; nothing else lists them."""
    from agentrl_jax.agent.experts import EXPERT_POLICIES
    from agentrl_jax.agent.prompts import system_prompt
    from agentrl_jax.training.jobs.record_experts import resolve_expert
    from environments.registry import FAMILIES, register_family

    class _Expert:
        def __init__(self, task_id: str):
            self.task_id = task_id

        def act(self, observation: str) -> str:
            return f"solve {self.task_id}"

    class _Careful(_Expert):
        interruptible = False

    assert "toyfam" not in EXPERT_POLICIES
    assert system_prompt("Do it.", "toyfam", "action").endswith("Action: <the action>")
    with pytest.raises(ValueError, match="named 'toyfam_<variant>'"):
        register_family("toyfam", env_factory=lambda: None, catalog_factory=list,
                        expert_variants={"careful": _Careful})
    register_family("toyfam", env_factory=lambda: None, catalog_factory=list, expert=_Expert,
                    expert_variants={"toyfam_careful": _Careful}, action_example="push 1")
    try:
        assert EXPERT_POLICIES["toyfam"] is _Expert
        assert EXPERT_POLICIES["toyfam_careful"] is _Careful
        assert {"toyfam", "toyfam_careful", "babyai", "babyai_macro"} <= set(EXPERT_POLICIES)
        assert EXPERT_POLICIES["toyfam"]("t3").act("obs") == "solve t3"
        assert resolve_expert("toyfam", "toyfam_careful") == "toyfam_careful"
        assert system_prompt("Do it.", "toyfam", "action").endswith(
            "Action: <the action>\nFor example:\nAction: push 1")
    finally:
        FAMILIES.unregister("toyfam")
    assert "toyfam" not in EXPERT_POLICIES and "toyfam_careful" not in EXPERT_POLICIES
    with pytest.raises(KeyError):
        EXPERT_POLICIES["toyfam"]


def test_an_unknown_family_gets_the_did_you_mean_line():
    from environments.registry import family_names

    line = (f"env.names: unknown environment family 'textcraf'; known: {', '.join(family_names())}; "
            "did you mean 'textcraft'?")
    assert _problems(env__names="babyai,textcraf") == [line]


def test_a_parser_and_a_prompt_style_registered_alone_are_accepted():
    from agentrl_jax.agent.parsing import PARSERS, ParsedAction, get_parser
    from agentrl_jax.agent.prompts import PROMPT_STYLES, PromptStyle, system_prompt

    def parse_upper(text: str) -> ParsedAction:
        return ParsedAction(text.strip().upper() or None)

    known = ", ".join(PARSERS.names())  # raw, react and the built-in others
    assert "raw" in PARSERS and "react" in PARSERS
    assert _problems(rollout__parser="upper") == [
        f"rollout.parser: unknown action parser 'upper'; known: {known}"]
    assert _problems(rollout__parser="reac") == [
        f"rollout.parser: unknown action parser 'reac'; known: {known}; did you mean 'react'?"]
    with registered(PARSERS, "upper", parse_upper):
        assert _problems(rollout__parser="upper") == []
        assert get_parser("upper")(" go north ") == ParsedAction("GO NORTH")
    style = PromptStyle("Answer with one word.")
    with registered(PROMPT_STYLES, "oneword", style):
        assert _problems(agent__prompt_style="oneword") == []
        assert system_prompt("Find the key.", "babyai", "oneword") == (
            "You are an agent acting in the babyai environment.\nFind the key.\n\n"
            "Answer with one word.")
    assert _problems(agent__prompt_style="oneword") == [
        f"agent.prompt_style: unknown answer format 'oneword'; known: {', '.join(PROMPT_STYLES.names())}"]
    with pytest.raises(UnknownNameError, match=re.escape(f"unknown prompt style 'oneword'; known: {', '.join(PROMPT_STYLES.names())}")):
        system_prompt("x", None, "oneword")


def test_an_advantage_estimator_registered_alone_is_accepted():
    from agentrl_jax.algorithms import ADVANTAGE_ESTIMATORS, AdvantageEstimator

    assert _problems(learner__advantage_estimator="toy_adv")[0].startswith(
        "learner.advantage_estimator: unknown advantage estimator 'toy_adv'; known: ")
    with registered(ADVANTAGE_ESTIMATORS, "toy-adv", AdvantageEstimator(lambda x, s: None)):
        assert "toy_adv" in ADVANTAGE_ESTIMATORS.names()  # names are snake_case
        assert _problems(learner__advantage_estimator="toy_adv") == []
        assert _problems(learner__advantage_estimator="Toy-Adv") == []


def test_model_families_drive_the_hf_config():
    from agentrl_jax.models.config import MODEL_FAMILIES, ModelConfig, ModelFamily, UnsupportedModelError

    base = dict(vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2,
                num_kv_heads=1, head_dim=8)
    # the config.json each built-in type writes (the keys that differ between types)
    expected = {
        "llama": ("LlamaForCausalLM", {"attention_bias": False, "mlp_bias": False}),
        "mistral": ("MistralForCausalLM", {"attention_bias": False, "mlp_bias": False,
                                           "sliding_window": None, "use_sliding_window": False}),
        "qwen2": ("Qwen2ForCausalLM", {"sliding_window": None, "use_sliding_window": False}),
        "qwen3": ("Qwen3ForCausalLM", {"attention_bias": False, "sliding_window": None,
                                       "use_sliding_window": False}),
    }
    assert MODEL_FAMILIES.names() == sorted(expected)
    optional = {"attention_bias", "mlp_bias", "sliding_window", "use_sliding_window"}
    for model_type, (arch, extra) in expected.items():
        hf = ModelConfig(model_type=model_type, **base).to_hf_dict()
        assert hf["architectures"] == [arch] and hf["model_type"] == model_type
        assert {k: hf[k] for k in optional if k in hf} == extra, model_type
        # and back: qwen2 always has q/k/v biases, qwen3 q/k norms
        back = ModelConfig.from_hf_dict(hf)
        assert back.attention_bias == (model_type == "qwen2") and back.qk_norm == (model_type == "qwen3")
    with pytest.raises(UnsupportedModelError,
                       match=r"model_type 'lama' is not supported \(supported: llama, mistral, qwen2, "
                             r"qwen3\); did you mean 'llama'\?"):
        ModelConfig(model_type="lama", **base)
    family = ModelFamily("ToyForCausalLM", qk_norm=True, hf_extra=(("toy_key", 1),))
    with registered(MODEL_FAMILIES, "toy", family):
        hf = ModelConfig(model_type="toy", **base).to_hf_dict()
        assert hf["architectures"] == ["ToyForCausalLM"] and hf["toy_key"] == 1
        assert ModelConfig.from_hf_dict(hf).qk_norm
    with pytest.raises(UnsupportedModelError):
        ModelConfig(model_type="toy", **base)


def test_model_names_registry():
    from agentrl_jax.models.pretrained import KNOWN_MODELS, resolve_model_path

    with registered(KNOWN_MODELS, "toy-model", lambda: "/models/toy.gguf"):
        assert resolve_model_path("Toy-Model") == "/models/toy.gguf"  # case-insensitive
    with pytest.raises(FileNotFoundError, match="did you mean 'smollm2'"):
        resolve_model_path("smolm2")


class _ToyBackend:
    """A backend class as docs/EXTENDING.md describes it (only the registry hooks here)."""

    name = "toy"
    uses_local_engine = False

    def __init__(self, **options: Any):
        self.options = options

    @classmethod
    def from_config(cls, **options: Any) -> "_ToyBackend":
        return cls(**options)

    @classmethod
    def from_run(cls, build: Any) -> "_ToyBackend":
        return cls(build=build)


def test_a_backend_registered_alone_is_accepted_and_built_by_make_backend():
    from ml_collections import ConfigDict

    from agentrl_jax.rollout.contract import ROLLOUT_BACKENDS, create_backend, register_backend
    from agentrl_jax.training.config.experiment import to_run_config
    from agentrl_jax.training.runtime import services

    assert ROLLOUT_BACKENDS.names() == ["embedded", "engine_servers", "sglang"]
    assert _problems(rollout__backend="toy") == [
        "rollout.backend: unknown rollout backend 'toy'; known: embedded, engine_servers, sglang"]
    line = ("rollout.backend: unknown rollout backend 'sglng'; known: embedded, engine_servers, "
            "sglang; did you mean 'sglang'?")
    assert _problems(rollout__backend="sglng", rollout__urls="http://127.0.0.1:1") == [line]
    with pytest.raises(UnknownNameError, match="unknown rollout backend 'toy'"):
        create_backend("toy")
    register_backend("toy", _ToyBackend)
    try:
        assert _problems(rollout__backend="toy") == []
        assert create_backend({"name": "toy", "x": 1}).options == {"x": 1}
        config = ConfigDict({"seed": 0, "rollout": {"backend": "toy", "urls": "http://a:1,http://b:2",
                                                    "api_key": "k"}})
        built = services.make_backend(to_run_config(config), "the-model", "the-tokenizer",
                                      "/path").options["build"]
        assert (built.model, built.tokenizer, built.model_path) == ("the-model", "the-tokenizer", "/path")
        assert built.urls == ("http://a:1", "http://b:2") and built.api_key == "k"
        assert built.engine_config is None and built.device_groups == ()  # no local engine
    finally:
        ROLLOUT_BACKENDS.unregister("toy")


def test_a_local_engine_backend_gets_the_engine_config_and_device_groups():
    import jax

    from agentrl_jax.rollout.contract import ROLLOUT_BACKENDS
    from agentrl_jax.rollout.engine.engine_config import EngineConfig
    from agentrl_jax.training.config.experiment import to_run_config
    from agentrl_jax.training.runtime import services

    class _LocalToy(_ToyBackend):
        uses_local_engine = True

    c = importlib.import_module("experiments.smoke").get_config()
    c.rollout.backend = "toylocal"
    with registered(ROLLOUT_BACKENDS, "toylocal", _LocalToy):
        run = to_run_config(c)  # toylocal is a known backend here
        built = services.make_backend(run, None, None, None).options["build"]  # model=None: max_batch slots
        groups = services.engine_device_groups(run)
    assert built.device_groups == tuple(tuple(g) for g in groups)
    assert all(isinstance(d, jax.Device) for g in built.device_groups for d in g)
    assert isinstance(built.engine_config, EngineConfig)
    assert built.engine_config.max_batch == -(-int(c.rollout.max_batch) // len(groups))
    assert built.engine_config.max_length == int(c.rollout.max_context)


def test_listing_backends_parsers_and_styles_imports_no_backend_module():
    """Validation reads names only: the lazy backend entries must not import JAX or aiohttp."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from agentrl_jax.rollout.contract import ROLLOUT_BACKENDS\n"
            "from agentrl_jax.agent.parsing import PARSERS\n"
            "from agentrl_jax.agent.prompts import PROMPT_STYLES\n"
            "names = ROLLOUT_BACKENDS.names(), 'sglang' in ROLLOUT_BACKENDS\n"
            "print('jax' in sys.modules, 'aiohttp' in sys.modules,\n"
            "      ROLLOUT_BACKENDS.is_loaded('sglang'))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "False"]
