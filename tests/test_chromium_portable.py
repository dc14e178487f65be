"""benchmarks/gpu/chromium_portable.sh ``unpack``: packages carried in part folders (one split into
pieces) are checked against SHA256SUMS, put back together, unpacked behind wrapper scripts, and
a damaged piece is refused; the source folder may be given relative to the working directory (it
was read from inside the unpacking folder and not found). The packages here are built by hand
with ``dpkg-deb`` (no download); ``pack`` needs Debian's archive and is not exercised."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu" / "chromium_portable.sh"

pytestmark = pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb")


def _deb(tmp: Path, name: str, files: dict[str, str]) -> Path:
    """A minimal Debian package ``name`` holding executable ``files`` {path: shell body}."""
    root = tmp / f"build_{name}"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        f"Package: {name}\nVersion: 1.0\nArchitecture: amd64\nMaintainer: t <t@t>\n"
        f"Description: test\n")
    for rel, body in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
    out = tmp / f"{name}_1.0_amd64.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(root), str(out)],
                   check=True, capture_output=True)
    return out


def _carried(tmp: Path) -> Path:
    """Two packages in the layout ``pack`` writes: SHA256SUMS, p1/ with the browser's package
    split into two pieces, p2/ with the driver's."""
    browser = _deb(tmp, "chromium", {"usr/lib/chromium/chromium": "echo browser \"$@\""})
    driver = _deb(tmp, "chromium-driver", {"usr/bin/chromedriver": "echo driver"})
    src = tmp / "carried"
    (src / "p1").mkdir(parents=True)
    (src / "p2").mkdir()
    sums = [f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}" for p in (browser, driver)]
    (src / "SHA256SUMS").write_text("\n".join(sums) + "\n")
    data = browser.read_bytes()
    half = len(data) // 2
    (src / "p1" / f"{browser.name}.piece-00").write_bytes(data[:half])
    (src / "p1" / f"{browser.name}.piece-01").write_bytes(data[half:])
    shutil.copy(driver, src / "p2" / driver.name)
    return src


def _unpack(src: str, prefix: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), "unpack", src, prefix], cwd=cwd,
                          capture_output=True, text=True, timeout=120, check=False)


def test_unpack_from_a_relative_folder_joins_pieces_and_writes_wrappers(tmp_path):
    src = _carried(tmp_path)
    done = _unpack("carried", "prefix", cwd=tmp_path)  # both paths relative to the cwd
    assert done.returncode == 0, done.stderr
    prefix = tmp_path / "prefix"
    ran = subprocess.run([str(prefix / "bin" / "chromium"), "--headless"], capture_output=True,
                         text=True, check=True)
    assert ran.stdout.strip() == "browser --headless"  # the joined package's program
    wrapper = (prefix / "bin" / "chromium").read_text()
    assert f"{prefix}/root/usr/lib/chromium" in wrapper and "LD_LIBRARY_PATH" in wrapper
    ran = subprocess.run([str(prefix / "bin" / "chromedriver")], capture_output=True,
                         text=True, check=True)
    assert ran.stdout.strip() == "driver"
    assert not (prefix / "debs").exists()  # the joined packages are removed after unpacking
    assert src.exists()


def test_unpack_refuses_a_damaged_piece(tmp_path):
    src = _carried(tmp_path)
    piece = src / "p1" / "chromium_1.0_amd64.deb.piece-01"
    data = piece.read_bytes()
    piece.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    done = _unpack(str(src), str(tmp_path / "prefix"), cwd=tmp_path)
    assert done.returncode != 0 and "does not match SHA256SUMS" in done.stderr
    assert not (tmp_path / "prefix" / "bin" / "chromium").exists()
