"""``kernels/segment_attention.py``: the block-skipping packed attention (Pallas kernels, run in
the interpreter on CPU) against a float64 NumPy reference of causal same-segment softmax
attention, forward and all three gradients, with GQA, several packed sequences per row,
trailing padding and a row of one sequence; its block bounds against a NumPy loop."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.kernels.segment_attention import BLOCK, block_bounds, segment_causal_attention


def _segments(b: int, t: int) -> np.ndarray:
    seg = np.zeros((b, t), np.int32)
    seg[0, :70], seg[0, 70:200], seg[0, 200:230] = 1, 2, 3  # then padding (0) to the end
    seg[1, :] = 1  # one sequence over the whole row
    if b > 2:
        seg[2, :150], seg[2, 150:] = 1, 2
    return seg


def _reference(q, k, v, seg, do):
    """float64 ``(o, dq, dk, dv)``: softmax over ``s <= t`` with equal segment ids."""
    q, k, v, do = (np.asarray(x, np.float64) for x in (q, k, v, do))
    b, t, h, d = q.shape
    g = h // k.shape[2]
    scale = d ** -0.5
    o, dq = np.zeros_like(q), np.zeros_like(q)
    dk, dv = np.zeros_like(k), np.zeros_like(v)
    mask = np.tril(np.ones((t, t), bool))
    for bi in range(b):
        m = mask & (seg[bi][:, None] == seg[bi][None, :])
        for hi in range(h):
            kh = hi // g
            s = np.where(m, q[bi, :, hi] @ k[bi, :, kh].T * scale, -np.inf)
            p = np.exp(s - s.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            o[bi, :, hi] = p @ v[bi, :, kh]
            dp = do[bi, :, hi] @ v[bi, :, kh].T
            ds = p * (dp - (dp * p).sum(-1, keepdims=True))
            dq[bi, :, hi] = ds @ k[bi, :, kh] * scale
            dk[bi, :, kh] += ds.T @ q[bi, :, hi] * scale
            dv[bi, :, kh] += p.T @ do[bi, :, hi]
    return o, dq, dk, dv


def test_block_bounds_start_at_the_earliest_sequence_and_stop_after_the_latest():
    seg = _segments(3, 256)
    kv_lo, q_hi = (np.asarray(x) for x in block_bounds(jnp.asarray(seg)))
    for b in range(3):
        runs = np.r_[0, np.flatnonzero(np.diff(seg[b])) + 1]
        start = runs[np.searchsorted(runs, np.arange(256), side="right") - 1]
        end = np.r_[runs[1:], 256][np.searchsorted(runs, np.arange(256), side="right") - 1]
        for i in range(256 // BLOCK):
            assert kv_lo[b, i] == min(start[i * BLOCK:(i + 1) * BLOCK]) // BLOCK
            assert q_hi[b, i] == -(-max(end[i * BLOCK:(i + 1) * BLOCK]) // BLOCK)
    # the packed row skips: its third query block starts at key block 1, not 0
    assert kv_lo[0].tolist() == [0, 0, 1, 1] and q_hi[0].tolist() == [2, 4, 4, 4]


@pytest.mark.parametrize("heads", [(4, 2), (2, 2)], ids=["gqa", "mha"])
def test_forward_and_gradients_match_a_float64_reference(heads):
    h, kh = heads
    b, t, d = 3, 256, 16
    rng = np.random.default_rng(0)
    q = rng.standard_normal((b, t, h, d)).astype(np.float32)
    k = rng.standard_normal((b, t, kh, d)).astype(np.float32)
    v = rng.standard_normal((b, t, kh, d)).astype(np.float32)
    do = rng.standard_normal((b, t, h, d)).astype(np.float32)
    seg = _segments(b, t)

    def loss(q, k, v):
        o = segment_causal_attention(q, k, v, jnp.asarray(seg), interpret=True)
        return (o * do).sum(), o

    (_, o), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
    want = _reference(q, k, v, seg, do)
    for name, got, ref in zip(("o", "dq", "dk", "dv"), (o, *grads), want):
        np.testing.assert_allclose(np.asarray(got), ref, atol=2e-5, rtol=2e-5, err_msg=name)


def test_lengths_and_heads_are_checked():
    x = jnp.zeros((1, 96, 2, 16))
    with pytest.raises(ValueError, match="multiple of 64"):
        segment_causal_attention(x, x, x, interpret=True)
    with pytest.raises(ValueError, match="not a multiple"):
        segment_causal_attention(jnp.zeros((1, 64, 3, 16)), jnp.zeros((1, 64, 2, 16)),
                                 jnp.zeros((1, 64, 2, 16)), interpret=True)
