"""benchmarks/speed/donation_dispatch.py: its step computes what its docstring says (against a
NumPy loop, donated or not), and a small run reports every variant."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks" / "speed"))

import donation_dispatch  # noqa: E402


def test_the_step_matches_a_numpy_reference_donated_or_not():
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 8)).astype(np.float32) * 0.5
    w = rng.standard_normal((8, 8)).astype(np.float32) * 0.3
    y = x.astype(np.float64)
    for _ in range(3):
        y = np.tanh(y @ w.astype(np.float64))
    for donate in (False, True):
        start = [rng.standard_normal((4, 9, 5)).astype(np.float32) for _ in range(2)]
        kv = tuple(jnp.asarray(a) for a in start)
        step = donation_dispatch.make_step(3, 5, donate)
        new, total = step(kv, jnp.asarray(x), jnp.asarray(w), np.int32(2))
        np.testing.assert_allclose(float(total), y.sum(), rtol=1e-5)
        for before, after in zip(start, new):
            expected = before.copy()
            expected[:, 2, :] = y[:4, :5]
            np.testing.assert_allclose(np.asarray(after), expected, rtol=1e-5, atol=1e-6)


def test_a_small_run_reports_every_variant(tmp_path):
    out = donation_dispatch.main(["--layers", "2", "--slots", "4", "--length", "16",
                                  "--width", "8", "--dim", "16", "--rows", "16",
                                  "--matmuls", "2", "--calls", "2", "--repeats", "1",
                                  "--json", str(tmp_path / "d.json")])
    assert set(out["summary"]) == set(donation_dispatch.VARIANTS)
    for summary in out["summary"].values():
        assert summary["launch_ms"] > 0 and summary["launch_cpu_ms"] >= 0
    assert out["summary"]["donated_after_sync"]["device_ms_a"] > 0
    assert (tmp_path / "d.json").exists()
