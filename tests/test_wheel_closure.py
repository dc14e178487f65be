"""benchmarks/gpu/wheel_closure.py: what a machine lacks of a resolved closure, by PEP 503 name
(the resolution itself needs PyPI and is not exercised here)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks", "gpu"))

from wheel_closure import missing, normalise, read_present  # noqa: E402


def test_names_compare_as_pep_503_normalises_them():
    assert normalise("Torch_Memory.Saver") == "torch-memory-saver"
    assert normalise("flashinfer_python") == normalise("flashinfer-python")


def test_missing_leaves_out_what_the_machine_has(tmp_path):
    freeze = tmp_path / "freeze.txt"
    freeze.write_text("# pip freeze\ntorch==2.11.0\nTransformers==5.3.0\n\n"
                      "numpy @ file:///wheels/numpy.whl\n")
    present = read_present(str(freeze))
    assert present == {"torch": "2.11.0", "transformers": "5.3.0", "numpy": ""}
    resolved = [("torch", "2.11.0"), ("transformers", "5.12.1"), ("numpy", "2.3.5"),
                ("sglang_kernel", "0.4.5")]
    assert missing(resolved, present) == [("sglang_kernel", "0.4.5")]
    # --exact: another version present is not enough (numpy's version is unknown: needed too)
    assert missing(resolved, present, exact=True) == [
        ("transformers", "5.12.1"), ("numpy", "2.3.5"), ("sglang_kernel", "0.4.5")]
