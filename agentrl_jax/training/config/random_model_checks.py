"""The checks of ``model.random_init``: one line per problem."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from agentrl_common.typed_sections import is_int, is_number


def random_init_problems(shape: Mapping[str, Any], where: str) -> list[str]:
    """A random model's shape checked against the network config's field types, then as a
    whole: every size the network needs is given (the vocabulary comes from the tokenizer when
    it is not) and the network config accepts them together (``num_heads`` a multiple of
    ``num_kv_heads``, ...)."""
    from agentrl_jax.models.config import ModelConfig as NetworkConfig

    fields = {f.name: f for f in dataclasses.fields(NetworkConfig)}
    out = []
    if not shape:
        return out
    for key, value in shape.items():
        field = fields.get(key)
        kind = None if field is None else str(field.type)  # "int", "bool", "float", ...
        if field is None:
            out.append(f"{where}.{key}: is not a ModelConfig field (known: "
                       + ", ".join(sorted(fields)) + ")")
        elif kind == "bool" and not isinstance(value, bool):
            out.append(f"{where}.{key}: must be true or false (got {value!r})")
        elif kind == "int" and (not is_int(value) or value < 1):
            out.append(f"{where}.{key}: must be an integer >= 1 (got {value!r})")
        elif kind == "float" and (not is_number(value) or value <= 0):
            out.append(f"{where}.{key}: must be a number > 0 (got {value!r})")
        elif kind == "str" and not isinstance(value, str):
            out.append(f"{where}.{key}: must be a string (got {value!r})")
    if out:
        return out
    required = [name for name, f in fields.items() if f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING and name != "vocab_size"]
    missing = [name for name in required if name not in shape]
    if missing:
        return [f"{where}: lacks {', '.join(missing)} (a random model needs "
                f"{', '.join(required)})"]
    try:
        NetworkConfig(**{"vocab_size": 2, **dict(shape)})
    except (ValueError, TypeError) as error:  # UnsupportedModelError is a ValueError
        out.append(f"{where}: {error}")
    return out
