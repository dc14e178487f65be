"""Pallas GAE kernels: interpret-mode correctness on CPU (same kernels as on GPU) and
the Triton lowering (no GPU needed). Tolerance vs the lax.scan float32 path:
``atol=2e-5`` (whitened advantages) / ``5e-5`` (returns, scale ~|V| + |R|)."""

from __future__ import annotations

import numpy as np
import pytest

pl = pytest.importorskip("jax.experimental.pallas")

from agentrl_jax.algorithms import compute_advantages, masked_whiten  # noqa: E402
from agentrl_jax.algorithms.gae import gae_advantages_raw  # noqa: E402
from agentrl_jax.kernels.gae import gae_pallas_full, lower_for_gpu, supported  # noqa: E402


def test_pallas_gae_interpret_matches_scan():
    rng = np.random.default_rng(0)
    B, T = 20, 150  # padded to 32 x 192: 2 row blocks, 3 chunks (4 summary columns)
    m = (rng.random((B, T)) < 0.6).astype(np.float32)
    m[3] = 0.0
    r = (rng.normal(size=(B, T)) * m).astype(np.float32)
    V = rng.normal(size=(B, T)).astype(np.float32)
    for gamma, lam in ((0.99, 0.95),):
        adv, ret, raw = gae_pallas_full(r, V, m.astype(bool), gamma=gamma, lam=lam, interpret=True)
        A = np.asarray(gae_advantages_raw(r, V, m, gamma=gamma, lam=lam, method="scan"))
        np.testing.assert_allclose(raw, A, rtol=1e-5, atol=5e-5)
        np.testing.assert_allclose(ret, (A + V) * m, rtol=1e-5, atol=5e-5)
        np.testing.assert_allclose(adv, np.asarray(masked_whiten(A, m)) * m, rtol=1e-5, atol=2e-5)


def test_compute_advantages_pallas_method():
    rng = np.random.default_rng(1)
    B, T = 12, 48
    m = (rng.random((B, T)) < 0.5).astype(np.float32)
    kw = dict(rewards=rng.normal(size=B).astype(np.float32), loss_mask=m, values=rng.normal(size=(B, T)).astype(np.float32))
    a = compute_advantages("gae", gamma=1.0, lam=1.0, method="pallas", **kw)
    b = compute_advantages("gae", gamma=1.0, lam=1.0, method="scan", **kw)
    np.testing.assert_allclose(a.advantages, b.advantages, rtol=1e-5, atol=2e-5)
    np.testing.assert_allclose(a.returns, b.returns, rtol=1e-5, atol=5e-5)


def test_pallas_gae_lowers_to_triton():
    assert supported(1.0, 0.95) and not supported(0.9, 0.0)
    txt = lower_for_gpu(32, 256, gamma=1.0, lam=0.95)
    assert txt.count("__gpu$xla.gpu.triton") == 2
