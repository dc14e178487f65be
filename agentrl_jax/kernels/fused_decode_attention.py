"""Decode attention with RoPE and the cache write in one kernel per layer.

The unfused decode step slices q / k / v out of the merged projection, rotates q and k (RoPE),
writes each layer's new key and value into the head-major cache ``[B, K, S, Dh]`` with two XLA
scatters and then runs the ragged attention kernel (``decode_attention.py``): several kernel
launches per layer, most of them tiny (256 slots x one ``[K, Dh]`` row each, launch-bound on
GPUs). Here one Pallas (Triton) kernel per layer takes the projection's output
``qkv [B, H + 2K, Dh]`` as it is; program ``(r, j)`` (``r`` = slot x KV head, ``j`` = split of
the row)

* rotates its ``G = H / K`` query heads and its new key (rotate-half RoPE in float32 on the two
  halves of each head vector; skipped when the caller rotated them, e.g. after q/k norms),
* attends over the cached keys ``[split start, min(split end, p_r))`` (only whole valid
  ``block_k`` blocks are read) plus the new key (held in registers, not re-read),
* and the program whose split holds position ``p_r`` stores the new key / value at ``p_r``
  into the cache, which is the kernel's output aliased to its input
  (``input_output_aliases``: updated in place inside the engine's jitted decode loop, where the
  cache is donated).

With one split (rows of ``<= 1024`` positions) the output is normalised in the kernel; with
several, each split returns its partial ``(o, l, m)`` and XLA combines them (flash-decoding).
A slot at position ``p_r >= S`` is idle: nothing is written and its output is 0 -- the same
convention as the unfused path (a scatter with ``mode="drop"`` and length 0).

``out[b, h] = sum_{s <= p_b} softmax_s(q[b,h] . k[b,h//G,s] / sqrt(Dh)) v[b,h//G,s]`` with
``k[b, :, p_b] = k_new[b]``, ``v[b, :, p_b] = v_new[b]`` (q and k_new rotated); scores and
softmax in float32. ``interpret=True`` runs the kernel in the Pallas interpreter (CPU tests).
Measured with the one-pass sampler on the Qwen2.5-1.5B and SmolLM2-135M decode steps at batch
256: docs/PERFORMANCE.md, "Decode step: fused attention + cache write, one-pass sampler".
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from agentrl_jax.kernels.decode_attention import ragged_tiling

BLOCK_H = 16  # query heads per program, padded (Triton's smallest dot tile)
_NEG = 0.7 * float(jnp.finfo(jnp.float32).min)  # "minus infinity" that keeps exp() finite


def unsupported_shape(num_heads: int, num_kv_heads: int, head_dim: int) -> str | None:
    """Why the kernel's tiles do not cover this attention shape, or None when they do: at most
    :data:`BLOCK_H` query heads per KV head, a head dim divisible by 32 (each half feeds a dot
    of at least 16)."""
    groups = num_heads // num_kv_heads
    if groups > BLOCK_H or head_dim % 32:
        return (f"fused decode attention needs <= {BLOCK_H} query heads per KV head and a head "
                f"dim divisible by 32 (got {groups}, {head_dim})")
    return None


def _rotate(x1: jax.Array, x2: jax.Array, cos: jax.Array, sin: jax.Array
            ) -> tuple[jax.Array, jax.Array]:
    """Rotate-half RoPE on the two halves of the last axis (float32):
    ``(x1 cos - x2 sin, x2 cos + x1 sin)``."""
    return x1 * cos - x2 * sin, x2 * cos + x1 * sin


def _kernel(qkv_ref, cos_ref, sin_ref, pos_ref, k_ref, v_ref, o_ref, l_ref, m_ref,
            k_out_ref, v_out_ref, *, sm_scale: float, block_k: int, groups: int,
            num_heads: int, kv_heads: int, split_len: int, rope: bool, normalize: bool):
    """One (row, split) program; row ``r`` = slot ``r // K``, KV head ``r % K``. Refs: the
    slot's projections ``qkv [H + 2K, Dh]`` (q heads, then k, then v), its RoPE ``cos / sin
    [Dh / 2]`` (float32), position ``[]``, the row's cache split ``[split_len, Dh]`` (in, and
    aliased out), outputs o ``[BLOCK_H, Dh]``, l / m ``[BLOCK_H]`` (float32). Every head
    vector is handled as its two halves (rotate-half RoPE needs them apart)."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    kv_head = pl.program_id(0) % kv_heads
    split = pl.program_id(1)
    half = qkv_ref.shape[-1] // 2
    first, second = pl.ds(0, half), pl.ds(half, half)
    heads = pl.ds(kv_head * groups, BLOCK_H)
    head_mask = (jnp.arange(BLOCK_H) < groups)[:, None]
    q1 = plgpu.load(qkv_ref.at[heads, first], mask=head_mask, other=0.0)
    q2 = plgpu.load(qkv_ref.at[heads, second], mask=head_mask, other=0.0)
    k_row, v_row = num_heads + kv_head, num_heads + kv_heads + kv_head
    k1 = qkv_ref[k_row, first].astype(jnp.float32)
    k2 = qkv_ref[k_row, second].astype(jnp.float32)
    if rope:
        cos, sin = cos_ref[...], sin_ref[...]
        r1, r2 = _rotate(q1.astype(jnp.float32), q2.astype(jnp.float32), cos[None], sin[None])
        q1, q2 = r1.astype(q1.dtype), r2.astype(q2.dtype)
        k1, k2 = _rotate(k1, k2, cos, sin)
    k1 = k1.astype(k_out_ref.dtype).astype(jnp.float32)  # the key as the cache holds it
    k2 = k2.astype(k_out_ref.dtype).astype(jnp.float32)
    v_new = qkv_ref[v_row, :]

    pos = pos_ref[()]
    start = split * split_len
    end = start + split_len
    # cached keys of this split: [start, min(end, pos)); an idle row has pos = -1: none
    valid_end = jnp.minimum(end, pos)
    offsets = jnp.arange(block_k)

    def body(i, carry):
        o, m, l = carry
        window = pl.ds(i * block_k, block_k)
        c1 = k_ref[window, first].astype(q1.dtype)
        c2 = k_ref[window, second].astype(q1.dtype)
        s = (plgpu.dot(q1, c1.T) + plgpu.dot(q2, c2.T)).astype(jnp.float32) * sm_scale
        keep = (start + i * block_k + offsets) < valid_end
        s = jnp.where(keep[None, :], s, _NEG)  # [BLOCK_H, block_k]
        m_next = jnp.maximum(m, s.max(axis=-1))
        corr = jnp.exp(m - m_next)
        p = jnp.exp(s - m_next[:, None])
        v = v_ref[window, :]
        o = corr[:, None] * o + plgpu.dot(p.astype(v.dtype), v).astype(jnp.float32)
        return o, m_next, corr * l + p.sum(axis=-1)

    o = jnp.zeros((BLOCK_H, 2 * half), jnp.float32)
    m = jnp.full((BLOCK_H,), _NEG, jnp.float32)
    l = jnp.zeros((BLOCK_H,), jnp.float32)
    n_blocks = jnp.maximum(valid_end - start + block_k - 1, 0) // block_k
    o, m, l = lax.fori_loop(0, n_blocks, body, (o, m, l))

    # the step's own key / value, from registers; only the split that holds `pos` adds it
    holds_new = (pos >= start) & (pos < end)
    s_new = (jnp.sum(q1.astype(jnp.float32) * k1[None, :], axis=-1)
             + jnp.sum(q2.astype(jnp.float32) * k2[None, :], axis=-1))
    s_new = jnp.where(holds_new, s_new * sm_scale, _NEG)
    m_next = jnp.maximum(m, s_new)
    corr = jnp.exp(m - m_next)
    p_new = jnp.where(holds_new, jnp.exp(s_new - m_next), 0.0)
    o = corr[:, None] * o + p_new[:, None] * v_new.astype(jnp.float32)[None, :]
    l = corr * l + p_new
    m = m_next

    at = pl.ds(jnp.where(holds_new, pos - start, 0), 1)
    write = jnp.full((1, half), holds_new)
    plgpu.store(k_out_ref.at[at, first], k1.astype(k_out_ref.dtype)[None, :], mask=write)
    plgpu.store(k_out_ref.at[at, second], k2.astype(k_out_ref.dtype)[None, :], mask=write)
    plgpu.store(v_out_ref.at[at, :], v_new.astype(v_out_ref.dtype)[None, :],
                mask=jnp.full((1, 2 * half), holds_new))
    if normalize:
        o = jnp.where(l[:, None] > 0.0, o / jnp.maximum(l, 1e-30)[:, None], 0.0)
    plgpu.store(o_ref.at[pl.ds(0, BLOCK_H), :], o.astype(o_ref.dtype), mask=head_mask)
    plgpu.store(l_ref.at[pl.ds(0, BLOCK_H)], l, mask=head_mask[:, 0])
    plgpu.store(m_ref.at[pl.ds(0, BLOCK_H)], m, mask=head_mask[:, 0])


