"""The engine's inference forward with a head-major KV cache ``[B, K, S, Dh]``.

``CausalLM`` keeps its cache as ``[B, S, K, Dh]``; its attention contracts over ``Dh`` with
``(B, K)`` as batch dimensions, and XLA then physically transposes every layer's cache to
``[B, K, S, Dh]`` at every call (seen in the compiled HLO), roughly tripling the KV traffic of a
memory-bound decode step. This forward is the same computation with the cache stored
head-major, so the attention dots read it in place.

Everything except the attention core is the model's own code: embedding, projections (with
their biases), q/k norms, RoPE, MLP, norms and the LM head are the modules / functions of
``agentrl_jax.models``; ``tests/test_engine.py`` checks this forward against ``CausalLM`` for
Llama, Qwen2 (bias) and Qwen3 (q/k norm) configurations.

Cache semantics are the model's: rows are indexed by absolute position, a call writes its
keys / values at ``positions`` (positions ``>= S`` are dropped) and a query at position ``p``
attends to cache positions ``0..p``.
"""

from __future__ import annotations

from typing import NamedTuple

import flax.struct
import jax
import jax.numpy as jnp

from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.llama import CausalLM, KVCache
from agentrl_jax.models.rope import apply_rope, inverse_frequencies, rope_cos_sin
from agentrl_jax.kernels.decode_attention import ragged_decode_attention
from agentrl_jax.kernels.fused_decode_attention import fused_decode_attention
from agentrl_jax.kernels.prefill_attention import (dense_prefill_attention,
                                                          flash_prefill_attention,
                                                          flash_prefill_attention_in_cache,
                                                          unsupported_prefill_shape)

HEAD_MAJOR, SEQ_MAJOR = "bksd", "bskd"
DENSE, RAGGED, RAGGED_INTERPRET = "dense", "ragged", "ragged_interpret"
# ragged attention whose kernel also writes the step's keys / values (fused_decode_attention.py)
FUSED, FUSED_INTERPRET = "ragged_fused", "ragged_fused_interpret"
# prefill (multi-token) attention: XLA einsums over the whole row, or the flash kernel that reads
# only the keys each block of queries sees (prefill_attention.py)
FLASH, FLASH_INTERPRET = "flash", "flash_interpret"
# the same kernel reading each row at its slot of the whole cache (no gathered copy of the rows)
FLASH_IN_CACHE, FLASH_IN_CACHE_INTERPRET = "flash_in_cache", "flash_in_cache_interpret"
# The decode step's GEMMs: the model's separate projections (XLA merges and tiles them),
# q/k/v and gate/up weights concatenated once per weight version (:func:`merge_projections`), or
# that with cuBLAS for every GEMM of the decode call (XLA's Triton GEMMs off).
DECODE_GEMM = ("xla", "merged", "merged_cublas")
XLA_GEMM, MERGED_GEMM, MERGED_CUBLAS = DECODE_GEMM


class MergedProjections(NamedTuple):
    """One layer's input projections as single GEMMs: ``qkv [D, (H + 2K) Dh]`` (q | k | v
    kernels side by side), ``qkv_bias [(H + 2K) Dh]`` or None, ``gate_up [D, 2I]``."""

    qkv: jax.Array
    qkv_bias: jax.Array | None
    gate_up: jax.Array


def merge_projections(model: CausalLM) -> tuple[MergedProjections, ...]:
    """Every layer's q/k/v and gate/up kernels concatenated (``[D, N]`` layout, the model's
    param dtype). The engine builds them once per weight version (``compiled_functions``'s
    ``merge``): left to itself, XLA merges the separate GEMMs of a decode step but concatenates
    the weights inside the GEMM kernel at every step, which is slower than a GEMM on a
    pre-concatenated weight (``benchmarks/contenders/decode_gemm.py``; docs/PERFORMANCE.md, "Decode
    GEMMs")."""
    merged = []
    for layer in model.layers:
        attn, mlp = layer.attn, layer.mlp
        projs = (attn.q_proj, attn.k_proj, attn.v_proj)
        bias = (jnp.concatenate([p.bias[...] for p in projs])
                if attn.q_proj.bias is not None else None)
        merged.append(MergedProjections(
            qkv=jnp.concatenate([p.kernel[...] for p in projs], axis=1), qkv_bias=bias,
            gate_up=jnp.concatenate([mlp.gate_proj.kernel[...], mlp.up_proj.kernel[...]],
                                    axis=1)))
    return tuple(merged)


def _merged_linear(x: jax.Array, kernel: jax.Array, bias: jax.Array | None, dtype
                   ) -> jax.Array:
    """``x [..., D] @ kernel [D, N] (+ bias)`` in ``dtype``, as ``nnx.Linear`` computes it."""
    y = jnp.dot(x.astype(dtype), kernel.astype(dtype))
    return y if bias is None else y + bias.astype(dtype)


