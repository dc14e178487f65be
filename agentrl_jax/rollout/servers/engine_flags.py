"""The rollout server's engine options, generated from ``EngineConfig``'s fields.

Every field of the engine's typed section (``rollout/engine/engine_config.py``) is one option:
``max_batch`` -> ``--max-batch``, its type from the annotation, its default the section's (the
only default: nothing here restates one), its help the field's ``help`` and its choices the
field's. Three functions, each the inverse of another:

* :func:`add_engine_arguments` puts the options on an ``argparse`` parser;
* :func:`engine_config_from_args` builds the ``EngineConfig`` of parsed options (the section
  checks them: a bad value is a ``SectionError`` naming the option's field);
* :func:`engine_flags` writes the options that rebuild a given ``EngineConfig`` (the
  engine-servers backend starts its servers with them), so
  ``engine_config_from_args(parse(engine_flags(c))) == c`` for every config ``c``.

Spellings on the command line: a sequence as a comma list (``64,256``; ``''`` the empty one),
``auto`` as itself, a boolean as ``--share-prompts`` / ``--no-share-prompts``, an unset dtype
by leaving the option out.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any

from agentrl_jax.rollout.engine.engine_config import AUTO, EngineConfig


def option_name(field: str) -> str:
    """``max_batch`` -> ``--max-batch``."""
    return "--" + field.replace("_", "-")


def _int_or_auto(text: str) -> int | str:
    if text == AUTO:
        return AUTO
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or an integer, got {text!r}") from None


def _spelling(value: Any) -> str:
    """A field value as its command-line text (tuples as comma lists)."""
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def _annotation_args(annotation: Any) -> set[Any]:
    return set(typing.get_args(annotation)) or {annotation}


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """One option per ``EngineConfig`` field (module docstring), in the fields' order, in an
    argument group "engine"."""
    group = parser.add_argument_group("engine", "the engine's settings (EngineConfig)")
    hints = typing.get_type_hints(EngineConfig)
    for f in dataclasses.fields(EngineConfig):
        meta, annotation = f.metadata, hints[f.name]
        kinds = _annotation_args(annotation)
        help_text = f"{meta.get('help') or f.name} (default: {_spelling(f.default)!s})"
        options: dict[str, Any] = {"default": f.default, "help": help_text, "dest": f.name}
        if annotation is bool:
            options["action"] = argparse.BooleanOptionalAction
        elif annotation is int:
            options["type"] = int
        elif kinds == {int, str}:  # an integer or "auto"
            options["type"] = _int_or_auto
        elif any(typing.get_origin(k) is tuple for k in kinds):  # a comma list or "auto"
            options["type"] = str
            options["default"] = _spelling(f.default)
        else:
            options["type"] = str
            choices = meta.get("choices")
            if choices is not None and not callable(choices):
                options["choices"] = list(choices)
        group.add_argument(option_name(f.name), **options)


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """The ``EngineConfig`` of options parsed by a parser with :func:`add_engine_arguments`
    (``SectionError``, a ``ValueError``, for a bad value; ``"auto"`` values stay: the engine
    resolves them for its devices)."""
    return EngineConfig(**{name: getattr(args, name) for name in EngineConfig.field_names()})


def engine_flags(config: EngineConfig) -> list[str]:
    """The options that rebuild ``config`` through :func:`engine_config_from_args` (every
    field, defaults included, so a server started with them does not depend on its own
    defaults; a dtype that is None is left out, which means the same)."""
    flags: list[str] = []
    for name in EngineConfig.field_names():
        value = getattr(config, name)
        if value is None:
            continue
        if isinstance(value, bool):
            flags.append(option_name(name) if value else "--no-" + name.replace("_", "-"))
        else:
            flags += [option_name(name), _spelling(value)]
    return flags


__all__ = ["add_engine_arguments", "engine_config_from_args", "engine_flags", "option_name"]
