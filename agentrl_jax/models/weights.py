"""Mapping between our parameter tree and HF tensor names, and building a model from tensors.

HF stores linear weights as ``[out, in]``; nnx kernels are ``[in, out]``, so kernels are
transposed on the way in and out. Every array is placed straight into its target sharding.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Iterable

import jax
import numpy as np
from flax import nnx

from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.llama import CausalLM, abstract_model

log = logging.getLogger(__name__)

ParamPath = tuple  # e.g. ("layers", 3, "attn", "q_proj", "kernel")
ShardingFn = Callable[[ParamPath, tuple[int, ...]], "jax.sharding.Sharding | None"]

# Tensors some checkpoints carry that the model does not need.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)

_LAYER_MODULES = {
    "attn": "self_attn",
    "mlp": "mlp",
    "input_norm": "input_layernorm",
    "post_attn_norm": "post_attention_layernorm",
}


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded: the message names the file and tensor."""


class LoadCancelled(CheckpointError):
    """A load stopped because its cancel flag was set (client gone, server shutting down)."""


def hf_name(path: ParamPath) -> tuple[str, bool]:
    """HF tensor name for a parameter path, and whether the array is transposed."""
    path = tuple(p if isinstance(p, int) else str(p) for p in path)
    if path == ("embed", "embedding"):
        return "model.embed_tokens.weight", False
    if path == ("final_norm", "scale"):
        return "model.norm.weight", False
    if path == ("lm_head", "kernel"):
        return "lm_head.weight", True
    if path[0] == "layers":
        _, index, module, *rest = path
        prefix = f"model.layers.{index}.{_LAYER_MODULES[module]}"
        if module in ("input_norm", "post_attn_norm"):
            return f"{prefix}.weight", False
        sub, leaf = rest
        if leaf == "kernel":
            return f"{prefix}.{sub}.weight", True
        if leaf == "bias":
            return f"{prefix}.{sub}.bias", False
        if leaf == "scale":
            return f"{prefix}.{sub}.weight", False
    raise KeyError(f"no HF name for parameter {'/'.join(map(str, path))}")


def expected_hf_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> the shape a checkpoint of ``cfg`` stores it in (``[out, in]`` for
    kernels), for every parameter, from the abstract model (nothing allocated)."""
    _, state = nnx.split(abstract_model(cfg))
    shapes = {}
    for path, variable in nnx.to_flat_state(state):
        name, transpose = hf_name(path)
        shapes[name] = tuple(variable.shape)[::-1] if transpose else tuple(variable.shape)
    return shapes


def build_model(cfg: ModelConfig, names: Iterable[str], get_tensor: Callable[[str], np.ndarray],
                source: str, sharding_fn: ShardingFn | None = None,
                cancel: threading.Event | None = None) -> CausalLM:
    """Instantiate ``CausalLM(cfg)`` with every parameter read through ``get_tensor(hf_name)``.

    Raises ``CheckpointError`` naming ``source`` and the tensor for a missing tensor or a shape
    mismatch, ``LoadCancelled`` once ``cancel`` is set (checked before every tensor). Arrays go
    straight to ``sharding_fn(path, shape)`` (default: the default device).
    """
    names = set(names)
    graphdef, abstract_state = nnx.split(abstract_model(cfg))
    loaded = []
    used = set()
    param_dtype = np.dtype(cfg.param_dtype) if cfg.param_dtype != "bfloat16" else jax.numpy.bfloat16
    for path, variable in nnx.to_flat_state(abstract_state):
        if cancel is not None and cancel.is_set():
            raise LoadCancelled(f"{source}: loading was cancelled")
        name, transpose = hf_name(path)
        if name not in names:
            raise CheckpointError(f"{source}: missing tensor {name!r} "
                                  f"(needed for parameter {'/'.join(map(str, path))})")
        array = np.asarray(get_tensor(name))
        if transpose:
            if array.ndim != 2:
                raise CheckpointError(f"{source}: tensor {name!r} has shape {array.shape}, "
                                      "expected a matrix")
            array = array.T
        want = tuple(variable.shape)
        if tuple(array.shape) != want:
            got = array.T.shape if transpose else array.shape
            raise CheckpointError(
                f"{source}: tensor {name!r} has shape {tuple(got)}, expected "
                f"{want[::-1] if transpose else want} for this config")
        array = array.astype(param_dtype)
        sharding = sharding_fn(path, want) if sharding_fn else None
        loaded.append((path, variable.replace(jax.device_put(array, sharding))))
        used.add(name)
    extra = sorted(n for n in names - used if not n.endswith(_IGNORED_SUFFIXES)
                   and not (n == "lm_head.weight" and cfg.tie_word_embeddings))
    if extra:
        log.warning("%s: %d tensors not used by the model, e.g. %s", source, len(extra), extra[:5])
    return nnx.merge(graphdef, nnx.from_flat_state(loaded))


#: device copies in ``dtype`` made at once by ``model_to_hf_tensors`` (bytes): bounds the extra
#: device memory of an export while still fetching many tensors per transfer
EXPORT_GROUP_BYTES = 512 * 2**20


def model_to_hf_tensors(model: CausalLM, dtype: str = "float32") -> dict[str, np.ndarray]:
    """Gather every parameter to host memory under its HF name (kernels transposed).

    The cast to ``dtype`` and the transpose run where the parameter lives (a device array:
    half the bytes cross to the host for bfloat16 from float32, and the host does no
    element-wise work), a group of at most ``EXPORT_GROUP_BYTES`` of converted tensors at a
    time. Parameters sharded over several processes are gathered with ``placement.to_host`` (a
    collective: in a multi-process run every process must call this, in the same order, and
    each gets the full tensors)."""
    from agentrl_jax.sharding.placement import to_host_tree

    np_dtype = jax.numpy.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    out: dict[str, np.ndarray] = {}
    order: list[str] = []  # the parameters' order (groups arrive after the host arrays)
    group: dict[str, Any] = {}
    group_bytes = 0

    def flush() -> None:
        nonlocal group, group_bytes
        for key, array in to_host_tree(group).items():
            out[key] = np.ascontiguousarray(array)  # already contiguous when fetched
        group, group_bytes = {}, 0

    for path, variable in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        name, transpose = hf_name(path)
        order.append(name)
        value = variable.get_value()
        if isinstance(value, jax.Array):
            value = value.astype(np_dtype)  # on the parameter's own devices
            group[name] = value.T if transpose else value
            group_bytes += value.size * np.dtype(np_dtype).itemsize
            if group_bytes >= EXPORT_GROUP_BYTES:
                flush()
        else:  # a host array
            array = np.asarray(value).astype(np_dtype)
            out[name] = np.ascontiguousarray(array.T if transpose else array)
    flush()
    return {name: out[name] for name in order}
