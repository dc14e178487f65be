"""The Pallas skinny matmul (``benchmarks/contenders/skinny_matmul.py``, a contender of
``benchmarks/contenders/decode_gemm.py``) against a float64 NumPy product, in the Pallas interpreter."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.contenders.skinny_matmul import MatmulTiling, skinny_matmul


@pytest.mark.parametrize("m,k,n,tiling", [
    (64, 96, 64, MatmulTiling(32, 32, 32)),
    (64, 128, 96, MatmulTiling(64, 32, 16, splits=2)),
    (32, 64, 64, MatmulTiling(16, 64, 16, splits=4)),
])
def test_matches_float64_reference(m, k, n, tiling):
    import jax.numpy as jnp

    rng = np.random.default_rng(m + k + n)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    out = np.asarray(skinny_matmul(jnp.asarray(x), jnp.asarray(w), tiling, interpret=True))
    np.testing.assert_allclose(out, x.astype(np.float64) @ w.astype(np.float64),
                               rtol=1e-5, atol=1e-4)
    assert out.dtype == np.float32


def test_bf16_output_and_bad_tiling():
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 64)).astype(np.float32)
    w = rng.standard_normal((64, 32)).astype(np.float32)
    out = skinny_matmul(jnp.asarray(x, jnp.bfloat16), jnp.asarray(w, jnp.bfloat16),
                        MatmulTiling(16, 16, 16, splits=2), interpret=True)
    assert out.dtype == jnp.bfloat16
    ref = (x.astype(np.float64) @ w.astype(np.float64))
    # bf16 inputs (8-bit mantissa) and output: relative error ~1e-2 of the output scale
    assert np.abs(np.asarray(out, np.float32) - ref).max() < 3e-2 * np.abs(ref).max()
    with pytest.raises(ValueError, match="does not divide"):
        skinny_matmul(jnp.asarray(x), jnp.asarray(w), MatmulTiling(16, 24, 16), interpret=True)
    with pytest.raises(ValueError, match="contracting"):
        skinny_matmul(jnp.asarray(x), jnp.asarray(x), MatmulTiling(16, 16, 16), interpret=True)


def test_decode_gemm_benchmark_smoke(tmp_path):
    """``benchmarks/contenders/decode_gemm.py --small --gemms o,down`` runs on CPU: XLA and every fitting
    Pallas tiling are timed, each Pallas output having matched XLA's first."""
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "gemm.json"
    proc = subprocess.run([sys.executable, "benchmarks/contenders/decode_gemm.py", "--small", "--gemms",
                           "o,down", "--json", str(out)], cwd=root, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    gemms = json.loads(out.read_text())["shapes"]["tiny"]["gemms"]
    assert set(gemms) == {"o", "down"}  # --gemms picks them
    for row in gemms.values():
        pallas = {k: v for k, v in row["variants"].items() if k.startswith("pallas")}
        assert "us" in row["variants"]["xla"] and pallas
        for v in pallas.values():
            assert "us" in v and v["rel_err"] < 2e-2, v