def fused_decode_attention(qkv: jax.Array, cache_k: jax.Array, cache_v: jax.Array,
                           positions: jax.Array, num_heads: int,
                           rope: tuple[jax.Array, jax.Array] | None = None,
                           interpret: bool = False
                           ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One decode step's attention with the cache write.

    ``qkv [B, H + 2K, Dh]``: each slot's query heads, then its new keys, then its new values
    (the merged q/k/v projection's output as it is: no slicing copies); ``cache_k / cache_v
    [B, K, S, Dh]``; ``positions [B]`` (int); ``rope``: ``(cos, sin) [B, Dh]`` (float32, the
    model's ``rope_cos_sin`` at ``positions``) to rotate q and k in the kernel, or None when
    they are rotated already (e.g. after q/k norms). Returns ``(out [B, H, Dh], cache_k,
    cache_v)``: the new (rotated) keys and values written at ``positions`` (rows at ``>= S``
    untouched, output 0), each query attending to its row's positions ``0..p_b``. The caches
    are updated in place when the caller donates them (the engine's decode loop does).

    Long rows (``> 1024`` positions) are cut into the splits of ``ragged_tiling`` whatever the
    number of rows: the grid is fixed at compile time over every slot, and in a rollout's tail
    a few long rows would otherwise each be read by one program."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    b, heads_all, dh = qkv.shape
    kh, s = cache_k.shape[1], cache_k.shape[2]
    g = num_heads // kh
    if heads_all != num_heads + 2 * kh or num_heads % kh:
        raise ValueError(f"qkv must hold {num_heads} query heads and {kh} key and value heads "
                         f"(got {heads_all} heads)")
    why = unsupported_shape(num_heads, kh, dh)
    if why is not None:
        raise ValueError(why)
    tiling = ragged_tiling(s)
    if tiling is None:
        raise ValueError(f"fused decode attention needs a cache length divisible by 16, got {s}")
    splits, split_len = tiling.k_splits, s // tiling.k_splits
    rows, half = b * kh, dh // 2
    # an idle row (position >= S) reads and writes nothing: position -1
    pos = jnp.where(positions < s, positions, -1).astype(jnp.int32)
    if rope is None:
        cos = sin = jnp.zeros((b, half), jnp.float32)  # unused
    else:
        cos, sin = (x[:, :half].astype(jnp.float32) for x in rope)
    normalize = splits == 1
    kernel = functools.partial(
        _kernel, sm_scale=dh ** -0.5, block_k=tiling.block_k, groups=g, num_heads=num_heads,
        kv_heads=kh, split_len=split_len, rope=rope is not None, normalize=normalize)
    slot = lambda r, j: r // kh  # noqa: E731  (a row's slot)
    cache_spec = pl.BlockSpec((None, None, split_len, dh), lambda r, j: (r, j, 0, 0))
    out_dtype = qkv.dtype if normalize else jnp.float32
    o, l, m, new_k, new_v = pl.pallas_call(
        kernel,
        grid=(rows, splits),
        in_specs=[
            pl.BlockSpec((None, heads_all, dh), lambda r, j: (slot(r, j), 0, 0)),
            pl.BlockSpec((None, half), lambda r, j: (slot(r, j), 0)),
            pl.BlockSpec((None, half), lambda r, j: (slot(r, j), 0)),
            pl.BlockSpec((None,), lambda r, j: (slot(r, j),)),
            cache_spec,
            cache_spec,
        ],
        out_specs=[
            pl.BlockSpec((None, None, BLOCK_H, dh), lambda r, j: (r, j, 0, 0)),
            pl.BlockSpec((None, None, BLOCK_H), lambda r, j: (r, j, 0)),
            pl.BlockSpec((None, None, BLOCK_H), lambda r, j: (r, j, 0)),
            cache_spec,
            cache_spec,
        ],
        out_shape=[
            jax.ShapeDtypeStruct((rows, splits, g, dh), out_dtype),
            jax.ShapeDtypeStruct((rows, splits, g), jnp.float32),
            jax.ShapeDtypeStruct((rows, splits, g), jnp.float32),
            jax.ShapeDtypeStruct((rows, splits, split_len, dh), cache_k.dtype),
            jax.ShapeDtypeStruct((rows, splits, split_len, dh), cache_v.dtype),
        ],
        input_output_aliases={4: 3, 5: 4},
        compiler_params=plgpu.CompilerParams(num_warps=tiling.num_warps,
                                             num_stages=tiling.num_stages),
        interpret=interpret,
        name="fused_decode_attention",
    )(qkv, cos, sin, pos, cache_k.reshape(rows, splits, split_len, dh),
      cache_v.reshape(rows, splits, split_len, dh))
    if normalize:
        out = o[:, 0]
    else:  # flash-decoding: combine the splits' partial sums
        m_all = m.max(axis=1, keepdims=True)
        scale = jnp.exp(m - m_all)  # [rows, splits, g]
        l_all = (l * scale).sum(axis=1)
        o_all = (o * scale[..., None]).sum(axis=1)
        out = jnp.where(l_all[..., None] > 0.0, o_all / jnp.maximum(l_all, 1e-30)[..., None],
                        0.0)
    return (out.reshape(b, num_heads, dh).astype(qkv.dtype), new_k.reshape(cache_k.shape),
            new_v.reshape(cache_v.shape))


__all__ = ["fused_decode_attention", "unsupported_shape", "BLOCK_H"]