@flax.struct.dataclass
class HeadMajorCache:
    """Per-layer key/value caches, each ``[B, K, S, Dh]``."""

    keys: tuple[jax.Array, ...]
    values: tuple[jax.Array, ...]

    @classmethod
    def zeros(cls, config: ModelConfig, batch_size: int, max_length: int,
              dtype: jnp.dtype | None = None) -> "HeadMajorCache":
        dtype = dtype or jnp.dtype(config.dtype)
        shape = (batch_size, config.num_kv_heads, max_length, config.head_dim)
        return cls(keys=tuple(jnp.zeros(shape, dtype) for _ in range(config.num_layers)),
                   values=tuple(jnp.zeros(shape, dtype) for _ in range(config.num_layers)))


def new_cache(layout: str, config: ModelConfig, batch_size: int, max_length: int):
    if layout == HEAD_MAJOR:
        return HeadMajorCache.zeros(config, batch_size, max_length)
    return KVCache.zeros(config, batch_size, max_length)


def _fused_decode(attn, x: jax.Array, cos: jax.Array, sin: jax.Array, positions: jax.Array,
                  cache_k: jax.Array, cache_v: jax.Array, merged: MergedProjections | None,
                  interpret: bool) -> tuple[jax.Array, jax.Array, jax.Array]:
    """A decode step (``x [B, 1, D]``) through :func:`fused_decode_attention`: with merged
    projections and no q/k norms the q/k/v GEMM's output goes to the kernel as it is and the
    kernel applies RoPE; otherwise q/k/v are projected, normed and rotated here and stacked."""
    cfg: ModelConfig = attn.cfg
    b = x.shape[0]
    h, kh, dh = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    if merged is not None and not cfg.qk_norm:
        qkv = _merged_linear(x[:, 0], merged.qkv, merged.qkv_bias, jnp.dtype(cfg.dtype))
        rope = (cos[:, 0], sin[:, 0])
    else:
        q = attn.q_proj(x).reshape(b, 1, h, dh)
        k = attn.k_proj(x).reshape(b, 1, kh, dh)
        v = attn.v_proj(x).reshape(b, 1, kh, dh)
        if cfg.qk_norm:
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        qkv, rope = jnp.concatenate([q[:, 0], k[:, 0], v[:, 0]], axis=1), None
    out, cache_k, cache_v = fused_decode_attention(
        qkv.reshape(b, h + 2 * kh, dh), cache_k, cache_v, positions[:, 0], num_heads=h,
        rope=rope, interpret=interpret)
    return attn.o_proj(out.reshape(b, 1, h * dh)), cache_k, cache_v


