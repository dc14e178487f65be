"""Load and export HF safetensors directories (single file or sharded with an index).

Loading reads the files through ``checkpoint_files`` (confined, regular, non-blocking) and
``safetensors_header`` (headers checked before any data is read; data read with ``pread``), not
through the ``safetensors`` Rust library, whose memory map and panics a forged file could turn
into a crash; exporting writes with ``safetensors.numpy``."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
from typing import Any, Callable

import numpy as np
import safetensors.numpy

from agentrl_jax.models.checkpoint_files import confined_path, open_regular_file, read_json_object
from agentrl_jax.models.config import ModelConfig, UnsupportedModelError
from agentrl_jax.models.llama import CausalLM
from agentrl_jax.models.safetensors_header import (MIN_WEIGHT_BYTES, WEIGHT_DTYPES, TensorEntry,
                                                   read_header, read_tensor)
from agentrl_jax.models.weights import (CheckpointError, ShardingFn, build_model,
                                        expected_hf_shapes, model_to_hf_tensors)

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
MAX_SHARD_BYTES = 4 * 1024**3
#: distinct shard files an index may name (Llama 3.1 405B has 191)
MAX_SHARDS = 1024


def _tensor_files(directory: str) -> list[str]:
    """The real paths of a HF directory's safetensors files: the index's shards, or
    ``model.safetensors``, each confined to the directory by ``checkpoint_files.confined_path``
    (the same rule for both). Which tensor is in which file is then read from their headers."""
    if os.path.lexists(os.path.join(directory, INDEX_FILE)):
        index_path = os.path.join(directory, INDEX_FILE)
        weight_map = read_json_object(directory, INDEX_FILE, "the safetensors index").get(
            "weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index_path}: not a valid safetensors index (no 'weight_map' "
                                  "object)")
        files = list(dict.fromkeys(weight_map.values()))
        if len(files) > MAX_SHARDS:
            raise CheckpointError(f"{index_path}: names {len(files)} shard files, more than "
                                  f"{MAX_SHARDS}")
        paths = [confined_path(directory, f, f"{index_path}: weight_map") for f in files]
        missing = sorted(f for f, p in zip(files, paths) if not os.path.lexists(p))
        if missing:
            raise CheckpointError(f"{index_path}: shard files missing: {missing}")
        return paths
    if os.path.lexists(os.path.join(directory, SINGLE_FILE)):
        return [confined_path(directory, SINGLE_FILE, directory)]
    raise CheckpointError(f"{directory}: no {SINGLE_FILE} or {INDEX_FILE}")


def _check_against_config(cfg: ModelConfig, entries: dict[str, TensorEntry], source: str,
                          file_bytes: int) -> None:
    """Refuse, from the headers alone, a checkpoint whose tensors cannot be ``cfg``'s: fewer
    bytes than ``cfg.num_parameters`` at the smallest weight dtype (before the abstract model
    of ``cfg`` is built), then any expected tensor missing, of another shape, or not a float."""
    need = cfg.num_parameters * MIN_WEIGHT_BYTES
    if need > file_bytes:
        raise CheckpointError(
            f"{source}: config.json describes {cfg.num_parameters:,} parameters (at least "
            f"{need:,} bytes), but the safetensors files hold {file_bytes:,} bytes")
    for name, shape in expected_hf_shapes(cfg).items():
        entry = entries.get(name)
        if entry is None:
            raise CheckpointError(f"{source}: missing tensor {name!r}")
        if entry.shape != shape:
            raise CheckpointError(f"{entry.path}: tensor {name!r} has shape {entry.shape} in "
                                  f"the header, expected {shape} for this config")
        if entry.dtype not in WEIGHT_DTYPES:
            raise CheckpointError(f"{entry.path}: tensor {name!r} is {entry.dtype}; weights "
                                  f"must be one of {', '.join(WEIGHT_DTYPES)}")


def load_safetensors_model(directory: str, config: ModelConfig | None = None,
                           sharding_fn: ShardingFn | None = None, *,
                           check_config: Callable[[ModelConfig], None] | None = None,
                           cancel: threading.Event | None = None,
                           **config_overrides: Any) -> tuple[CausalLM, ModelConfig]:
    """Load a HF directory (config.json + safetensors) into a ``CausalLM``.

    Nothing of the checkpoint is trusted: the config's sizes are bounded (``ModelConfig``),
    ``check_config(cfg)`` may refuse it (e.g. another architecture than the one served) before
    anything is built, every file is a regular file inside ``directory``, and every header is
    checked (``safetensors_header``) and against the config (names, shapes, dtypes, parameter
    count against the bytes) before any tensor data is read. ``cancel``: set it to stop the
    load between tensors (``LoadCancelled``). Every defect is a ``CheckpointError`` (or
    ``UnsupportedModelError``, ``FileNotFoundError`` for a missing directory or config.json).
    """
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"model directory not found: {directory}")
    cfg = config or _read_config(directory, **config_overrides)
    if check_config is not None:
        check_config(cfg)
    with contextlib.ExitStack() as stack:
        entries: dict[str, TensorEntry] = {}
        fds: dict[str, int] = {}
        file_bytes = 0
        for path in _tensor_files(directory):
            fd, size = stack.enter_context(open_regular_file(path))
            fds[path] = fd
            file_bytes += size
            for name, entry in read_header(fd, size, path).items():
                if name in entries:
                    raise CheckpointError(f"{directory}: tensor {name!r} is in both "
                                          f"{entries[name].path} and {path}")
                entries[name] = entry
        _check_against_config(cfg, entries, directory, file_bytes)

        def get_tensor(name: str) -> np.ndarray:
            entry = entries[name]
            return read_tensor(fds[entry.path], entry, cancel)

        model = build_model(cfg, entries.keys(), get_tensor, source=directory,
                            sharding_fn=sharding_fn, cancel=cancel)
    return model, cfg


def _read_config(directory: str, **overrides: Any) -> ModelConfig:
    """``ModelConfig`` of ``directory/config.json``; any malformed content is a ``CheckpointError``
    (or ``UnsupportedModelError``), never another exception type."""
    path = os.path.join(directory, "config.json")
    if not os.path.lexists(path):
        raise FileNotFoundError(f"no config.json in {directory}")
    hf = read_json_object(directory, "config.json", "config.json")
    try:
        return ModelConfig.from_hf_dict(hf, **overrides)
    except UnsupportedModelError as e:
        raise UnsupportedModelError(f"{path}: invalid model config ({e})") from None
    except CheckpointError:
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
