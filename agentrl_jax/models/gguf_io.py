"""Load GGUF checkpoints (llama.cpp format): config from metadata, dequantized tensors.

llama.cpp's converter permutes the rows of the Q and K projections of Llama-architecture models
so that its interleaved RoPE matches HF's rotate-half RoPE. We use rotate-half, so those rows are
un-permuted here: ``w.reshape(n_head, out // n_head // 2, 2, in).swapaxes(1, 2).reshape(out, in)``.
Qwen2/Qwen3 GGUFs use NEOX-style RoPE and are not permuted.
"""

from __future__ import annotations

import os
import re
from typing import Any

import numpy as np

from agentrl_jax.models.checkpoint_files import check_regular_file
from agentrl_jax.models.config import ModelConfig, UnsupportedModelError, model_family
from agentrl_jax.models.gguf_index import ArrayField, GGUFIndex, read_index
from agentrl_jax.models.llama import CausalLM
from agentrl_jax.models.weights import CheckpointError, ShardingFn, build_model

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")


def gguf_to_hf_name(name: str) -> str | None:
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    match = _BLOCK_RE.match(name)
    if match and match.group(2) in _BLOCK_NAMES:
        index, module, kind = match.groups()
        return f"model.layers.{index}.{_BLOCK_NAMES[module]}.{kind}"
    return None


def open_gguf(path: str):
    """A ``gguf.GGUFReader`` for ``path`` with clear errors for missing or corrupt files."""
    import gguf

    if not os.path.exists(path):
        raise FileNotFoundError(f"GGUF file not found: {path}")
    check_regular_file(path)  # a FIFO would block the reader
    try:
        return gguf.GGUFReader(path)
    except Exception as e:  # the reader raises ValueError / struct errors / IndexError
        raise CheckpointError(f"{path}: not a valid GGUF file ({type(e).__name__}: {e})") from e


def open_index(path: str) -> GGUFIndex:
    """The tensor index and scalar metadata of ``path`` (``models/gguf_index.py``: ~60x faster
    than ``gguf.GGUFReader``, which materialises every tokenizer string), with the same errors
    as :func:`open_gguf`."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"GGUF file not found: {path}")
    check_regular_file(path)  # a FIFO would block the reader
    try:
        return read_index(path)
    except Exception as e:  # struct errors, a truncated file, an unknown tensor type
        raise CheckpointError(f"{path}: not a valid GGUF file ({type(e).__name__}: {e})") from e


def field_value(reader, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return default
    return field.contents()


def gguf_config(index: GGUFIndex, path: str, **overrides: Any) -> ModelConfig:
    """A ``ModelConfig`` from GGUF metadata (``general.architecture`` and ``<arch>.*`` keys)."""
    meta = index.metadata
    arch = meta.get("general.architecture")
    family = model_family(arch, where=f"{path}: GGUF architecture")
    names = {t.name for t in index.tensors}
    if "rope_freqs.weight" in names:
        raise UnsupportedModelError(
            f"{path}: GGUF with a rope_freqs tensor (Llama-3.1 style scaled RoPE) is not supported; "
            "convert the HF checkpoint instead")

    def need(key: str) -> Any:
        value = meta.get(f"{arch}.{key}")
        if value is None:
            raise CheckpointError(f"{path}: GGUF metadata lacks {arch}.{key}")
        return value

    hidden = int(need("embedding_length"))
    heads = int(need("attention.head_count"))
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = meta.get(f"{arch}.vocab_size") or (
        tokens.length if isinstance(tokens, ArrayField) else None)
    if vocab is None:
        raise CheckpointError(f"{path}: GGUF metadata has no vocabulary size")
    values = dict(
        model_type=arch,
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(need("feed_forward_length")),
        num_layers=int(need("block_count")),
        num_heads=heads,
        num_kv_heads=int(meta.get(f"{arch}.attention.head_count_kv", heads)),
        head_dim=int(meta.get(f"{arch}.attention.key_length", hidden // heads)),
        rope_theta=float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        rms_norm_eps=float(meta.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        max_position_embeddings=int(meta.get(f"{arch}.context_length", 4096)),
        tie_word_embeddings="output.weight" not in names,
        attention_bias=bool(family.qkv_bias),
        qk_norm=family.qk_norm,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
        pad_token_id=meta.get("tokenizer.ggml.padding_token_id"),
    )
    scaling_type = meta.get(f"{arch}.rope.scaling.type")
    if scaling_type == "linear":
        values["rope_scaling"] = (("factor", float(need("rope.scaling.factor"))),
                                  ("rope_type", "linear"))
    elif scaling_type not in (None, "none"):
        raise UnsupportedModelError(f"{path}: GGUF RoPE scaling {scaling_type!r} is not supported")
    values.update(overrides)
    return ModelConfig(**values)


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation of ``w [out, in]`` (or a bias ``[out]``)."""
    out = w.shape[0]
    rest = w.shape[1:]
    return w.reshape(n_head, out // n_head // 2, 2, *rest).swapaxes(1, 2).reshape(out, *rest)


def load_gguf_model(path: str, sharding_fn: ShardingFn | None = None,
                    **config_overrides: Any) -> tuple[CausalLM, ModelConfig]:
    """Dequantize a GGUF file into a ``CausalLM`` (float32 master weights by default)."""
    from gguf import quants

    index = open_index(path)
    cfg = gguf_config(index, path, **config_overrides)
    by_hf_name = {}
    for tensor in index.tensors:
        hf = gguf_to_hf_name(tensor.name)
        if hf is not None:
            by_hf_name[hf] = tensor
    permute = model_family(cfg.model_type).gguf_permuted_qk

    def get_tensor(name: str) -> np.ndarray:
        tensor = by_hf_name[name]
        try:
            array = quants.dequantize(tensor.data, tensor.tensor_type)
            array = np.asarray(array, np.float32).reshape(tensor.shape[::-1])
        except Exception as e:
            raise CheckpointError(f"{path}: cannot dequantize tensor {tensor.name!r} "
                                  f"({tensor.tensor_type.name}): {e}") from e
        if permute and ".self_attn.q_proj." in name:
            array = _unpermute(array, cfg.num_heads)
        elif permute and ".self_attn.k_proj." in name:
            array = _unpermute(array, cfg.num_kv_heads)
        return array

    model = build_model(cfg, by_hf_name.keys(), get_tensor, source=path, sharding_fn=sharding_fn)
    return model, cfg
