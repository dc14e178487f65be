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

import functools
from typing import NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from agentrl_jax.kernels.segment_attention import segment_causal_attention
from agentrl_jax.models.attention import chunked_causal_attention
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.output_tokens import restrict_logits
from agentrl_jax.models.sharded_attention import sharded_pallas_causal_attention
from agentrl_jax.models.rope import apply_rope, inverse_frequencies, rope_cos_sin
from agentrl_jax.sharding.activations import (constrain_attention_inputs, constrain_batch_sharded,
                                              current_mesh)


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
                 cache_kv: tuple[jax.Array, jax.Array] | None,
                 segment_ids: jax.Array | None = None
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
            out = causal_attention(q, k, v, attention_mask, segment_ids, cfg)
        else:
            if segment_ids is not None:
                raise ValueError("segment_ids are not supported with a KV cache")
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


def resolve_attention_impl(impl: str | None) -> str | None:
    """The cache-less attention implementation actually used: ``impl`` as configured, except
    ``None`` on a CPU backend, which becomes ``"chunked"`` (XLA's CPU attention materialises
    ``[B, H, T, T]`` scores; see ``attention.py``). The backend is the current activation
    mesh's platform, else JAX's default backend."""
    if impl is not None:
        return impl
    return "chunked" if _platform() == "cpu" else None


def _platform() -> str:
    """The current activation mesh's platform, else JAX's default backend."""
    mesh = current_mesh()
    return mesh.devices.flat[0].platform if mesh is not None else jax.default_backend()


def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array, attention_mask: jax.Array | None,
                     segment_ids: jax.Array | None, cfg: ModelConfig) -> jax.Array:
    """Cache-less causal attention ``q [B, T, H, Dh]``, ``k, v [B, T, K, Dh] -> [B, T, H, Dh]``.

    Token ``t`` attends to ``s <= t`` with ``attention_mask[b, s] != 0`` (if given) and
    ``segment_ids[b, s] == segment_ids[b, t]`` (if given). ``"chunked"``
    (:func:`resolve_attention_impl`): blockwise, never ``[T, T]``; otherwise
    ``jax.nn.dot_product_attention``: ``is_causal`` (cuDNN when configured) without masks, an
    explicit ``[B, 1, T, T]`` boolean mask (XLA) with them.
    """
    impl = resolve_attention_impl(cfg.attention_impl)
    if impl in ("pallas", "pallas_segments") and attention_mask is None:  # Triton (packed rows)
        kernel = segment_causal_attention if impl == "pallas_segments" else None
        return sharded_pallas_causal_attention(q, k, v, segment_ids,
                                               interpret=jax.default_backend() == "cpu",
                                               kernel=kernel)
    if impl in ("chunked", "pallas", "pallas_segments"):
        return chunked_causal_attention(q, k, v, segment_ids=segment_ids, kv_mask=attention_mask,
                                        block_size=cfg.attention_block_size)
    if attention_mask is None and segment_ids is None:
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=impl)
    t = q.shape[1]
    mask = jnp.tril(jnp.ones((t, t), jnp.bool_))[None, None]
    if attention_mask is not None:
        mask = mask & attention_mask[:, None, None, :].astype(jnp.bool_)
    if segment_ids is not None:
        mask = mask & (segment_ids[:, None, :, None] == segment_ids[:, None, None, :])
    return jax.nn.dot_product_attention(q, k, v, mask=mask)


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

    def __call__(self, x, cos, sin, positions, attention_mask, cache_kv, segment_ids=None):
        x = constrain_batch_sharded(x)
        attn_out, new_cache = self.attn(self.input_norm(x), cos, sin, positions, attention_mask,
                                        cache_kv, segment_ids)
        x = constrain_batch_sharded(x + attn_out)
        x = constrain_batch_sharded(x + self.mlp(self.post_attn_norm(x)))
        return x, new_cache


def _run_layer(layer: DecoderLayer, x, cos, sin, positions, attention_mask, cache_kv,
               segment_ids=None):
    return layer(x, cos, sin, positions, attention_mask, cache_kv, segment_ids)


_REMAT_BY_POLICY: dict[str | None, object] = {}


