"""Prefill attention over a prefill call's head-major KV rows ``[R, K, S, Dh]``.

A prefill call feeds ``T`` prompt tokens of each of its ``R`` rows (``compiled.py``): queries
``q [R, T, H, Dh]`` at ``positions [R, T]`` attend to the rows' keys / values ``[R, K, S, Dh]``
(positions ``0..S-1``, the call's own keys already written). Token ``t`` of row ``r`` sees keys
``s <= positions[r, t]``; a token at a position ``>= S`` is padding (its keys were dropped, its
output is never used):

    out[r, t, h] = sum_{s <= p} softmax_s(q[r,t,h] . k[r,h//G,s] / sqrt(Dh)) v[r,h//G,s],
    p = positions[r, t]

Two implementations of that function:

* :func:`dense_prefill_attention` -- XLA einsums: float32 scores ``[R, K, G*T, S]`` written to
  memory, masked, soft-maxed and read back (the engine's original path; any backend; padding
  attends to every key, as ``CausalLM`` does with its own cache). A
  BabyAI prefill call of 16 rows x 256 tokens over 2,048 keys writes ~300 MB of scores a layer.
* :func:`flash_prefill_attention` -- a Pallas (Triton) flash-attention kernel: program
  ``(r, h, i)`` keeps ``BLOCK_Q`` queries of one head in registers and loops over key blocks
  ``0 .. ceil((max position of its queries + 1) / block_k)`` with an online softmax, so no
  score reaches memory and no key past the block's last position is read (a 90-token turn at
  position 900 reads ~1,000 keys, not ``S``); padding reads no key and its output is 0. GQA
  reads key head ``h // G``.
  ``interpret=True`` runs it in the Pallas interpreter (CPU tests).

Both return ``[R, T, H, Dh]`` in the query dtype; scores and the softmax are float32 (dots take
the inputs' dtype: float32 runs as TF32 on GPUs, as XLA's einsums do).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

BLOCK_Q = 64  # queries per program
_NEG = 0.7 * float(jnp.finfo(jnp.float32).min)  # "minus infinity" that keeps exp() finite


def dense_prefill_attention(q: jax.Array, cache_k: jax.Array, cache_v: jax.Array,
                            positions: jax.Array) -> jax.Array:
    """``q [R, T, H, Dh]``, ``cache_k / cache_v [R, K, S, Dh]``, ``positions [R, T]`` ->
    ``[R, T, H, Dh]`` (module docstring); XLA einsums over all ``S`` keys."""
    b, t, h, dh = q.shape
    kh, s = cache_k.shape[1], cache_k.shape[2]
    g = h // kh
    # queries grouped per KV head: [R, K, G*T, Dh] (GQA without repeating keys / values)
    qg = q.reshape(b, t, kh, g, dh).transpose(0, 2, 3, 1, 4).reshape(b, kh, g * t, dh)
    scores = jnp.einsum("bkqd,bksd->bkqs", qg, cache_k.astype(q.dtype),
                        preferred_element_type=jnp.float32) * (dh ** -0.5)
    query_pos = jnp.broadcast_to(positions[:, None, :], (b, g, t)).reshape(b, 1, g * t, 1)
    mask = jnp.arange(s)[None, None, None, :] <= query_pos
    probs = jax.nn.softmax(jnp.where(mask, scores, -jnp.inf), axis=-1)
    out = jnp.einsum("bkqs,bksd->bkqd", probs.astype(cache_v.dtype), cache_v,
                     preferred_element_type=jnp.float32).astype(q.dtype)
    return out.reshape(b, kh, g, t, dh).transpose(0, 3, 1, 2, 4).reshape(b, t, h, dh)


def flash_block_k(kv_length: int) -> int | None:
    """Keys per loop step of the flash kernel for rows of ``kv_length`` positions: the largest
    of 64, 32, 16 that divides it (None: no block does; use the dense attention)."""
    return next((b for b in (64, 32, 16) if kv_length % b == 0), None)


def unsupported_prefill_shape(chunk: int, kv_length: int, head_dim: int) -> str | None:
    """Why the flash kernel's tiles do not cover a call of ``chunk`` tokens per row over
    ``kv_length`` keys with this head dim, or None when they do."""
    if chunk % BLOCK_Q:
        return f"flash prefill attention needs a chunk divisible by {BLOCK_Q} (got {chunk})"
    if flash_block_k(kv_length) is None:
        return f"flash prefill attention needs a KV length divisible by 16 (got {kv_length})"
    if head_dim < 16 or head_dim & (head_dim - 1):
        return f"flash prefill attention needs a power-of-two head dim >= 16 (got {head_dim})"
    return None


def _attend(q, q_pos, load_k, load_v, hi, block_k: int, sm_scale: float) -> jax.Array:
    """Online-softmax attention of queries ``q [BLOCK_Q, Dh]`` at ``q_pos [BLOCK_Q]`` over key
    blocks ``0..hi-1`` (``load_k(j)`` / ``load_v(j)``: block ``j``, ``[block_k, Dh]``)."""
    from jax.experimental.pallas import triton as plgpu

    def body(j, carry):
        o, m, l = carry
        s = plgpu.dot(q, load_k(j).T).astype(jnp.float32) * sm_scale
        keep = (j * block_k + jnp.arange(block_k))[None, :] <= q_pos[:, None]
        s = jnp.where(keep, s, _NEG)
        m_next = jnp.maximum(m, s.max(axis=-1))
        p = jnp.where(keep, jnp.exp(s - m_next[:, None]), 0.0)
        corr = jnp.exp(m - m_next)
        v = load_v(j)
        o = corr[:, None] * o + plgpu.dot(p.astype(v.dtype), v).astype(jnp.float32)
        return o, m_next, corr * l + p.sum(axis=-1)

    o = jnp.zeros((BLOCK_Q, q.shape[-1]), jnp.float32)
    m = jnp.full((BLOCK_Q,), _NEG, jnp.float32)
    l = jnp.zeros((BLOCK_Q,), jnp.float32)
    o, m, l = lax.fori_loop(0, hi, body, (o, m, l))
    return o / jnp.maximum(l, 1e-30)[:, None]


def _kernel(q_ref, k_ref, v_ref, pos_ref, hi_ref, o_ref, *, sm_scale: float, block_k: int):
    """Program ``(r, h, i)``: queries ``q [BLOCK_Q, Dh]`` of head ``h``, rows' keys / values
    ``[S, Dh]`` of head ``h // G``, positions ``[T]`` (``-1``: padding), key blocks to visit
    ``hi []``; output ``[BLOCK_Q, Dh]``."""
    from jax.experimental import pallas as pl

    i = pl.program_id(2)
    q_pos = pos_ref[pl.ds(i * BLOCK_Q, BLOCK_Q)]
    o = _attend(q_ref[...], q_pos, lambda j: k_ref[pl.ds(j * block_k, block_k), :],
                lambda j: v_ref[pl.ds(j * block_k, block_k), :], hi_ref[()], block_k, sm_scale)
    o_ref[...] = o.astype(o_ref.dtype)


def _kernel_in_cache(q_ref, slot_ref, k_ref, v_ref, pos_ref, hi_ref, o_ref, *, sm_scale: float,
                     block_k: int, groups: int):
    """Program ``(r, h, i)`` reading the row's keys / values from the whole cache ``[B, K, S,
    Dh]`` at slot ``slot []`` (loaded in the kernel: no gathered copy of the rows)."""
    from jax.experimental import pallas as pl

    i, kv_head = pl.program_id(2), pl.program_id(1) // groups
    slot = slot_ref[()]
    q_pos = pos_ref[pl.ds(i * BLOCK_Q, BLOCK_Q)]
    o = _attend(q_ref[...], q_pos,
                lambda j: k_ref[slot, kv_head, pl.ds(j * block_k, block_k), :],
                lambda j: v_ref[slot, kv_head, pl.ds(j * block_k, block_k), :],
                hi_ref[()], block_k, sm_scale)
    o_ref[...] = o.astype(o_ref.dtype)


def _positions_and_bounds(positions: jax.Array, kv_length: int, block_k: int
                          ) -> tuple[jax.Array, jax.Array]:
    """Positions with padding (``>= kv_length``) as -1, and per block of queries the number of
    key blocks holding positions ``0..last`` (0 for an all-padding block): ``[R, T]``,
    ``[R, T / BLOCK_Q]`` int32."""
    r, t = positions.shape
    pos = jnp.where(positions < kv_length, positions, -1).astype(jnp.int32)
    last = pos.reshape(r, t // BLOCK_Q, BLOCK_Q).max(axis=-1)
    return pos, ((last + block_k) // block_k).astype(jnp.int32)


def _flash_call(kernel, q: jax.Array, kv_length: int, kv_specs: list, kv_args: tuple,
                positions: jax.Array, row_reads: jax.Array | None, interpret: bool,
                **kernel_kw) -> jax.Array:
    """The ``pallas_call`` both entry points share: grid ``(R, H, T / BLOCK_Q)``, inputs
    ``q``, ``kv_args`` (with ``kv_specs``), positions and key-block bounds (zeroed for rows
    where ``row_reads`` is False)."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    b, t, h, dh = q.shape
    why = unsupported_prefill_shape(t, kv_length, dh)
    if why is not None:
        raise ValueError(why)
    block_k = flash_block_k(kv_length)
    pos, hi = _positions_and_bounds(positions, kv_length, block_k)
    if row_reads is not None:
        hi = jnp.where(row_reads[:, None], hi, 0)
    q_spec = pl.BlockSpec((None, BLOCK_Q, None, dh), lambda r, hh, i: (r, i, hh, 0))
    return pl.pallas_call(
        functools.partial(kernel, sm_scale=dh ** -0.5, block_k=block_k, **kernel_kw),
        grid=(b, h, t // BLOCK_Q),
        in_specs=[q_spec, *kv_specs, pl.BlockSpec((None, t), lambda r, hh, i: (r, 0)),
                  pl.BlockSpec((None, None), lambda r, hh, i: (r, i))],
        out_specs=q_spec,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        interpret=interpret,
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=2),
    )(q, *kv_args, pos, hi)


