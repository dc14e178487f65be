"""The LM-head matmul's custom backward rule (``models.lm_head.head_logits``) against NumPy
float64 gradients and against plain autodiff."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.models.lm_head import head_logits


def _case(vocab_major: bool, seed: int = 0):
    rng = np.random.default_rng(seed)
    h = rng.standard_normal((3, 5, 16))
    w = rng.standard_normal((40, 16) if vocab_major else (16, 40)) * 0.3
    c = rng.standard_normal((3, 5, 40))  # d loss / d logits
    return h, w, c


def _numpy_grads(h, w, c, vocab_major):
    W = w if vocab_major else w.T  # [V, D]
    dh = c @ W
    dW = np.einsum("btv,btd->vd", c, h)
    return dh, (dW if vocab_major else dW.T)


@pytest.mark.parametrize("vocab_major", [True, False])
def test_float32_matches_numpy_and_autodiff(vocab_major):
    h, w, c = _case(vocab_major)
    spec = "...d,vd->...v" if vocab_major else "...d,dv->...v"

    def loss(h_, w_, fn):
        return jnp.sum(fn(h_, w_) * jnp.asarray(c, jnp.float32))

    ours = jax.grad(lambda a, b: loss(a, b, lambda x, y: head_logits(x, y, vocab_major)),
                    argnums=(0, 1))(jnp.float32(h), jnp.float32(w))
    plain = jax.grad(lambda a, b: loss(a, b, lambda x, y: jnp.einsum(spec, x, y)),
                     argnums=(0, 1))(jnp.float32(h), jnp.float32(w))
    ref = _numpy_grads(h, w, c, vocab_major)
    for o, p, r in zip(ours, plain, ref):
        assert o.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(o), r, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(o), np.asarray(p), rtol=1e-6, atol=1e-6)
    logits = head_logits(jnp.float32(h), jnp.float32(w), vocab_major)
    W = w if vocab_major else w.T
    np.testing.assert_allclose(np.asarray(logits), h @ W.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("vocab_major", [True, False])
def test_bfloat16_operands_f32_logits_and_bf16_grads(vocab_major):
    h, w, c = _case(vocab_major, seed=1)
    hb, wb = jnp.asarray(h, jnp.bfloat16), jnp.asarray(w, jnp.bfloat16)
    logits = head_logits(hb, wb, vocab_major)
    assert logits.dtype == jnp.float32
    # forward: exact products of the bf16-rounded operands, accumulated in f32
    h64, w64 = np.asarray(hb, np.float64), np.asarray(wb, np.float64)
    W = w64 if vocab_major else w64.T
    np.testing.assert_allclose(np.asarray(logits), h64 @ W.T, rtol=1e-5, atol=1e-5)
    dh, dw = jax.grad(lambda a, b: jnp.sum(head_logits(a, b, vocab_major) * jnp.asarray(c, jnp.float32)),
                      argnums=(0, 1))(hb, wb)
    assert dh.dtype == jnp.bfloat16 and dw.dtype == jnp.bfloat16
    # backward: the cotangent is rounded to bf16 once, products accumulate in f32, the
    # result is rounded to bf16: within a few bf16 ulps (2^-8 relative) of float64
    c_b = np.asarray(jnp.asarray(c, jnp.bfloat16), np.float64)
    rdh, rdw = _numpy_grads(h64, w64, c_b, vocab_major)
    for got, ref in ((dh, rdh), (dw, rdw)):
        got = np.asarray(got, np.float64)
        np.testing.assert_allclose(got, ref, rtol=2 ** -7, atol=2 ** -7 * np.abs(ref).max())
