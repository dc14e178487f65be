"""A Flax (nnx) decoder for the Llama / Qwen2 / Qwen3 / Mistral / SmolLM2 family.

Shapes: ``B`` batch, ``T`` tokens in this call, ``S`` KV-cache length, ``D`` hidden size,
``H`` query heads, ``K`` KV heads (GQA), ``Dh`` head dim, ``V`` vocabulary.

Parameter names (used by the sharding rules and the checkpoint mapping)::

    embed/embedding                          [V, D]
    layers/i/attn/{q,k,v}_proj/kernel        [D, H*Dh] / [D, K*Dh]   (+ bias for Qwen2)
    layers/i/attn/o_proj/kernel              [H*Dh, D]
    layers/i/attn/{q,k}_norm/scale           [Dh]                    (Qwen3)
    layers/i/mlp/{gate,up}_proj/kernel       [D, F]
    layers/i/mlp/down_proj/kernel            [F, D]
    layers/i/{input,post_attn}_norm/scale    [D]
    final_norm/scale                         [D]
    lm_head/kernel                           [D, V]                  (absent when tied)

KV cache: the cache row of a sequence is indexed by absolute position; a call writes the new
keys/values at ``positions`` (positions >= S are dropped, which is how padding is written
nowhere) and a query at position ``p`` attends to cache slots ``0..p``.
"""

from __future__ import annotations

from typing import NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.rope import apply_rope, inverse_frequencies, rope_cos_sin
from agentrl_jax.sharding.activations import constrain_attention_inputs, constrain_batch_sharded


@flax.struct.dataclass
class KVCache:
    """Per-layer key/value caches, each ``[B, S, K, Dh]``."""

    keys: tuple[jax.Array, ...]
    values: tuple[jax.Array, ...]

    @property
    def batch_size(self) -> int:
        return self.keys[0].shape[0]

    @property
    def max_length(self) -> int:
        return self.keys[0].shape[1]

    @classmethod
    def zeros(cls, config: ModelConfig, batch_size: int, max_length: int,
              dtype: jnp.dtype | None = None) -> "KVCache":
        dtype = dtype or jnp.dtype(config.dtype)
        shape = (batch_size, max_length, config.num_kv_heads, config.head_dim)
        return cls(keys=tuple(jnp.zeros(shape, dtype) for _ in range(config.num_layers)),
                   values=tuple(jnp.zeros(shape, dtype) for _ in range(config.num_layers)))


class ModelOutput(NamedTuple):
    logits: jax.Array | None  # [B, T, V] float32
    hidden: jax.Array  # [B, T, D] final-normed hidden states (compute dtype)
    cache: KVCache | None


class RMSNorm(nnx.Module):
    """``x / sqrt(mean(x^2) + eps) * scale`` computed in float32, as transformers does."""

    def __init__(self, dim: int, eps: float, param_dtype: jnp.dtype):
        self.scale = nnx.Param(jnp.ones((dim,), param_dtype))
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return self.scale[...].astype(x.dtype) * normed.astype(x.dtype)


def _linear(cfg: ModelConfig, d_in: int, d_out: int, bias: bool, rngs: nnx.Rngs) -> nnx.Linear:
    return nnx.Linear(d_in, d_out, use_bias=bias, dtype=jnp.dtype(cfg.dtype),
                      param_dtype=jnp.dtype(cfg.param_dtype),
                      kernel_init=nnx.initializers.normal(0.02), rngs=rngs)


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        d, h, k, hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = _linear(cfg, d, h * hd, cfg.attention_bias, rngs)
        self.k_proj = _linear(cfg, d, k * hd, cfg.attention_bias, rngs)
        self.v_proj = _linear(cfg, d, k * hd, cfg.attention_bias, rngs)
        self.o_proj = _linear(cfg, h * hd, d, False, rngs)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(hd, cfg.rms_norm_eps, jnp.dtype(cfg.param_dtype))
            self.k_norm = RMSNorm(hd, cfg.rms_norm_eps, jnp.dtype(cfg.param_dtype))
        self.cfg = cfg

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array, positions: jax.Array,
                 attention_mask: jax.Array | None,
                 cache_kv: tuple[jax.Array, jax.Array] | None
                 ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
        cfg = self.cfg
        b, t, _ = x.shape
        q = self.q_proj(x).reshape(b, t, cfg.num_heads, cfg.head_dim)
        k = self.k_proj(x).reshape(b, t, cfg.num_kv_heads, cfg.head_dim)
        v = self.v_proj(x).reshape(b, t, cfg.num_kv_heads, cfg.head_dim)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        new_cache = None
        if cache_kv is None:
            q, k, v = constrain_attention_inputs(q, k, v)
            if attention_mask is None:
                out = jax.nn.dot_product_attention(q, k, v, is_causal=True,
                                                   implementation=cfg.attention_impl)
            else:
                causal = jnp.tril(jnp.ones((t, t), jnp.bool_))
                mask = causal[None, None] & attention_mask[:, None, None, :].astype(jnp.bool_)
                out = jax.nn.dot_product_attention(q, k, v, mask=mask)
        else:
            cache_k, cache_v = cache_kv
            rows = jnp.arange(b)[:, None]
            cache_k = cache_k.at[rows, positions].set(k.astype(cache_k.dtype), mode="drop")
            cache_v = cache_v.at[rows, positions].set(v.astype(cache_v.dtype), mode="drop")
            slots = jnp.arange(cache_k.shape[1])
            mask = slots[None, None, None, :] <= positions[:, None, :, None]
            out = jax.nn.dot_product_attention(q, cache_k.astype(q.dtype), cache_v.astype(q.dtype),
                                               mask=mask)
            new_cache = (cache_k, cache_v)
        return self.o_proj(out.reshape(b, t, cfg.num_heads * cfg.head_dim)), new_cache