@functools.partial(jax.jit, static_argnames=("interpret",))
def flash_prefill_attention(q: jax.Array, cache_k: jax.Array, cache_v: jax.Array,
                            positions: jax.Array, interpret: bool = False) -> jax.Array:
    """The same function as :func:`dense_prefill_attention`, as a flash kernel that reads only
    the keys each block of queries can see (shapes: :func:`unsupported_prefill_shape`)."""
    from jax.experimental import pallas as pl

    g = q.shape[2] // cache_k.shape[1]
    s, dh = cache_k.shape[2], q.shape[3]
    kv_spec = pl.BlockSpec((None, None, s, dh), lambda r, hh, i: (r, hh // g, 0, 0))
    return _flash_call(_kernel, q, s, [kv_spec, kv_spec],
                       (cache_k.astype(q.dtype), cache_v.astype(q.dtype)), positions, None,
                       interpret)


@functools.partial(jax.jit, static_argnames=("interpret",))
def flash_prefill_attention_in_cache(q: jax.Array, cache_k: jax.Array, cache_v: jax.Array,
                                     slots: jax.Array, positions: jax.Array,
                                     interpret: bool = False) -> jax.Array:
    """:func:`flash_prefill_attention` reading row ``r``'s keys / values at slot ``slots[r]``
    of the whole cache ``[B, K, S, Dh]`` (the call's keys already written there), so the rows
    are neither gathered nor written back. A row whose slot is ``>= B`` is unused: it reads
    nothing and its output is 0. ``q [R, T, H, Dh]``, ``slots [R]``, ``positions [R, T]`` ->
    ``[R, T, H, Dh]``."""
    from jax.experimental import pallas as pl

    n_slots = cache_k.shape[0]
    cache_spec = pl.BlockSpec(cache_k.shape, lambda r, hh, i: (0, 0, 0, 0))
    return _flash_call(
        _kernel_in_cache, q, cache_k.shape[2],
        [pl.BlockSpec((None,), lambda r, hh, i: (r,)), cache_spec, cache_spec],
        (jnp.clip(slots, 0, n_slots - 1).astype(jnp.int32), cache_k.astype(q.dtype),
         cache_v.astype(q.dtype)), positions, slots < n_slots, interpret,
        groups=q.shape[2] // cache_k.shape[1])


__all__ = ["BLOCK_Q", "dense_prefill_attention", "flash_block_k", "flash_prefill_attention",
           "flash_prefill_attention_in_cache", "unsupported_prefill_shape"]
