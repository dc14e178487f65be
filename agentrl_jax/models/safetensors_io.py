"""Load and export HF safetensors directories (single file or sharded with an index)."""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import numpy as np
import safetensors
import safetensors.numpy

from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.llama import CausalLM
from agentrl_jax.models.weights import CheckpointError, ShardingFn, build_model, model_to_hf_tensors

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
MAX_SHARD_BYTES = 4 * 1024**3


def _tensor_locations(directory: str) -> dict[str, str]:
    """Map tensor name -> safetensors file path for a HF model directory."""
    index_path = os.path.join(directory, INDEX_FILE)
    single_path = os.path.join(directory, SINGLE_FILE)
    if os.path.exists(index_path):
        try:
            with open(index_path) as f:
                weight_map = json.load(f)["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise CheckpointError(f"{index_path}: not a valid safetensors index ({e})") from e
        locations = {name: os.path.join(directory, file) for name, file in weight_map.items()}
        missing = sorted({p for p in locations.values() if not os.path.exists(p)})
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
    cfg = config or ModelConfig.from_hf_file(directory, **config_overrides)
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