class MLP(nnx.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        self.gate_proj = _linear(cfg, cfg.hidden_size, cfg.intermediate_size, False, rngs)
        self.up_proj = _linear(cfg, cfg.hidden_size, cfg.intermediate_size, False, rngs)
        self.down_proj = _linear(cfg, cfg.intermediate_size, cfg.hidden_size, False, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = constrain_batch_sharded(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x),
                                    tensor_last=True)
        return self.down_proj(h)


class DecoderLayer(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        pdt = jnp.dtype(cfg.param_dtype)
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, pdt)
        self.attn = Attention(cfg, rngs)
        self.post_attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, pdt)
        self.mlp = MLP(cfg, rngs)

    def __call__(self, x, cos, sin, positions, attention_mask, cache_kv):
        x = constrain_batch_sharded(x)
        attn_out, new_cache = self.attn(self.input_norm(x), cos, sin, positions, attention_mask,
                                        cache_kv)
        x = constrain_batch_sharded(x + attn_out)
        x = constrain_batch_sharded(x + self.mlp(self.post_attn_norm(x)))
        return x, new_cache


def _run_layer(layer: DecoderLayer, x, cos, sin, positions, attention_mask, cache_kv):
    return layer(x, cos, sin, positions, attention_mask, cache_kv)


_run_layer_remat = nnx.remat(_run_layer)
_REMAT_BY_POLICY: dict[str, object] = {}


def _remat_layer_fn(policy: str | None):
    """``_run_layer`` under ``nnx.remat`` with the named ``jax.checkpoint_policies`` policy."""
    if policy is None:
        return _run_layer_remat
    if policy not in _REMAT_BY_POLICY:
        _REMAT_BY_POLICY[policy] = nnx.remat(_run_layer,
                                             policy=getattr(jax.checkpoint_policies, policy))
    return _REMAT_BY_POLICY[policy]


class CausalLM(nnx.Module):
    """Decoder-only LM. ``__call__`` returns logits (float32), final hidden states and cache."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embed = nnx.Embed(cfg.vocab_size, cfg.hidden_size, dtype=jnp.dtype(cfg.dtype),
                               param_dtype=jnp.dtype(cfg.param_dtype),
                               embedding_init=nnx.initializers.normal(0.02), rngs=rngs)
        self.layers = nnx.List([DecoderLayer(cfg, rngs) for _ in range(cfg.num_layers)])
        self.final_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, jnp.dtype(cfg.param_dtype))
        if not cfg.tie_word_embeddings:
            self.lm_head = _linear(cfg, cfg.hidden_size, cfg.vocab_size, False, rngs)

    def __call__(self, input_ids: jax.Array, positions: jax.Array | None = None,
                 cache: KVCache | None = None, attention_mask: jax.Array | None = None,
                 compute_logits: bool = True) -> ModelOutput:
        """Forward ``input_ids [B, T]`` at ``positions [B, T]`` (default ``0..T-1``).

        Without a cache, attention is causal within the call; ``attention_mask [B, T]`` (1 = real
        token) additionally hides padded keys. With a cache, keys/values are written at
        ``positions`` and each query attends to cache slots ``<= its position``.
        """
        b, t = input_ids.shape
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        x = self.embed(input_ids)
        cos, sin = rope_cos_sin(positions, inverse_frequencies(self.cfg))
        new_keys, new_values = [], []
        run = _remat_layer_fn(self.cfg.remat_policy) if self.cfg.remat else _run_layer
        for i, layer in enumerate(self.layers):
            cache_kv = None if cache is None else (cache.keys[i], cache.values[i])
            x, layer_cache = run(layer, x, cos, sin, positions, attention_mask, cache_kv)
            if layer_cache is not None:
                new_keys.append(layer_cache[0])
                new_values.append(layer_cache[1])
        hidden = self.final_norm(x)
        new_cache = None if cache is None else KVCache(tuple(new_keys), tuple(new_values))
        logits = self.logits(hidden) if compute_logits else None
        return ModelOutput(logits=logits, hidden=hidden, cache=new_cache)

    def logits(self, hidden: jax.Array) -> jax.Array:
        """``hidden [..., D] -> logits [..., V]`` in float32."""
        if self.cfg.tie_word_embeddings:
            out = self.embed.attend(hidden)
        else:
            out = self.lm_head(hidden)
        return out.astype(jnp.float32)


def init_model(cfg: ModelConfig, seed: int = 0) -> CausalLM:
    """A randomly initialised model (weights ~ N(0, 0.02), norms 1)."""
    return CausalLM(cfg, rngs=nnx.Rngs(seed))


def abstract_model(cfg: ModelConfig) -> CausalLM:
    """A model whose parameters are ``jax.ShapeDtypeStruct``s (nothing allocated)."""
    return nnx.eval_shape(lambda: CausalLM(cfg, rngs=nnx.Rngs(0)))


def num_parameters(model: nnx.Module) -> int:
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


__all__ = ["CausalLM", "KVCache", "ModelOutput", "init_model", "abstract_model", "num_parameters"]
