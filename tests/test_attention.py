"""Blockwise causal attention (``models/attention.py``), segment ids (packed rows) and the
CPU defaults (chunked attention, scanned remat) against independent references: a NumPy
float64 attention with its hand-derived backward pass, and ``jax.nn.dot_product_attention``
(XLA, explicit masks).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentrl_jax.learner.config import LearnerConfig
from agentrl_jax.learner.logprobs import (CPU_CHUNK_BYTES, chunk_length, logprobs_from_hidden,
                                         token_logprobs)
from agentrl_jax.learner.train_step import policy_loss_fn
from agentrl_jax.models.attention import chunked_causal_attention
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.llama import (abstract_model, init_model, resolve_attention_impl,
                                      resolve_remat_impl)

TINY = ModelConfig(vocab_size=96, hidden_size=48, intermediate_size=80, num_layers=2,
                   num_heads=6, num_kv_heads=2, head_dim=8, attention_block_size=8)


# ----------------------------------------------------------------- NumPy float64 reference
def _np_mask(t: int, segment_ids=None, kv_mask=None) -> np.ndarray:
    """``[B or 1, 1, T, T]``: key s visible to query t."""
    mask = np.tril(np.ones((t, t), bool))[None]
    if segment_ids is not None:
        mask = mask & (segment_ids[:, :, None] == segment_ids[:, None, :])
    if kv_mask is not None:
        mask = mask & (np.asarray(kv_mask)[:, None, :] != 0)
    return mask[:, None]


def np_attention(q, k, v, w, segment_ids=None, kv_mask=None):
    """Float64 ``out = softmax(q k^T / sqrt(Dh), masked) v`` and the gradients of
    ``sum(out * w)``: ``dV = P^T W``, ``dS = P * (W V^T - rowsum(W V^T * P))``,
    ``dQ = dS K / sqrt(Dh)``, ``dK = dS^T Q / sqrt(Dh)`` (GQA: K / V repeated over each group
    of query heads, their gradients summed back). Fully masked rows: output 0."""
    q, k, v, w = (np.asarray(x, np.float64) for x in (q, k, v, w))
    b, t, h, dh = q.shape
    g = h // k.shape[2]
    kr, vr = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
    mask = _np_mask(t, segment_ids, kv_mask)
    s = np.einsum("bqhd,bshd->bhqs", q, kr) / np.sqrt(dh)
    s = np.where(mask, s, -np.inf)
    m = np.max(s, -1, keepdims=True)
    e = np.where(mask, np.exp(s - np.where(np.isfinite(m), m, 0.0)), 0.0)
    z = e.sum(-1, keepdims=True)
    p = e / np.where(z > 0, z, 1.0)
    out = np.einsum("bhqs,bshd->bqhd", p, vr)
    dp = np.einsum("bqhd,bshd->bhqs", w, vr)
    ds = p * (dp - np.sum(dp * p, -1, keepdims=True)) / np.sqrt(dh)
    dq = np.einsum("bhqs,bshd->bqhd", ds, kr)
    dk = np.einsum("bhqs,bqhd->bshd", ds, q).reshape(b, t, -1, g, dh).sum(3)
    dv = np.einsum("bhqs,bqhd->bshd", p, w).reshape(b, t, -1, g, dh).sum(3)
    return out, (dq, dk, dv)


def _inputs(seed: int, b: int = 2, t: int = 37, h: int = 6, kh: int = 2, dh: int = 16):
    rng = np.random.default_rng(seed)
    q, k, v, w = (rng.standard_normal((b, t, n, dh)).astype(np.float32) for n in (h, kh, kh, h))
    return q, k, v, w


def _packed_ids(b: int, t: int) -> tuple[np.ndarray, np.ndarray]:
    """Row 0: segments 1 | 2; row 1: segments 1 | 2 | padding (id 0, masked keys)."""
    seg = np.zeros((b, t), np.int32)
    seg[:, :15] = 1
    seg[:, 15:] = 2
    seg[1, 30:] = 0
    kv = (seg != 0).astype(np.int32)
    kv[0] = 1
    return seg, kv


@functools.partial(jax.jit, static_argnums=4)
def _jitted_vjp(q, k, v, w, block, seg, kv):
    # one program per call signature instead of an eager op-by-op run (the same operations)
    def f(q, k, v):
        out = chunked_causal_attention(q, k, v, segment_ids=seg, kv_mask=kv, block_size=block)
        return jnp.sum(out * w), out
    (_, out), grads = jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True)(q, k, v)
    return out, grads


def _chunked_vjp(q, k, v, w, block, seg=None, kv=None):
    out, grads = _jitted_vjp(q, k, v, w, block, seg, kv)
    return np.asarray(out), [np.asarray(g) for g in grads]


@pytest.mark.parametrize("block", [8, 16, 37, 64], ids=lambda b: f"block{b}")
@pytest.mark.parametrize("masks", ["causal", "segments", "segments+kv"])
def test_chunked_matches_numpy_float64(block, masks):
    q, k, v, w = _inputs(0)
    seg, kv = _packed_ids(2, 37)
    seg = seg if masks != "causal" else None
    kv = kv if masks == "segments+kv" else None
    out, grads = _chunked_vjp(q, k, v, w, block, seg, kv)
    ref_out, ref_grads = np_attention(q, k, v, w, seg, kv)
    np.testing.assert_allclose(out, ref_out, atol=2e-6, rtol=1e-5)
    for name, g, r in zip("qkv", grads, ref_grads):
        np.testing.assert_allclose(g, r, atol=1e-5, rtol=1e-4, err_msg=f"d{name}")


def test_chunked_matches_xla_attention():
    """Same values and gradients as ``jax.nn.dot_product_attention`` with ``is_causal`` and
    with an explicit ``[B, 1, T, T]`` mask (rows with visible keys only: XLA averages a fully
    masked row over all keys, chunked gives 0)."""
    q, k, v, w = _inputs(1, b=3, t=50, h=4, kh=1)
    for seg, kv in ((None, None), _packed_ids(3, 50)):
        if seg is None:
            def xla(q, k, v):
                return jax.nn.dot_product_attention(q, k, v, is_causal=True)
        else:
            mask = jnp.asarray(_np_mask(50, seg, kv))

            def xla(q, k, v):
                return jax.nn.dot_product_attention(q, k, v, mask=mask)
        real = np.ones((3, 50), bool) if kv is None else kv != 0
        wr = w * real[:, :, None, None]
        out, grads = _chunked_vjp(q, k, v, wr, 16, seg, kv)
        ref = np.asarray(xla(q, k, v))
        ref_grads = jax.grad(lambda q, k, v: jnp.sum(xla(q, k, v) * wr), argnums=(0, 1, 2))(q, k, v)
        np.testing.assert_allclose(out[real], ref[real], atol=2e-6, rtol=1e-5)
        for g, r in zip(grads, ref_grads):
            np.testing.assert_allclose(g, np.asarray(r), atol=1e-5, rtol=1e-4)


def test_fully_masked_rows_are_zero_not_nan():
    q, k, v, w = _inputs(2, b=1, t=20)
    kv = np.zeros((1, 20), np.int32)
    kv[0, 5:] = 1  # queries 0..4 see no key
    out, grads = _chunked_vjp(q, k, v, w, 8, None, kv)
    assert np.all(np.isfinite(out)) and all(np.all(np.isfinite(g)) for g in grads)
    np.testing.assert_array_equal(out[0, :5], 0.0)
    ref_out, ref_grads = np_attention(q, k, v, w, None, kv)
    np.testing.assert_allclose(out, ref_out, atol=2e-6, rtol=1e-5)
    for g, r in zip(grads, ref_grads):
        np.testing.assert_allclose(g, r, atol=1e-5, rtol=1e-4)


def test_bfloat16_inputs_close_to_float64():
    q, k, v, w = _inputs(3, t=40)
    qb, kb, vb = (jnp.asarray(x, jnp.bfloat16) for x in (q, k, v))
    out = chunked_causal_attention(qb, kb, vb, block_size=16)
    assert out.dtype == jnp.bfloat16
    grads = jax.grad(lambda a, b, c: jnp.sum(
        chunked_causal_attention(a, b, c, block_size=16).astype(jnp.float32) * w),
        argnums=(0, 1, 2))(qb, kb, vb)
    ref_out, ref_grads = np_attention(*(np.asarray(x, np.float32) for x in (qb, kb, vb)), w)
    np.testing.assert_allclose(np.asarray(out, np.float32), ref_out, atol=3e-2, rtol=3e-2)
    for g, r in zip(grads, ref_grads):
        assert g.dtype == jnp.bfloat16
        np.testing.assert_allclose(np.asarray(g, np.float32), r, atol=0.1, rtol=0.05)


def test_chunked_memory_is_blockwise():
    """The compiled gradient at T = 4096 holds no ``[B, H, T, T]`` tensor: its temporaries
    are below one eighth of a single float32 score matrix (XLA's attention: several)."""
    b, t, h, kh, dh = 1, 4096, 4, 2, 32
    spec = [jax.ShapeDtypeStruct((b, t, n, dh), jnp.float32) for n in (h, kh, kh)]

    def loss(q, k, v):
        return jnp.sum(chunked_causal_attention(q, k, v, block_size=128) ** 2)

    temp = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(*spec).compile() \
        .memory_analysis().temp_size_in_bytes
    scores = b * h * t * t * 4  # 256 MiB
    assert temp < scores / 8, (temp, scores)


# ----------------------------------------------------------------- the model
@pytest.fixture(scope="module")
def tiny_state():
    graphdef, state = nnx.split(init_model(TINY, seed=0))
    return graphdef, jax.tree.map(np.asarray, state)


def _model(tiny_state, **changes):
    """The same weights under ``TINY.replace(**changes)``."""
    graphdef = nnx.graphdef(abstract_model(TINY.replace(**changes)))
    return nnx.merge(graphdef, jax.tree.map(jnp.asarray, tiny_state[1]))


def test_cpu_defaults_and_config_checks():
    assert jax.default_backend() == "cpu"
    assert resolve_attention_impl(None) == "chunked"
    assert resolve_attention_impl("xla") == "xla"
    assert resolve_remat_impl(TINY) is None
    assert resolve_remat_impl(TINY.replace(remat=True)) == "scan"
    assert resolve_remat_impl(TINY.replace(remat=True, remat_impl="checkpoint")) == "checkpoint"
    with pytest.raises(ValueError):
        TINY.replace(attention_impl="flash")
    with pytest.raises(ValueError):
        TINY.replace(remat_impl="sometimes")


def _loss_and_grads(model, tokens, **kwargs):
    graphdef, params = nnx.split(model)

    def loss(p):
        logits = nnx.merge(graphdef, p)(tokens, **kwargs).logits
        return jnp.mean(jax.nn.log_softmax(logits)[..., 0]), logits
    (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    return np.asarray(logits), grads


@pytest.mark.parametrize("with_mask", [False, True], ids=["causal", "attention_mask"])
def test_model_chunked_and_scan_match_xla(tiny_state, with_mask):
    """Logits and parameter gradients: chunked attention + scanned remat (the CPU default of
    a learner) == XLA attention + unrolled ``jax.checkpoint`` remat == no remat."""
    rng = np.random.default_rng(4)
    tokens = jnp.asarray(rng.integers(0, TINY.vocab_size, (3, 29)), jnp.int32)
    mask = jnp.asarray((np.arange(29)[None] < np.array([[29], [20], [11]])).astype(np.int32))
    kwargs = {"attention_mask": mask} if with_mask else {}
    runs = [_loss_and_grads(_model(tiny_state, **cfg), tokens, **kwargs) for cfg in (
        dict(attention_impl="xla", remat=False),
        dict(attention_impl="chunked", remat=True, remat_impl="scan"),
        dict(attention_impl=None, remat=True),  # CPU defaults: the same as the line above
        dict(attention_impl="xla", remat=True, remat_impl="checkpoint"))]
    real = np.asarray(mask, bool) if with_mask else np.ones((3, 29), bool)
    ref_logits, ref_grads = runs[0]
    for logits, grads in runs[1:]:
        np.testing.assert_allclose(logits[real], ref_logits[real], atol=2e-5, rtol=1e-5)
        for (path, g), r in zip(jax.tree_util.tree_flatten_with_path(grads)[0],
                                jax.tree.leaves(ref_grads)):
            np.testing.assert_allclose(g, r, atol=2e-6, rtol=1e-4,
                                       err_msg=jax.tree_util.keystr(path))


# ----------------------------------------------------------------- packed rows
def _packed_pair(seed: int, n1: int = 13, n2: int = 17, pad: int = 3):
    """Two sequences and one packed row ``[seq1 | seq2 | padding]`` with its positions and
    segment ids (1, 2; padding 0)."""
    rng = np.random.default_rng(seed)
    s1, s2 = (rng.integers(0, TINY.vocab_size, n).astype(np.int32) for n in (n1, n2))
    packed = np.concatenate([s1, s2, np.zeros(pad, np.int32)])[None]
    positions = np.concatenate([np.arange(n1), np.arange(n2), np.zeros(pad)]).astype(np.int32)[None]
    seg = np.concatenate([np.full(n1, 1), np.full(n2, 2), np.zeros(pad)]).astype(np.int32)[None]
    return s1, s2, packed, positions, seg


@pytest.mark.parametrize("impl", ["chunked", "xla"])
def test_packed_row_equals_separate_sequences(tiny_state, impl):
    graphdef, params = nnx.split(_model(tiny_state, attention_impl=impl))
    s1, s2, packed, positions, seg = _packed_pair(5)
    n1, n2 = len(s1), len(s2)

    @jax.jit
    def logits(tokens, positions=None, segment_ids=None):
        return nnx.merge(graphdef, params)(tokens, positions=positions,
                                           segment_ids=segment_ids).logits

    @jax.jit
    def logprobs(tokens, positions=None, segment_ids=None):
        return token_logprobs(graphdef, params, tokens, chunk_size=7, with_entropy=True,
                              positions=positions, segment_ids=segment_ids)

    out = np.asarray(logits(packed, positions, seg))
    assert np.all(np.isfinite(out))
    for s, sl in ((s1, slice(0, n1)), (s2, slice(n1, n1 + n2))):
        np.testing.assert_allclose(out[:, sl], np.asarray(logits(s[None])), atol=2e-5,
                                   rtol=1e-5)
    # token log-probs through the learner's path (segment starts excluded: no prediction)
    lp, ent = logprobs(packed, positions, seg)
    lp1, ent1 = logprobs(s1[None])
    lp2, ent2 = logprobs(s2[None])
    np.testing.assert_allclose(np.asarray(lp)[0, 1:n1], np.asarray(lp1)[0, 1:], atol=2e-5)
    np.testing.assert_allclose(np.asarray(lp)[0, n1 + 1:n1 + n2], np.asarray(lp2)[0, 1:],
                               atol=2e-5)
    np.testing.assert_allclose(np.asarray(ent)[0, n1 + 1:n1 + n2], np.asarray(ent2)[0, 1:],
                               atol=2e-5)


def test_policy_loss_accepts_positions_and_segment_ids(tiny_state):
    """``policy_loss_fn`` on a packed micro-batch (keys ``positions``, ``segment_ids``, no
    ``attention_mask``) gives the loss and gradients of the two sequences as padded rows."""
    s1, s2, packed, positions, seg = _packed_pair(6)
    n1, n2 = len(s1), len(s2)
    rng = np.random.default_rng(7)
    loss_p = np.zeros(packed.shape, np.float32)
    loss_p[0, 4:n1] = 1
    loss_p[0, n1 + 3:n1 + n2] = 1
    old_p = (-rng.random(packed.shape) * loss_p).astype(np.float32)
    adv_p = (rng.standard_normal(packed.shape) * loss_p).astype(np.float32)
    packed_mb = {"tokens": packed, "positions": positions, "segment_ids": seg,
                 "loss_mask": loss_p, "old_logprobs": old_p, "advantages": adv_p}
    t = max(n1, n2)

    def rows(x):  # the packed row's two segments as right-padded rows [2, t]
        out = np.zeros((2, t), x.dtype)
        out[0, :n1], out[1, :n2] = x[0, :n1], x[0, n1:n1 + n2]
        return out
    unpacked_mb = {k: rows(packed_mb[k]) for k in ("tokens", "loss_mask", "old_logprobs",
                                                    "advantages")}
    unpacked_mb["attention_mask"] = rows(np.ones(packed.shape, np.int32))
    config = LearnerConfig(dtype="float32", remat=False, entropy_coef=0.01, kl_coef=0.0,
                           logprob_chunk_size=5)
    model = _model(tiny_state)
    graphdef, params = nnx.split(model, nnx.Param)
    grad_fn = jax.jit(jax.value_and_grad(policy_loss_fn(graphdef, config), has_aux=True))
    denom = jnp.float32(loss_p.sum())
    (l_p, _), g_p = grad_fn(params, jax.tree.map(jnp.asarray, packed_mb), denom)
    (l_u, _), g_u = grad_fn(params, jax.tree.map(jnp.asarray, unpacked_mb), denom)
    np.testing.assert_allclose(float(l_p), float(l_u), atol=1e-6, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g_p), jax.tree.leaves(g_u)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=1e-4)


# ----------------------------------------------------------------- log-prob chunking
def test_chunk_length_bounds_logits_bytes():
    # SmolLM2: 8 rows x V 49152 x 4 B = 1.5 MiB per position; 128 MiB -> <= 85 positions
    c = chunk_length(2048, 8, 49152, 512, 128 * 2**20)
    assert c <= 85 and 8 * c * 49152 * 4 <= 128 * 2**20 and -(-2048 // c) * c - 2048 < 25
    c = chunk_length(2048, 1, 49152, 512, CPU_CHUNK_BYTES)  # the CPU default, one row
    assert c * 49152 * 4 <= CPU_CHUNK_BYTES
    assert chunk_length(2048, 8, 49152, 512, None) == 512
    assert chunk_length(100, 1, 10, 512, None) == 100
    assert chunk_length(10, 64, 10**6, 512, 1) == 1  # never below one position


def test_logprobs_independent_of_chunking():
    rng = np.random.default_rng(8)
    hidden = jnp.asarray(rng.standard_normal((3, 23, 16)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((16, 50)), jnp.float32)
    tokens = jnp.asarray(rng.integers(0, 50, (3, 23)), jnp.int32)
    ref = logprobs_from_hidden(hidden, tokens, lambda h: h @ w, chunk_size=23,
                               with_entropy=True, max_chunk_bytes=None)
    for kwargs in (dict(chunk_size=512, max_chunk_bytes=3 * 4 * 50 * 4),  # 4 positions
                   dict(chunk_size=6, max_chunk_bytes=None), dict(chunk_size=512)):
        out = logprobs_from_hidden(hidden, tokens, lambda h: h @ w, with_entropy=True, **kwargs)
        for a, b in zip(out, ref):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
