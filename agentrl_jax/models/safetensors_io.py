"""Load and export HF safetensors directories (single file or sharded with an index)."""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import numpy as np
import safetensors
import safetensors.numpy

from agentrl_jax.models.config import ModelConfig, UnsupportedModelError
from agentrl_jax.models.llama import CausalLM
from agentrl_jax.models.weights import CheckpointError, ShardingFn, build_model, model_to_hf_tensors

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
MAX_SHARD_BYTES = 4 * 1024**3
MAX_JSON_BYTES = 64 * 1024**2  # config.json / the index: far above any real one


def _read_json_object(path: str, what: str) -> dict[str, Any]:
    """The JSON object in ``path`` (``CheckpointError`` if it is not one, or is absurdly big)."""
    if os.path.getsize(path) > MAX_JSON_BYTES:
        raise CheckpointError(f"{path}: {what} is larger than {MAX_JSON_BYTES} bytes")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError, nesting
        raise CheckpointError(f"{path}: {what} is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: {what} must be a JSON object, got {type(data).__name__}")
    return data


def _shard_path(directory: str, file: Any, index_path: str) -> str:
    """The path of index entry ``file``: a relative path that stays inside ``directory``.

    Absolute paths, ``..`` components and symbolic links leading out of the checkpoint are
    refused before anything is opened (a checkpoint must not make the loader read elsewhere)."""
    if not isinstance(file, str) or not file or "\0" in file:
        raise CheckpointError(f"{index_path}: weight_map values must be non-empty file names, got {file!r}")
    if os.path.isabs(file) or ".." in file.replace("\\", "/").split("/"):
        raise CheckpointError(f"{index_path}: shard {file!r} is not a relative path inside the checkpoint")
    root = os.path.realpath(directory)
    path = os.path.realpath(os.path.join(root, file))
    if os.path.commonpath([root, path]) != root:
        raise CheckpointError(f"{index_path}: shard {file!r} resolves outside the checkpoint directory")
    return path


def _tensor_locations(directory: str) -> dict[str, str]:
    """Map tensor name -> safetensors file path for a HF model directory."""
    index_path = os.path.join(directory, INDEX_FILE)
    single_path = os.path.join(directory, SINGLE_FILE)
    if os.path.exists(index_path):
        weight_map = _read_json_object(index_path, "the safetensors index").get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index_path}: not a valid safetensors index (no 'weight_map' object)")
        shards: dict[str, str] = {}
        for file in weight_map.values():
            path = _shard_path(directory, file, index_path)  # validates the entry before using it as a key
            shards[file] = path
        locations = {name: shards[file] for name, file in weight_map.items()}
        missing = sorted({f for f, p in shards.items() if not os.path.isfile(p)})
        if missing:
            raise CheckpointError(f"{index_path}: shard files missing: {missing}")
        return locations
    if os.path.exists(single_path):
        try:
            with safetensors.safe_open(single_path, framework="numpy") as f:
                return {name: single_path for name in f.keys()}
        except Exception as e:  # safetensors raises its own error types for corrupt headers
            raise CheckpointError(f"{single_path}: not a valid safetensors file ({e})") from e
    raise CheckpointError(f"{directory}: no {SINGLE_FILE} or {INDEX_FILE}")


def load_safetensors_model(directory: str, config: ModelConfig | None = None,
                           sharding_fn: ShardingFn | None = None,
                           **config_overrides: Any) -> tuple[CausalLM, ModelConfig]:
    """Load a HF directory (config.json + safetensors) into a ``CausalLM``."""
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"model directory not found: {directory}")
    cfg = config or _read_config(directory, **config_overrides)
    locations = _tensor_locations(directory)
    handles: dict[str, Any] = {}

    def get_tensor(name: str) -> np.ndarray:
        path = locations[name]
        if path not in handles:
            handles[path] = safetensors.safe_open(path, framework="numpy")
        try:
            return handles[path].get_tensor(name)
        except Exception as e:
            raise CheckpointError(f"{path}: cannot read tensor {name!r} ({e})") from e

    model = build_model(cfg, locations.keys(), get_tensor, source=directory,
                        sharding_fn=sharding_fn)
    handles.clear()
    return model, cfg