def _remat_layer_fn(policy: str | None):
    """A cache-less ``_run_layer`` whose layer runs under ``jax.checkpoint`` with the named
    ``jax.checkpoint_policies`` policy (``None``: save nothing but the inputs).

    The checkpointed function takes the layer's parameters (``nnx.split`` outside it), the
    residual stream and the rotary tables as arguments and closes over ``positions``, the
    attention mask and the segment ids. With those passed as arguments too (as ``nnx.remat``
    passes every argument), the Shardy partitioner lost the batch split of an FSDP mesh in the
    backward pass: every device recomputed and differentiated the whole micro-batch against
    hidden-sharded weights and all-reduced the partial sums (tests/test_fsdp_remat.py, 4
    devices: 24 all-reduces and dots over all ``R*T`` tokens, against 4 all-reduces and
    ``R*T/4``-token dots this way and without remat).
    """
    if policy not in _REMAT_BY_POLICY:
        saveable = None if policy is None else getattr(jax.checkpoint_policies, policy)

        def run(layer: DecoderLayer, x, cos, sin, positions, attention_mask, cache_kv,
                segment_ids=None):
            graphdef, state = nnx.split(layer)

            def apply(state, x, cos, sin):
                return _apply_layer(graphdef, state, x, cos, sin, positions, attention_mask,
                                    segment_ids)

            return jax.checkpoint(apply, policy=saveable)(state, x, cos, sin), cache_kv

        _REMAT_BY_POLICY[policy] = run
    return _REMAT_BY_POLICY[policy]


def _apply_layer(graphdef: nnx.GraphDef, state: nnx.State, x: jax.Array, cos: jax.Array,
                 sin: jax.Array, positions: jax.Array, attention_mask: jax.Array | None,
                 segment_ids: jax.Array | None) -> jax.Array:
    return nnx.merge(graphdef, state)(x, cos, sin, positions, attention_mask, None,
                                      segment_ids)[0]


def resolve_remat_impl(cfg: ModelConfig) -> str | None:
    """How the cache-less forward recomputes layer activations (``None``: no remat).

    ``"checkpoint"``: each layer under ``nnx.remat`` (``jax.checkpoint`` with
    ``cfg.remat_policy``) in an unrolled Python loop. ``"scan"``: the layers as one
    ``lax.scan`` over stacked layer parameters, the step under ``jax.checkpoint``
    (:meth:`CausalLM._scan_layers`). ``cfg.remat_impl`` decides; ``None`` picks ``"scan"`` on
    CPU and ``"checkpoint"`` elsewhere.

    Why not ``"checkpoint"`` on CPU: ``jax.checkpoint`` keeps its recomputation in the
    backward pass with an optimisation barrier over (saved inputs, cotangent); XLA:CPU removes
    those barriers (``cse_barrier_expander``) and its scheduler then runs every layer's
    recomputation, and every parameter-only or constant-only value (broadcast norm scales,
    zero-initialised loop buffers), early, so all layers' activations are live at once, as
    without remat (SmolLM2-135M, 8 x 2048 tokens, 4 layers: 19.5 GiB of temporaries with
    remat, 19.9 without; a custom VJP whose recomputation depends on the cotangent still left
    6.4 GiB at 30 layers, from hoisted parameter- and constant-only buffers). A loop body
    cannot be hoisted that way: with ``"scan"`` only the ``L`` layer inputs ``[B, T, D]``, the
    stacked parameters and one layer's activations are live (the whole 30-layer step on
    8 x 2048 tokens in one pass: 3.2 GiB).
    """
    if not cfg.remat:
        return None
    if cfg.remat_impl is not None:
        return cfg.remat_impl
    return "scan" if _platform() == "cpu" else "checkpoint"


