"""Packed-row causal flash attention that skips the blocks between packed sequences (Pallas
Triton kernels for NVIDIA GPUs; ``interpret=True`` runs them on CPU for tests).

A packed row (``learner/packing.py``) holds several trajectories one after another. JAX's
Pallas ``mha`` (``kernels/flash_attention.py``) computes every block on or below the diagonal
and masks the pairs of different sequences afterwards; with ~3 sequences of ~1,000 tokens in a
3,072-token row most of those blocks pair tokens that never attend to each other (that kernel's
share of the learner's update: docs/PERFORMANCE.md). Here every query
block starts its key loop at the first block of the earliest sequence it holds, and every key
block stops its query loop after the last block of the latest sequence it holds:

    kv_lo[b, i] = run_start[b, i * block] // block   (forward, dq)
    q_hi[b, j]  = ceil(run_end[b, (j + 1) * block - 1] / block)   (dk, dv)

``run_start`` / ``run_end`` bound the run of equal segment ids around each token, so each
segment must be one contiguous run (packing lays them out so; padding, id 0, is one run at the
row's end). Inside the kept blocks token ``t`` attends to ``s <= t`` with ``segment_ids[s] ==
segment_ids[t]``: the function of ``attention.chunked_causal_attention`` with ``segment_ids``.

Shapes: ``q [B, T, H, Dh]``, ``k, v [B, T, K, Dh]`` with ``H = K * G`` (GQA without repeating
the keys: query head ``h`` reads key head ``h // G``), ``segment_ids [B, T]`` int, ``T`` a
multiple of the block (64). Forward and backward are FlashAttention-2 style: the forward keeps
the row's log-sum-exp ``lse [B, H, T]``; the backward recomputes the probabilities block by
block (a dq pass over key blocks, a dk / dv pass over query blocks; dk / dv per query head,
summed over each group of ``G`` after the kernel). Dots take the inputs' dtype (float32: TF32
on GPUs, as the library kernel); softmax and accumulators are float32.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

BLOCK = 64
_NEG = 0.7 * float(jnp.finfo(jnp.float32).min)  # "minus infinity" that keeps exp() finite


def run_bounds(segment_ids: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(run_start, run_end) [B, T]`` int32: the first index of the run of equal ids holding
    each token, and one past its last index."""
    b, t = segment_ids.shape
    idx = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    new_run = jnp.concatenate([jnp.ones((b, 1), bool),
                               segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1)
    start = lax.cummax(jnp.where(new_run, idx, 0), axis=1)
    ends_here = jnp.concatenate([segment_ids[:, 1:] != segment_ids[:, :-1],
                                 jnp.ones((b, 1), bool)], axis=1)
    end = lax.cummin(jnp.where(ends_here, idx + 1, t), axis=1, reverse=True)
    return start, end


def block_bounds(segment_ids: jax.Array, block: int = BLOCK) -> tuple[jax.Array, jax.Array]:
    """``(kv_lo [B, T / block], q_hi [B, T / block])`` int32: the first key block of each query
    block and one past the last query block of each key block (module docstring)."""
    start, end = run_bounds(segment_ids)
    kv_lo = start[:, ::block] // block
    q_hi = (end[:, block - 1::block] + block - 1) // block
    return kv_lo.astype(jnp.int32), q_hi.astype(jnp.int32)


def _scores(q, k, q_idx, k_idx, q_seg, k_seg, sm_scale):
    """Scaled scores ``[bq, bk]`` (float32) and the causal same-segment mask."""
    from jax.experimental.pallas import triton as plgpu

    s = plgpu.dot(q, k.T).astype(jnp.float32) * sm_scale
    keep = (q_idx[:, None] >= k_idx[None, :]) & (q_seg[:, None] == k_seg[None, :])
    return s, keep


def _fwd_kernel(q_ref, k_ref, v_ref, seg_ref, lo_ref, o_ref, lse_ref, *, sm_scale, block):
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    i = pl.program_id(2)
    rows = pl.ds(i * block, block)
    q = q_ref[...]
    q_idx = i * block + jnp.arange(block)
    q_seg = seg_ref[rows]

    def body(j, carry):
        o, m, l = carry
        cols = pl.ds(j * block, block)
        s, keep = _scores(q, k_ref[cols, :], q_idx, j * block + jnp.arange(block), q_seg,
                          seg_ref[cols], sm_scale)
        s = jnp.where(keep, s, _NEG)
        m_next = jnp.maximum(m, s.max(axis=-1))
        p = jnp.where(keep, jnp.exp(s - m_next[:, None]), 0.0)
        corr = jnp.exp(m - m_next)
        v = v_ref[cols, :]
        o = corr[:, None] * o + plgpu.dot(p.astype(v.dtype), v).astype(jnp.float32)
        return o, m_next, corr * l + p.sum(axis=-1)

    o = jnp.zeros((block, q.shape[-1]), jnp.float32)
    m = jnp.full((block,), _NEG, jnp.float32)
    l = jnp.zeros((block,), jnp.float32)
    o, m, l = lax.fori_loop(lo_ref[()], i + 1, body, (o, m, l))
    l = jnp.maximum(l, 1e-30)  # every token attends to itself: l > 0
    o_ref[...] = (o / l[:, None]).astype(o_ref.dtype)
    lse_ref[...] = m + jnp.log(l)


def _dq_kernel(q_ref, k_ref, v_ref, seg_ref, lo_ref, do_ref, lse_ref, delta_ref, dq_ref, *,
               sm_scale, block):
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    i = pl.program_id(2)
    rows = pl.ds(i * block, block)
    q, do = q_ref[...], do_ref[...]
    lse, delta = lse_ref[...], delta_ref[...]
    q_idx = i * block + jnp.arange(block)
    q_seg = seg_ref[rows]

    def body(j, dq):
        cols = pl.ds(j * block, block)
        k, v = k_ref[cols, :], v_ref[cols, :]
        s, keep = _scores(q, k, q_idx, j * block + jnp.arange(block), q_seg, seg_ref[cols],
                          sm_scale)
        p = jnp.where(keep, jnp.exp(s - lse[:, None]), 0.0)
        dp = plgpu.dot(do, v.T).astype(jnp.float32)
        ds = p * (dp - delta[:, None])
        return dq + plgpu.dot(ds.astype(k.dtype), k).astype(jnp.float32)

    dq = lax.fori_loop(lo_ref[()], i + 1, body, jnp.zeros(q.shape, jnp.float32))
    dq_ref[...] = (dq * sm_scale).astype(dq_ref.dtype)


def _dkv_kernel(q_ref, k_ref, v_ref, seg_ref, hi_ref, do_ref, lse_ref, delta_ref, dk_ref,
                dv_ref, *, sm_scale, block):
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    j = pl.program_id(2)
    cols = pl.ds(j * block, block)
    k, v = k_ref[...], v_ref[...]
    k_idx = j * block + jnp.arange(block)
    k_seg = seg_ref[cols]

    def body(i, carry):
        dk, dv = carry
        rows = pl.ds(i * block, block)
        q, do = q_ref[rows, :], do_ref[rows, :]
        s, keep = _scores(q, k, i * block + jnp.arange(block), k_idx, seg_ref[rows], k_seg,
                          sm_scale)
        p = jnp.where(keep, jnp.exp(s - lse_ref[rows][:, None]), 0.0)  # [bq, bk]
        dv = dv + plgpu.dot(p.astype(do.dtype).T, do).astype(jnp.float32)
        dp = plgpu.dot(do, v.T).astype(jnp.float32)
        ds = p * (dp - delta_ref[rows][:, None])
        dk = dk + plgpu.dot(ds.astype(q.dtype).T, q).astype(jnp.float32)
        return dk, dv

    zeros = jnp.zeros(k.shape, jnp.float32)
    dk, dv = lax.fori_loop(j, hi_ref[()], body, (zeros, zeros))
    dk_ref[...] = (dk * sm_scale).astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


def _call(kernel, grid, in_specs, out_specs, out_shape, interpret, *args):
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    return pl.pallas_call(kernel, grid=grid, in_specs=in_specs, out_specs=out_specs,
                          out_shape=out_shape, interpret=interpret,
                          compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=2)
                          )(*args)