def _attention(attn, x: jax.Array, cos: jax.Array, sin: jax.Array, positions: jax.Array,
               cache_k: jax.Array, cache_v: jax.Array, decode_attention: str = DENSE,
               merged: MergedProjections | None = None, prefill_attention: str = DENSE,
               slots: jax.Array | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The model's ``Attention`` with a head-major cache: returns (output, cache_k, cache_v).
    A one-token call (decode) with ``decode_attention`` ``ragged`` / ``ragged_interpret``
    reads only each row's valid keys (``decode_attention.py``), with ``ragged_fused`` /
    ``ragged_fused_interpret`` the same kernel also writes the new keys / values
    (``fused_decode_attention.py``; no scatters); ``merged``: q/k/v as one GEMM. A
    multi-token call (prefill) with ``prefill_attention`` ``flash`` / ``flash_interpret`` runs
    the flash kernel of ``prefill_attention.py``, otherwise XLA einsums over the whole row.
    ``slots [B]``: row ``b`` of the call is cache row ``slots[b]`` of the whole cache (a
    prefill with ``flash_in_cache`` / ``flash_in_cache_interpret``; rows ``>= `` the cache's
    are unused); None: row ``b`` is cache row ``b``."""
    cfg: ModelConfig = attn.cfg
    b, t, _ = x.shape
    h, kh, dh = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    if t == 1 and decode_attention in (FUSED, FUSED_INTERPRET):
        return _fused_decode(attn, x, cos, sin, positions, cache_k, cache_v, merged,
                             interpret=decode_attention == FUSED_INTERPRET)
    if merged is None:
        q = attn.q_proj(x).reshape(b, t, h, dh)
        k = attn.k_proj(x).reshape(b, t, kh, dh)
        v = attn.v_proj(x).reshape(b, t, kh, dh)
    else:
        qkv = _merged_linear(x, merged.qkv, merged.qkv_bias, jnp.dtype(cfg.dtype))
        q = qkv[..., :h * dh].reshape(b, t, h, dh)
        k = qkv[..., h * dh:(h + kh) * dh].reshape(b, t, kh, dh)
        v = qkv[..., (h + kh) * dh:].reshape(b, t, kh, dh)
    if cfg.qk_norm:
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    rows = (jnp.arange(b) if slots is None else slots)[:, None]
    # Advanced indices (rows, positions) around a slice: the update is laid out [B, T, K, Dh].
    cache_k = cache_k.at[rows, :, positions].set(k.astype(cache_k.dtype), mode="drop")
    cache_v = cache_v.at[rows, :, positions].set(v.astype(cache_v.dtype), mode="drop")
    s = cache_k.shape[2]
    if t == 1 and decode_attention in (RAGGED, RAGGED_INTERPRET):
        pos = positions[:, 0]
        lengths = jnp.where(pos < s, pos + 1, 0)  # rows at position >= S are idle: no keys
        out = ragged_decode_attention(q[:, 0], cache_k, cache_v, lengths,
                                      interpret=decode_attention == RAGGED_INTERPRET)
        return attn.o_proj(out.reshape(b, 1, h * dh)), cache_k, cache_v
    if slots is not None:
        if prefill_attention not in (FLASH_IN_CACHE, FLASH_IN_CACHE_INTERPRET):
            raise ValueError("rows at slots of the whole cache need flash_in_cache attention")
        out = flash_prefill_attention_in_cache(
            q, cache_k, cache_v, slots, positions,
            interpret=prefill_attention == FLASH_IN_CACHE_INTERPRET)
    elif (t > 1 and prefill_attention in (FLASH, FLASH_INTERPRET)
            and unsupported_prefill_shape(t, s, dh) is None):  # else dense, for this shape
        out = flash_prefill_attention(q, cache_k, cache_v, positions,
                                      interpret=prefill_attention == FLASH_INTERPRET)
    else:
        out = dense_prefill_attention(q, cache_k, cache_v, positions)
    return attn.o_proj(out.reshape(b, t, h * dh)), cache_k, cache_v


def _mlp(mlp, x: jax.Array, merged: MergedProjections) -> jax.Array:
    """The model's SwiGLU ``down(silu(gate(x)) * up(x))`` with gate/up as one GEMM."""
    dtype = jnp.dtype(mlp.down_proj.dtype)
    gate_up = _merged_linear(x, merged.gate_up, None, dtype)
    gate, up = jnp.split(gate_up, 2, axis=-1)
    return mlp.down_proj(jax.nn.silu(gate) * up)


def forward(model: CausalLM, input_ids: jax.Array, positions: jax.Array, cache,
            decode_attention: str = DENSE,
            merged: tuple[MergedProjections, ...] | None = None,
            prefill_attention: str = DENSE, slots: jax.Array | None = None
            ) -> tuple[jax.Array, object]:
    """Final-normed hidden states ``[B, T, D]`` and the updated cache (either layout).
    ``decode_attention``: ``dense`` / ``ragged`` / ``ragged_interpret`` for one-token calls on
    the head-major cache (see :func:`_attention`); ``merged``: :func:`merge_projections` of
    the model (head-major cache only), q/k/v and gate/up then run as one GEMM each;
    ``prefill_attention``: ``dense`` / ``flash`` / ``flash_interpret`` for multi-token calls on
    the head-major cache, ``flash_in_cache`` (/ ``_interpret``) with ``slots [B]``: the call's
    rows are those slots of the whole cache (see :func:`_attention`)."""
    if isinstance(cache, KVCache):
        if merged is not None:
            raise ValueError("merged projections need the head-major cache")
        out = model(input_ids, positions, cache, compute_logits=False)
        return out.hidden, out.cache
    x = model.embed(input_ids)
    cos, sin = rope_cos_sin(positions, inverse_frequencies(model.cfg))
    keys, values = [], []
    for i, layer in enumerate(model.layers):
        layer_merged = None if merged is None else merged[i]
        attn_out, ck, cv = _attention(layer.attn, layer.input_norm(x), cos, sin, positions,
                                      cache.keys[i], cache.values[i], decode_attention,
                                      layer_merged, prefill_attention, slots)
        x = x + attn_out
        normed = layer.post_attn_norm(x)
        x = x + (layer.mlp(normed) if layer_merged is None else
                 _mlp(layer.mlp, normed, layer_merged))
        keys.append(ck)
        values.append(cv)
    return model.final_norm(x), HeadMajorCache(tuple(keys), tuple(values))


def map_cache(fn, cache):
    """Apply ``fn`` to every per-layer array of a cache (either layout); same type back."""
    return type(cache)(keys=tuple(fn(k) for k in cache.keys),
                       values=tuple(fn(v) for v in cache.values))


__all__ = ["HeadMajorCache", "MergedProjections", "forward", "merge_projections", "new_cache",
           "map_cache", "DECODE_GEMM", "XLA_GEMM", "MERGED_GEMM", "MERGED_CUBLAS", "HEAD_MAJOR",
           "SEQ_MAJOR", "DENSE", "RAGGED", "RAGGED_INTERPRET", "FUSED", "FUSED_INTERPRET", "FLASH",
           "FLASH_INTERPRET", "FLASH_IN_CACHE", "FLASH_IN_CACHE_INTERPRET"]