def _layer_runner(cfg: ModelConfig, cached: bool):
    """The per-layer call of the unrolled layer loop (remat only matters without a cache)."""
    if resolve_remat_impl(cfg) == "checkpoint" and not cached:
        return _remat_layer_fn(cfg.remat_policy)
    return _run_layer


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
                 compute_logits: bool = True, segment_ids: jax.Array | None = None
                 ) -> ModelOutput:
        """Forward ``input_ids [B, T]`` at ``positions [B, T]`` (default ``0..T-1``).

        Without a cache, attention is causal within the call; ``attention_mask [B, T]`` (1 = real
        token) additionally hides padded keys, and ``segment_ids [B, T]`` int (packed rows)
        restricts each token to earlier-or-same tokens of its own segment (pass ``positions``
        restarting at 0 in each segment; segment id 0 may mark padding). With a cache, keys/values
        are written at ``positions`` and each query attends to cache slots ``<= its position``
        (``segment_ids`` not supported).
        """
        b, t = input_ids.shape
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        x = self.embed(input_ids)
        cos, sin = rope_cos_sin(positions, inverse_frequencies(self.cfg))
        new_keys, new_values = [], []
        if cache is None and resolve_remat_impl(self.cfg) == "scan":
            x = self._scan_layers(x, cos, sin, positions, attention_mask, segment_ids)
        else:
            run = _layer_runner(self.cfg, cached=cache is not None)
            for i, layer in enumerate(self.layers):
                cache_kv = None if cache is None else (cache.keys[i], cache.values[i])
                x, layer_cache = run(layer, x, cos, sin, positions, attention_mask, cache_kv,
                                     segment_ids)
                if layer_cache is not None:
                    new_keys.append(layer_cache[0])
                    new_values.append(layer_cache[1])
        hidden = self.final_norm(x)
        new_cache = None if cache is None else KVCache(tuple(new_keys), tuple(new_values))
        logits = self.logits(hidden) if compute_logits else None
        return ModelOutput(logits=logits, hidden=hidden, cache=new_cache)

    def _scan_layers(self, x: jax.Array, cos: jax.Array, sin: jax.Array, positions: jax.Array,
                     attention_mask: jax.Array | None, segment_ids: jax.Array | None
                     ) -> jax.Array:
        """The cache-less layer stack as one ``lax.scan`` over stacked layer parameters
        (``[L, ...]``, a copy made per call), each step under ``jax.checkpoint``: the backward
        loop recomputes layer ``i`` inside its own iteration, so only the ``L`` layer inputs
        ``[B, T, D]`` and one layer's activations are ever live."""
        graphdef = nnx.graphdef(self.layers[0])
        stacked = jax.tree.map(lambda *xs: jnp.stack(xs),
                               *[nnx.state(layer) for layer in self.layers])

        def body(h: jax.Array, state: nnx.State) -> tuple[jax.Array, None]:
            return _apply_layer(graphdef, state, h, cos, sin, positions, attention_mask,
                                segment_ids), None

        policy = (None if self.cfg.remat_policy is None
                  else getattr(jax.checkpoint_policies, self.cfg.remat_policy))
        body = jax.checkpoint(body, policy=policy, prevent_cse=False)
        x, _ = jax.lax.scan(body, x, stacked)
        return x

    def logits(self, hidden: jax.Array) -> jax.Array:
        """``hidden [..., D] -> logits [..., V]`` in float32 (restricted to
        ``cfg.output_token_ids`` when set: ``models/output_tokens.py``)."""
        if self.cfg.tie_word_embeddings:
            out = self.embed.attend(hidden)
        else:
            out = self.lm_head(hidden)
        return restrict_logits(out.astype(jnp.float32), self.cfg.output_token_ids)


