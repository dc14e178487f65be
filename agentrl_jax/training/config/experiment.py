"""The experiment config: a ``ConfigDict`` for experiment files, a typed ``RunConfig`` for the code.

Experiment files start from ``base_config()`` (the ``ConfigDict`` of the typed sections'
defaults, ``training/config/sections.py``) and every key can be overridden from the command
line: ``--config.learner.kl_coef=0.01``. The launch scripts turn the result into a
``RunConfig`` once (``to_run_config``: every unknown key, bad type and bad value, one line each,
raised as ``ConfigError``); library code reads that typed object.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Mapping

from ml_collections import ConfigDict, config_dict

from agentrl_common.typed_sections import Section
from agentrl_jax.training.config.sections import DERIVED_KEYS, RunConfig

#: what ``to_run_config`` accepts: an experiment file's ``ConfigDict``, a nested mapping of
#: the same keys, or a ``RunConfig`` (returned as it is)
ConfigSource = ConfigDict | Mapping[str, Any] | RunConfig

#: exit code of the launch scripts for an invalid config (as for bad usage)
EXIT_BAD_CONFIG = 2


class ConfigError(ValueError):
    """An invalid config; ``problems`` holds one line per bad key."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__(format_problems(self.problems))


def format_problems(problems: list[str]) -> str:
    """The message printed for an invalid config: a count, then one indented line per key."""
    n = len(problems)
    return f"invalid config ({n} problem{'s' if n != 1 else ''}):\n" + "\n".join(
        f"  {p}" for p in problems)


def _plain(section: Section, typed_none: bool = False) -> dict[str, Any]:
    """A section's values as nested plain dicts (tuples stay tuples: their ConfigDict type).
    Keys the run derives (``DERIVED_KEYS``) are left out. ``typed_none``: a None default of a
    setting typed ``T | None`` (T a plain scalar) becomes ``placeholder(T)``, so a
    ``ConfigDict`` knows its type and ``--config.<key>=<value>`` can set it."""
    hints = typing.get_type_hints(type(section)) if typed_none else {}
    out: dict[str, Any] = {}
    for f in dataclasses.fields(section):
        if (section.PREFIX, f.name) in DERIVED_KEYS:  # the run fills it from another key
            continue
        value = getattr(section, f.name)
        if isinstance(value, Section):
            out[f.name] = _plain(value, typed_none)
        elif isinstance(value, Mapping):
            out[f.name] = dict(value)
        elif value is None and _optional_scalar(hints.get(f.name)) is not None:
            out[f.name] = config_dict.placeholder(_optional_scalar(hints[f.name]))
        elif typed_none and _text_or_texts(hints.get(f.name)):
            # ``str | tuple[str, ...]``: either form may replace the default (an experiment
            # file's assignment, or ``--config.k="(' a', ' b')"``); the section checks it
            out[f.name] = config_dict.FieldReference(value, field_type=object)
        else:
            out[f.name] = value
    return out


def _text_or_texts(hint: Any) -> bool:
    """Whether ``hint`` is ``str | tuple[str, ...]`` (a setting given as one string or several)."""
    return set(typing.get_args(hint)) == {str, tuple[str, ...]}


def _optional_scalar(hint: Any) -> type | None:
    """T for a hint ``T | None`` with T one of bool, int, float, str; else None."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if len(args) == 1 and type(None) in typing.get_args(hint) and args[0] in (bool, int, float, str):
        return args[0]
    return None


def base_config() -> ConfigDict:
    """The ``ConfigDict`` experiment files start from: ``RunConfig()``'s defaults
    (``training/config/sections.py`` holds each default once). A setting whose default is None
    holds a typed placeholder, so the command line can set it (``--config.learner.
    clip_ratio_high=0.28``); ``to_dict()`` reads it back as None or its value. A setting typed
    ``str | tuple[str, ...]`` takes either form (``--config.model.output_tokens=abc`` or
    ``--config.model.output_tokens="(' a', ' b')"``)."""
    return ConfigDict(_plain(RunConfig(), typed_none=True))


def config_problems(config: ConfigSource) -> list[str]:
    """One line per problem of ``config`` (a ``ConfigDict``, a nested mapping or a
    ``RunConfig``): unknown keys (with the closest name), bad types and bad values; []."""
    if isinstance(config, RunConfig):
        return []
    return RunConfig.from_mapping(_as_mapping(config))[1]


def _as_mapping(config: ConfigDict | Mapping[str, Any]) -> Mapping[str, Any]:
    return config.to_dict() if hasattr(config, "to_dict") else dict(config)


def to_run_config(config: ConfigSource) -> RunConfig:
    """``config`` as the typed ``RunConfig`` (itself when it is one); raises ``ConfigError``
    with one line per problem. Called once per job, at its entry point (``run_main`` of the
    launch scripts, a benchmark's ``main``, the ``Trainer``); library code takes the
    ``RunConfig``."""
    if isinstance(config, RunConfig):
        return config
    run, problems = RunConfig.from_mapping(_as_mapping(config))
    if problems:
        raise ConfigError(problems)
    return run


def config_json(config: RunConfig) -> dict[str, Any]:
    """``config`` as JSON values (what ``config.json`` of a workdir holds), without secrets
    (``rollout.api_key``)."""
    values = _plain(config)
    if values["rollout"]["api_key"]:
        values["rollout"]["api_key"] = "<redacted>"
    return values


def use_ppo(c: ConfigDict) -> ConfigDict:
    """PPO with a critic (GAE) instead of GRPO."""
    c.learner.advantage_estimator = "gae"
    c.learner.gamma = 1.0
    c.learner.lam = 1.0
    c.learner.critic_learning_rate = 1e-5
    c.learner.value_clip = 0.5
    c.train.samples_per_task = 1
    c.train.tasks_per_step = 64
    return c


def use_react(c: ConfigDict, max_new_tokens: int = 128) -> ConfigDict:
    """ReAct answers (a ``Thought:`` line, then an ``Action:`` line) for models that follow
    that format (check a model with ``benchmarks/analysis/action_format.py --model M --styles react``);
    a turn then needs ~128 tokens. On the command line: ``--config.agent.prompt_style=react
    --config.agent.response_prefix= --config.rollout.stop="()"
    --config.rollout.max_new_tokens=128``."""
    c.agent.prompt_style = "react"
    c.agent.response_prefix = ""
    c.rollout.max_new_tokens = max_new_tokens
    c.rollout.stop = ()  # the Thought line comes first
    return c


def use_fixed_horizon(c: ConfigDict, turns: int) -> ConfigDict:
    c.horizon.type = "fixed"
    c.horizon.turns = turns
    return c


def model_label(name: str, random_init) -> str:
    """How progress lines and reports name the policy: ``name``, or for ``model.random_init``
    a random model's shape and whose tokenizer it uses, e.g. ``"random 28 layers x 3584 hidden
    (tokenizer of smollm2)"``."""
    if not random_init:
        return str(name)
    shape = dict(random_init)
    parts = [f"{shape[key]} {word}" for key, word in (("num_layers", "layers"),
                                                      ("hidden_size", "hidden")) if key in shape]
    return f"random {' x '.join(parts) or 'model'} (tokenizer of {name})"