def _specs(b, t, h, kh, d, block):
    """BlockSpecs over the grid ``(B, H, T / block)``: a block of query-side rows, a whole row
    of keys / values (the head's KV head), the row's segment ids, a per-block scalar."""
    from jax.experimental import pallas as pl

    g = h // kh
    q_blk = pl.BlockSpec((None, block, None, d), lambda bi, hi, i: (bi, i, hi, 0))
    q_row = pl.BlockSpec((None, t, None, d), lambda bi, hi, i: (bi, 0, hi, 0))
    kv_row = pl.BlockSpec((None, t, None, d), lambda bi, hi, i: (bi, 0, hi // g, 0))
    kv_blk = pl.BlockSpec((None, block, None, d), lambda bi, hi, i: (bi, i, hi // g, 0))
    seg = pl.BlockSpec((None, t), lambda bi, hi, i: (bi, 0))
    scalar = pl.BlockSpec((None, None), lambda bi, hi, i: (bi, i))
    stat_blk = pl.BlockSpec((None, None, block), lambda bi, hi, i: (bi, hi, i))
    stat_row = pl.BlockSpec((None, None, t), lambda bi, hi, i: (bi, hi, 0))
    return q_blk, q_row, kv_row, kv_blk, seg, scalar, stat_blk, stat_row


def _forward(q, k, v, segment_ids, interpret):
    b, t, h, d = q.shape
    kh = k.shape[2]
    kv_lo, q_hi = block_bounds(segment_ids, BLOCK)
    q_blk, _, kv_row, _, seg, scalar, stat_blk, _ = _specs(b, t, h, kh, d, BLOCK)
    o, lse = _call(functools.partial(_fwd_kernel, sm_scale=d ** -0.5, block=BLOCK),
                   (b, h, t // BLOCK), [q_blk, kv_row, kv_row, seg, scalar],
                   [q_blk, stat_blk],
                   [jax.ShapeDtypeStruct(q.shape, q.dtype),
                    jax.ShapeDtypeStruct((b, h, t), jnp.float32)],
                   interpret, q, k, v, segment_ids, kv_lo)
    return o, (lse, kv_lo, q_hi)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _attention(q, k, v, segment_ids, interpret):
    return _forward(q, k, v, segment_ids, interpret)[0]


def _attention_fwd(q, k, v, segment_ids, interpret):
    o, (lse, kv_lo, q_hi) = _forward(q, k, v, segment_ids, interpret)
    return o, (q, k, v, segment_ids, o, lse, kv_lo, q_hi)


def _attention_bwd(interpret, res, do):
    q, k, v, segment_ids, o, lse, kv_lo, q_hi = res
    b, t, h, d = q.shape
    kh = k.shape[2]
    sm_scale = d ** -0.5
    # delta[b, h, t] = sum_d o * do (float32), the softmax backward's row term
    delta = jnp.einsum("bthd,bthd->bht", o.astype(jnp.float32), do.astype(jnp.float32))
    q_blk, q_row, kv_row, kv_blk, seg, scalar, stat_blk, stat_row = _specs(b, t, h, kh, d,
                                                                           BLOCK)
    grid = (b, h, t // BLOCK)
    do = do.astype(q.dtype)
    dq = _call(functools.partial(_dq_kernel, sm_scale=sm_scale, block=BLOCK), grid,
               [q_blk, kv_row, kv_row, seg, scalar, q_blk, stat_blk, stat_blk], q_blk,
               jax.ShapeDtypeStruct(q.shape, q.dtype), interpret,
               q, k, v, segment_ids, kv_lo, do, lse, delta)
    # dk / dv per query head (the kernel writes head h's share), summed over each group
    dkv_blk = q_blk  # [B, block, H, Dh] blocks of the per-query-head outputs
    dk_h, dv_h = _call(functools.partial(_dkv_kernel, sm_scale=sm_scale, block=BLOCK), grid,
                       [q_row, kv_blk, kv_blk, seg, scalar, q_row, stat_row, stat_row],
                       [dkv_blk, dkv_blk],
                       [jax.ShapeDtypeStruct((b, t, h, d), jnp.float32)] * 2, interpret,
                       q, k, v, segment_ids, q_hi, do, lse, delta)
    g = h // kh
    dk = dk_h.reshape(b, t, kh, g, d).sum(axis=3).astype(k.dtype)
    dv = dv_h.reshape(b, t, kh, g, d).sum(axis=3).astype(v.dtype)
    return dq, dk, dv, None


_attention.defvjp(_attention_fwd, _attention_bwd)


def segment_causal_attention(q: jax.Array, k: jax.Array, v: jax.Array,
                             segment_ids: jax.Array | None = None,
                             interpret: bool = False) -> jax.Array:
    """Causal attention within packed sequences, skipping the blocks between them (module
    docstring). ``segment_ids=None``: one sequence per row."""
    b, t, h, _ = q.shape
    if t % BLOCK:
        raise ValueError(f"segment attention needs a length that is a multiple of {BLOCK}, "
                         f"got {t}")
    if h % k.shape[2]:
        raise ValueError(f"{h} query heads are not a multiple of {k.shape[2]} key heads")
    seg = (jnp.zeros((b, t), jnp.int32) if segment_ids is None
           else segment_ids.astype(jnp.int32))
    return _attention(q, k, v, seg, interpret)


__all__ = ["BLOCK", "block_bounds", "run_bounds", "segment_causal_attention"]
