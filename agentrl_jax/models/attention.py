"""Blockwise (flash-style) causal attention in pure JAX: memory O(B*H*T*Dh + B*H*bq*bk).

``jax.nn.dot_product_attention`` without cuDNN (every CPU run, and GPU with ``implementation``
unset) materialises the ``[B, H, T, T]`` float32 scores, their softmax and, under
``jax.grad``, their cotangents: at ``B = 8, H = 9, T = 2048`` that is 1.2 GB per tensor per
layer. :func:`chunked_causal_attention` computes the same function block by block:

Forward (online softmax; query block ``i`` visits key blocks ``j <= i`` only)::

    s_ij = q_i k_j^T * scale                       [bq, bk]  (masked entries: excluded)
    m_i' = max(m_i, rowmax(s_ij))
    p_ij = exp(s_ij - m_i')
    l_i  = l_i * exp(m_i - m_i') + rowsum(p_ij)
    o_i  = o_i * exp(m_i - m_i') + p_ij v_j
    out_i = o_i / l_i,   lse_i = m_i + log(l_i)     (saved for the backward pass)

Backward (custom VJP, recomputing each block's probabilities from ``lse``)::

    D_i  = rowsum(dout_i * out_i)
    p_ij = exp(s_ij - lse_i)
    dv_j += p_ij^T dout_i
    ds_ij = p_ij * (dout_i v_j^T - D_i)
    dq_i += ds_ij k_j * scale,   dk_j += ds_ij^T q_i * scale

so nothing of size ``T x T`` exists in either pass: the residuals are ``q, k, v, out`` and
``lse [B, H, T]``, and the largest temporary is one ``[B, H, bq, bk]`` block. Scores,
softmax statistics and accumulators are float32 whatever the input dtype (bf16 inputs: the
two block matmuls take bf16 operands with float32 accumulation, like flash attention).

Masking: token ``t`` attends to token ``s`` iff ``s <= t`` (indices in the row), and, when
given, ``segment_ids[b, s] == segment_ids[b, t]`` (packed sequences) and ``kv_mask[b, s]``
(an attention mask over keys). A query whose keys are all masked (padding) gets an output of
0 and zero gradients, never NaN.

Shapes: ``B`` batch, ``T`` tokens, ``H`` query heads, ``K`` KV heads (GQA: ``H = K * G``),
``Dh`` head dim.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

Array = jax.Array

#: masked scores before the max: finite, so no ``inf - inf`` anywhere
_NEG = -1e30
DEFAULT_BLOCK_SIZE = 128  # fastest of 64..1024 on CPU (SmolLM2 heads, T = 2048)


def _block_mask(q_start: Array, k_start: Array, bq: int, bk: int,
                seg_q: Array | None, seg_k: Array | None, kv_k: Array | None) -> Array:
    """``mask [B or 1, 1, 1, bq, bk]`` bool for queries ``q_start..+bq`` x keys
    ``k_start..+bk``: causal, same segment (if ``seg_*`` ``[B, b*]``), valid key (if
    ``kv_k [B, bk]``)."""
    qi = q_start + jnp.arange(bq)
    ki = k_start + jnp.arange(bk)
    mask = (ki[None, :] <= qi[:, None])[None]  # [1, bq, bk]
    if seg_q is not None:
        mask = mask & (seg_q[:, :, None] == seg_k[:, None, :])
    if kv_k is not None:
        mask = mask & kv_k[:, None, :]
    return mask[:, None, None]


def _slice(x: Array | None, start: Array, size: int, axis: int) -> Array | None:
    return None if x is None else jax.lax.dynamic_slice_in_dim(x, start, size, axis)


def _scores(qb: Array, kb: Array, scale: float) -> Array:
    """``qb [B, K, G, bq, Dh]``, ``kb [B, K, bk, Dh]`` -> ``s [B, K, G, bq, bk]`` float32."""
    return jnp.einsum("bkgqd,bksd->bkgqs", qb, kb, preferred_element_type=jnp.float32) * scale


def _forward(q: Array, k: Array, v: Array, seg: Array | None, kvm: Array | None,
             bs: int) -> tuple[Array, Array]:
    """Blocked forward on grouped, padded inputs.

    ``q [B, K, G, Tp, Dh]``, ``k, v [B, K, Tp, Dh]``, ``seg [B, Tp]`` int | None,
    ``kvm [B, Tp]`` bool | None, ``Tp = n * bs``. Returns ``out [B, K, G, Tp, Dh]`` float32
    and ``lse [B, K, G, Tp]`` float32.
    """
    b, kh, g, tp, dh = q.shape
    n = tp // bs
    scale = dh ** -0.5

    def q_block(i: Array) -> tuple[Array, Array]:
        q0 = i * bs
        qb = _slice(q, q0, bs, 3)
        seg_q = _slice(seg, q0, bs, 1)

        def kv_step(j: Array, carry: tuple[Array, Array, Array]) -> tuple[Array, Array, Array]:
            m, l, acc = carry
            k0 = j * bs
            mask = _block_mask(q0, k0, bs, bs, seg_q, _slice(seg, k0, bs, 1),
                               _slice(kvm, k0, bs, 1))
            s = jnp.where(mask, _scores(qb, _slice(k, k0, bs, 2), scale), _NEG)
            m_new = jnp.maximum(m, jnp.max(s, axis=-1))
            p = jnp.where(mask, jnp.exp(s - m_new[..., None]), 0.0)
            alpha = jnp.exp(m - m_new)
            l = l * alpha + jnp.sum(p, axis=-1)
            pv = jnp.einsum("bkgqs,bksd->bkgqd", p.astype(v.dtype), _slice(v, k0, bs, 2),
                            preferred_element_type=jnp.float32)
            return m_new, l, acc * alpha[..., None] + pv

        init = (jnp.full((b, kh, g, bs), _NEG, jnp.float32),
                jnp.zeros((b, kh, g, bs), jnp.float32),
                jnp.zeros((b, kh, g, bs, dh), jnp.float32))
        m, l, acc = jax.lax.fori_loop(0, i + 1, kv_step, init)  # causal: key blocks <= i
        safe_l = jnp.where(l > 0, l, 1.0)
        return acc / safe_l[..., None], jnp.where(l > 0, m + jnp.log(safe_l), 0.0)

    out, lse = jax.lax.map(q_block, jnp.arange(n))  # [n, B, K, G, bs, (Dh)]
    out = jnp.moveaxis(out, 0, 3).reshape(b, kh, g, tp, dh)
    lse = jnp.moveaxis(lse, 0, 3).reshape(b, kh, g, tp)
    return out, lse


def _backward(q: Array, k: Array, v: Array, seg: Array | None, kvm: Array | None,
              out: Array, lse: Array, dout: Array, bs: int) -> tuple[Array, Array, Array]:
    """Blocked backward (layouts of :func:`_forward`; ``out``, ``dout`` float32). Returns
    ``dq [B, K, G, Tp, Dh]``, ``dk, dv [B, K, Tp, Dh]`` float32."""
    b, kh, g, tp, dh = q.shape
    n = tp // bs
    scale = dh ** -0.5
    delta = jnp.sum(dout * out, axis=-1)  # [B, K, G, Tp]
    dout_c = dout.astype(v.dtype)

    def k_block(dq: Array, j: Array) -> tuple[Array, tuple[Array, Array]]:
        k0 = j * bs
        kb, vb = _slice(k, k0, bs, 2), _slice(v, k0, bs, 2)
        seg_k, kv_k = _slice(seg, k0, bs, 1), _slice(kvm, k0, bs, 1)

        def q_step(i: Array, carry: tuple[Array, Array, Array]) -> tuple[Array, Array, Array]:
            dk, dv, dq = carry
            q0 = i * bs
            qb = _slice(q, q0, bs, 3)
            mask = _block_mask(q0, k0, bs, bs, _slice(seg, q0, bs, 1), seg_k, kv_k)
            s = _scores(qb, kb, scale)
            p = jnp.where(mask, jnp.exp(s - _slice(lse, q0, bs, 3)[..., None]), 0.0)
            do = _slice(dout_c, q0, bs, 3)
            dv = dv + jnp.einsum("bkgqs,bkgqd->bksd", p.astype(v.dtype), do,
                                 preferred_element_type=jnp.float32)
            dp = jnp.einsum("bkgqd,bksd->bkgqs", do, vb, preferred_element_type=jnp.float32)
            ds = (p * (dp - _slice(delta, q0, bs, 3)[..., None]) * scale).astype(q.dtype)
            dk = dk + jnp.einsum("bkgqs,bkgqd->bksd", ds, qb, preferred_element_type=jnp.float32)
            dq_i = jnp.einsum("bkgqs,bksd->bkgqd", ds, kb, preferred_element_type=jnp.float32)
            dq = jax.lax.dynamic_update_slice_in_dim(dq, _slice(dq, q0, bs, 3) + dq_i, q0, 3)
            return dk, dv, dq

        zeros = jnp.zeros((b, kh, bs, dh), jnp.float32)
        dk, dv, dq = jax.lax.fori_loop(j, n, q_step, (zeros, zeros, dq))  # queries >= keys
        return dq, (dk, dv)

    dq, (dk, dv) = jax.lax.scan(k_block, jnp.zeros(q.shape, jnp.float32), jnp.arange(n))
    dk = jnp.moveaxis(dk, 0, 2).reshape(b, kh, tp, dh)
    dv = jnp.moveaxis(dv, 0, 2).reshape(b, kh, tp, dh)
    return dq, dk, dv


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _blocked(q: Array, k: Array, v: Array, seg: Array | None, kvm: Array | None,
             bs: int) -> Array:
    return _forward(q, k, v, seg, kvm, bs)[0].astype(q.dtype)


def _blocked_fwd(q, k, v, seg, kvm, bs):
    out, lse = _forward(q, k, v, seg, kvm, bs)
    out_c = out.astype(q.dtype)
    return out_c, (q, k, v, seg, kvm, out_c, lse)


def _blocked_bwd(bs, res, dout):
    q, k, v, seg, kvm, out, lse = res
    dq, dk, dv = _backward(q, k, v, seg, kvm, out.astype(jnp.float32), lse,
                           dout.astype(jnp.float32), bs)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, None


_blocked.defvjp(_blocked_fwd, _blocked_bwd)


def chunked_causal_attention(q: Array, k: Array, v: Array, *,
                             segment_ids: Array | None = None, kv_mask: Array | None = None,
                             block_size: int = DEFAULT_BLOCK_SIZE) -> Array:
    """Causal ``softmax(q k^T / sqrt(Dh) + mask) v`` computed in ``block_size`` tiles.

    ``q [B, T, H, Dh]``, ``k, v [B, T, K, Dh]`` (``H`` a multiple of ``K``: GQA),
    ``segment_ids [B, T]`` int (attend within a segment only) and ``kv_mask [B, T]`` (nonzero
    = a key that may be attended to) optional. Returns ``[B, T, H, Dh]`` in ``q.dtype``;
    differentiable in ``q, k, v`` (custom VJP, see the module docstring). ``T`` is padded up
    to a multiple of the block (``min(block_size, T)``); padded keys are never attended.
    """
    b, t, h, dh = q.shape
    kh = k.shape[2]
    g = h // kh
    bs = max(1, min(block_size, t))
    tp = -(-t // bs) * bs
    pad = tp - t
    if pad:
        q, k, v = (jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0))) for x in (q, k, v))
        if segment_ids is not None:
            segment_ids = jnp.pad(segment_ids, ((0, 0), (0, pad)), constant_values=-1)
        if kv_mask is not None:
            kv_mask = jnp.pad(kv_mask, ((0, 0), (0, pad)))
    qg = q.reshape(b, tp, kh, g, dh).transpose(0, 2, 3, 1, 4)  # [B, K, G, Tp, Dh]
    kt, vt = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [B, K, Tp, Dh]
    seg = None if segment_ids is None else segment_ids.astype(jnp.int32)
    kvm = None if kv_mask is None else kv_mask.astype(jnp.bool_)
    out = _blocked(qg, kt, vt, seg, kvm, bs)
    return out.transpose(0, 3, 1, 2, 4).reshape(b, tp, h, dh)[:, :t]


__all__ = ["chunked_causal_attention", "DEFAULT_BLOCK_SIZE"]