def _read_config(directory: str, **overrides: Any) -> ModelConfig:
    """``ModelConfig`` of ``directory/config.json``; any malformed content is a ``CheckpointError``
    (or ``UnsupportedModelError``), never another exception type."""
    path = os.path.join(directory, "config.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no config.json in {directory}")
    hf = _read_json_object(path, "config.json")
    try:
        return ModelConfig.from_hf_dict(hf, **overrides)
    except (CheckpointError, UnsupportedModelError):
        raise
    except Exception as e:  # noqa: BLE001 -- wrong types / values inside the file
        raise CheckpointError(f"{path}: invalid model config ({type(e).__name__}: {e})") from None


def save_hf_directory(model: CausalLM, directory: str, tokenizer: Any = None,
                      dtype: str | None = None, generation_config: dict[str, Any] | None = None
                      ) -> str:
    """Export ``model`` as a HF directory that ``transformers`` and SGLang load.

    Writes config.json, model.safetensors (or shards + index above 4 GiB),
    generation_config.json and, when given, the tokenizer files. Returns ``directory``.

    Multi-process runs: when ``model``'s parameters are sharded over several processes, this
    is a collective (every process calls it; the tensors are gathered to every process), only
    process 0 writes, and every process returns once the directory is complete (a barrier).
    A model whose arrays this process holds entirely is written by whoever calls this.
    """
    import jax
    from flax import nnx

    cfg: ModelConfig = model.cfg
    dtype = dtype or cfg.param_dtype
    collective = jax.process_count() > 1 and any(
        isinstance(x, jax.Array) and not x.is_fully_addressable
        for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    tensors = model_to_hf_tensors(model, dtype=dtype)
    if collective:
        from jax.experimental import multihost_utils
        if jax.process_index() == 0:
            _write_hf_directory(model, directory, tensors, tokenizer, dtype, generation_config)
        multihost_utils.sync_global_devices(f"save_hf_directory:{os.path.abspath(directory)}")
        return directory
    return _write_hf_directory(model, directory, tensors, tokenizer, dtype, generation_config)


def _write_hf_directory(model: CausalLM, directory: str, tensors: dict[str, np.ndarray],
                        tokenizer: Any, dtype: str, generation_config: dict[str, Any] | None
                        ) -> str:
    cfg: ModelConfig = model.cfg
    os.makedirs(directory, exist_ok=True)
    hf_config = cfg.to_hf_dict()
    hf_config["torch_dtype"] = dtype
    tmp_dir = directory.rstrip("/") + ".tmp-export"
    shutil.rmtree(tmp_dir, ignore_errors=True)
    os.makedirs(tmp_dir)
    _write_tensors(tensors, tmp_dir)
    with open(os.path.join(tmp_dir, "config.json"), "w") as f:
        json.dump(hf_config, f, indent=2)
    gen = {"bos_token_id": cfg.bos_token_id, "eos_token_id": hf_config["eos_token_id"],
           "pad_token_id": cfg.pad_token_id}
    gen.update(generation_config or {})
    with open(os.path.join(tmp_dir, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp_dir)
    # Replace the files of the target directory only once everything was written.
    for name in (SINGLE_FILE, INDEX_FILE):
        stale = os.path.join(directory, name)
        if os.path.exists(stale):
            os.remove(stale)
    for name in os.listdir(tmp_dir):
        os.replace(os.path.join(tmp_dir, name), os.path.join(directory, name))
    shutil.rmtree(tmp_dir, ignore_errors=True)
    return directory


def _write_tensors(tensors: dict[str, np.ndarray], directory: str) -> None:
    total = sum(a.nbytes for a in tensors.values())
    if total <= MAX_SHARD_BYTES:
        safetensors.numpy.save_file(tensors, os.path.join(directory, SINGLE_FILE),
                                    metadata={"format": "pt"})
        return
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, array in tensors.items():
        if size and size + array.nbytes > MAX_SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1][name] = array
        size += array.nbytes
    weight_map = {}
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        safetensors.numpy.save_file(shard, os.path.join(directory, file), metadata={"format": "pt"})
        weight_map.update({name: file for name in shard})
    with open(os.path.join(directory, INDEX_FILE), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