def init_model(cfg: ModelConfig, seed: int = 0, mesh: jax.sharding.Mesh | None = None,
               rules=None, initialise_on: str = "auto") -> CausalLM:
    """A randomly initialised model (weights ~ N(0, 0.02), norms 1).

    Without ``mesh`` every parameter is created whole on the default device. With ``mesh``
    the parameters end up in their ``NamedSharding`` over it
    (``agentrl_jax.sharding.rules.state_shardings`` with ``rules``, default the learner's
    ``DEFAULT_RULES``) and no accelerator ever holds the whole model (a Qwen2.5-7B shape is
    30 GB of float32). ``initialise_on`` says where the random numbers are drawn:

    - ``"device"``: the initialiser runs under ``jax.jit`` with those ``out_shardings``, so each
      device computes only its own shard. Fast to run, but XLA's GPU compiler takes minutes
      over this one program of a few hundred random draws (the 7B shape: docs/PERFORMANCE.md,
      "Not run").
    - ``"host"``: the same jitted initialiser runs on the host CPU (it compiles in seconds
      there; the host holds the whole float32 model once), then each parameter is placed in its
      sharding with ``jax.make_array_from_callback``, every device receiving only its slice
      (multi-process runs too: each process places its own devices' slices).
    - ``"auto"`` (default): ``"host"`` when the mesh's devices are accelerators, else
      ``"device"``.

    The values are those of the unsharded call with the same ``seed``: the same ``nnx.Rngs``
    key stream draws the same random bits, and with ``jax_threefry_partitionable`` (the
    default) a sharded draw computes each shard's part of them. Bitwise equal to the same
    initialiser jitted without shardings on the same platform, whatever the mesh; within 2
    float32 ulps of the eager (``mesh=None``) call, whose ``normal(key) * 0.02`` XLA evaluates
    op by op instead of fused (tests/test_sharded_init.py checks both).
    """
    if initialise_on not in ("auto", "device", "host"):
        raise ValueError(f"initialise_on must be 'auto', 'device' or 'host', got {initialise_on!r}")
    if mesh is None:
        return CausalLM(cfg, rngs=nnx.Rngs(seed))
    from agentrl_jax.sharding.rules import DEFAULT_RULES, state_shardings

    graphdef, abstract_state = nnx.split(abstract_model(cfg))
    shardings = state_shardings(abstract_state, mesh, DEFAULT_RULES if rules is None else rules)

    def init() -> nnx.State:
        return nnx.split(CausalLM(cfg, rngs=nnx.Rngs(seed)))[1]

    if initialise_on == "auto":
        initialise_on = "device" if mesh.devices.flat[0].platform == "cpu" else "host"
    if initialise_on == "device":
        return nnx.merge(graphdef, jax.jit(init, out_shardings=shardings)())
    with jax.default_device(jax.local_devices(backend="cpu")[0]):
        host_state = jax.jit(init)()
    host_leaves, treedef = jax.tree.flatten(host_state)
    sharding_leaves = treedef.flatten_up_to(shardings)
    placed = []
    for index, sharding in enumerate(sharding_leaves):
        host = np.asarray(host_leaves[index])
        host_leaves[index] = None  # free each host copy once it is placed
        placed.append(jax.make_array_from_callback(host.shape, sharding, lambda idx, h=host: h[idx]))
    return nnx.merge(graphdef, jax.tree.unflatten(treedef, placed))


def _trace_abstract(cfg: ModelConfig) -> CausalLM:
    return nnx.eval_shape(lambda: CausalLM(cfg, rngs=nnx.Rngs(0)))


@functools.lru_cache(maxsize=8)
def _abstract_split(cfg: ModelConfig) -> tuple[nnx.GraphDef, nnx.State]:
    """``nnx.split`` of the abstract ``CausalLM(cfg)``: tracing the initialisers of every layer
    is Python and JAX tracing (docs/PERFORMANCE.md, "The abstract model traced once per
    config"), and a run start asks for it twice (the weights' load, the engine; a random-init
    policy with a mesh a third time), so it is traced once per config."""
    return nnx.split(_trace_abstract(cfg))


def abstract_model(cfg: ModelConfig) -> CausalLM:
    """A model whose parameters are ``jax.ShapeDtypeStruct``s (nothing allocated); a fresh copy
    on every call (the traced structure is cached per config, ``_abstract_split``; a config
    with an unhashable field, e.g. a list inside ``rope_scaling``, is traced every time)."""
    try:
        hash(cfg)
    except TypeError:
        return _trace_abstract(cfg)
    graphdef, state = _abstract_split(cfg)
    return nnx.merge(graphdef, state, copy=True)


def num_parameters(model: nnx.Module) -> int:
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


__all__ = ["CausalLM", "KVCache", "ModelOutput", "init_model", "abstract_model", "num_parameters",
           "causal_attention", "resolve_attention_impl", "resolve_remat_impl"]
