"""Carry a run folder, its latest checkpoint included, from one lent GPU machine to the next in
parts small enough for a call's file limits (standard library only: it runs there too).

A lent machine is given back with its disk when a session ends (or ~30 s after its last call),
and a call returns at most 8 files of 16 MiB, 64 MiB together, and takes at most 64 MiB with it
(the working tree included). A run longer than one session's device time (issue 48 item 2:
"at least 30 minutes of training") therefore goes out in parts, waits here, and comes back in
parts to the next session's machine, where ``launch/run.py`` resumes it from its checkpoint as
it would on one machine. SmolLM2-135M's run folder is ~1.6 GB (float32 master weights and the
AdamW moments): ~26 calls out and ~40 in, ~4 s of held time each.

    # on the machine, in the session's last call (the run stopped: its checkpoint is final)
    python3 benchmarks/gpu/carry_run.py pack /tmp/runs/curve/babyai_curve /tmp/carry/babyai_curve
    python3 benchmarks/gpu/carry_run.py emit /tmp/carry/babyai_curve $OUT 0   # then 1, 2, ...
    # here, after each call (its files_at folder):
    python3 benchmarks/gpu/carry_run.py collect .carry/babyai_curve /work/.device/N
    # here, before the next session: folders of at most --mib to carry, one a call
    python3 benchmarks/gpu/carry_run.py groups .carry/babyai_curve --mib 40
    # on the next machine, a call per folder (carry [".carry/babyai_curve/in-000"], ...):
    mkdir -p /tmp/carry/babyai_curve && cp .carry/babyai_curve/in-000/* /tmp/carry/babyai_curve/
    # then, in the call that resumes it:
    python3 benchmarks/gpu/carry_run.py unpack /tmp/carry/babyai_curve /tmp/runs/curve

``pack``: a tar of RUN_DIR (named by its folder) without ``run.lock`` and without every
checkpoint step but the latest (``checkpoints/<step>/``, digits only: orbax's unfinished
writes have other names), split into ``part-00000``, ... of ``--part-mib`` MiB (10: six fill a
call going out, four a call coming in beside the ~21 MiB working tree), listed with
their sizes and sha256 (and the whole tar's) in ``carry.json``. ``emit``: ``carry.json`` and
call INDEX's parts (``--per-call``, 6: under the 64 MiB a call returns) copied into OUT.
``collect``: the parts and ``carry.json`` found in the folders given, each checked against
``carry.json`` (a damaged or foreign part is refused and named), copied into DEST; it says
which ``emit`` indexes are still missing. ``groups``: DEST's parts in folders ``in-000``, ...
of at most ``--mib`` MiB each (``carry.json`` in every one). ``unpack``: every part present,
of its size and sha256, and the whole tar's sha256, before anything is written; then the run
folder extracted beside its place in PARENT and renamed into it (a folder already there is
refused unless ``--replace``, which moves it aside), and the step it resumes from printed.
Exit 1 naming what is wrong.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from offline_bundle_files import sha256  # noqa: E402  (a file's hex sha256, read in blocks)

MANIFEST = "carry.json"
MIB = 1 << 20


def latest_step(run_dir: Path) -> int | None:
    """The largest finished checkpoint step of ``run_dir/checkpoints`` (folders named by digits
    alone), or None."""
    folder = run_dir / "checkpoints"
    steps = [int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit()] \
        if folder.is_dir() else []
    return max(steps) if steps else None


def _kept(run_dir: Path, step: int | None):
    """The tar filter: the run folder less ``run.lock`` and the checkpoint steps but ``step``."""
    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        parts = Path(info.name).parts[1:]  # below the run's own folder
        if parts == ("run.lock",):
            return None
        if len(parts) >= 2 and parts[0] == "checkpoints" and parts[1] != str(step):
            return None
        return info
    return keep


class _PartWriter(io.RawIOBase):
    """A write-only stream cut into ``part-NNNNN`` files of ``size`` bytes in ``stage``,
    hashing each part and the whole as it goes."""

    def __init__(self, stage: Path, size: int):
        self.stage, self.size = stage, size
        self.parts: list[dict] = []
        self.whole = hashlib.sha256()
        self._file = None
        self._hash = None
        self._left = 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        view = memoryview(data)
        while view:
            if self._left == 0:
                self._next()
            chunk = view[:self._left]
            self._file.write(chunk)
            self._hash.update(chunk)
            self.whole.update(chunk)
            self._left -= len(chunk)
            self.parts[-1]["bytes"] += len(chunk)
            view = view[len(chunk):]
        return len(data)

    def _next(self) -> None:
        self._finish()
        name = f"part-{len(self.parts):05d}"
        self._file = open(self.stage / name, "wb")  # closed by _finish
        self._hash, self._left = hashlib.sha256(), self.size
        self.parts.append({"name": name, "bytes": 0})

    def _finish(self) -> None:
        if self._file is not None:
            self._file.close()
            self.parts[-1]["sha256"] = self._hash.hexdigest()
            self._file = None

    def close(self) -> None:
        self._finish()
        super().close()


def pack(run_dir: Path, stage: Path, part_mib: float, per_call: int) -> int:
    """RUN_DIR as parts and ``carry.json`` in STAGE (module docstring)."""
    if not run_dir.is_dir():
        return _fail(f"{run_dir} is not a run folder")
    if stage.exists() and any(stage.iterdir()):
        return _fail(f"{stage} is not empty: pack into an empty folder")
    stage.mkdir(parents=True, exist_ok=True)
    step = latest_step(run_dir)
    writer = _PartWriter(stage, max(1, int(part_mib * MIB)))
    with tarfile.open(fileobj=writer, mode="w|") as tar:
        tar.add(run_dir, arcname=run_dir.name, filter=_kept(run_dir, step))
    writer.close()
    total = sum(p["bytes"] for p in writer.parts)
    manifest = {"run": run_dir.name, "step": step, "bytes": total,
                "sha256": writer.whole.hexdigest(), "per_call": per_call,
                "packed": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "parts": writer.parts}
    (stage / MANIFEST).write_text(json.dumps(manifest, indent=1))
    calls = -(-len(writer.parts) // per_call)
    print(f"packed {run_dir.name} (checkpoint step {step}): {total / MIB:.1f} MiB in "
          f"{len(writer.parts)} parts, {calls} emit call(s): indexes 0..{calls - 1}")
    return 0


def _manifest(folder: Path) -> dict:
    return json.loads((folder / MANIFEST).read_text())


def emit(stage: Path, out: Path, index: int) -> int:
    """``carry.json`` and call INDEX's parts copied from STAGE into OUT."""
    manifest = _manifest(stage)
    per_call, parts = int(manifest["per_call"]), manifest["parts"]
    calls = -(-len(parts) // per_call)
    if not 0 <= index < calls:
        return _fail(f"index {index} is outside 0..{calls - 1}")
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(stage / MANIFEST, out / MANIFEST)
    chosen = parts[index * per_call:(index + 1) * per_call]
    for part in chosen:
        shutil.copyfile(stage / part["name"], out / part["name"])
    print(f"emit {index + 1} of {calls}: {chosen[0]['name']} .. {chosen[-1]['name']}"
          + ("" if index + 1 < calls else " (the last)"))
    return 0


def _check_parts(folder: Path, manifest: dict, hashes: bool = True
                 ) -> tuple[list[str], list[str]]:
    """(missing part names, damaged part names) of ``folder`` against ``manifest``: sizes, and
    sha256s with ``hashes`` (``collect`` hashed each part as it copied it in)."""
    missing, damaged = [], []
    for part in manifest["parts"]:
        path = folder / part["name"]
        if not path.is_file():
            missing.append(part["name"])
        elif path.stat().st_size != part["bytes"] or (hashes and sha256(path) != part["sha256"]):
            damaged.append(part["name"])
    return missing, damaged


def collect(dest: Path, sources: list[Path]) -> int:
    """The parts in SOURCES, checked against ``carry.json``, copied into DEST."""
    manifests = [s / MANIFEST for s in sources if (s / MANIFEST).is_file()]
    if not manifests and not (dest / MANIFEST).is_file():
        return _fail(f"no {MANIFEST} in {', '.join(map(str, sources))} or {dest}")
    manifest = json.loads(manifests[0].read_text()) if manifests else _manifest(dest)
    for other in manifests[1:] + ([dest / MANIFEST] if (dest / MANIFEST).is_file() else []):
        if json.loads(other.read_text())["sha256"] != manifest["sha256"]:
            return _fail(f"{other} belongs to another packing of the run (its sha256 differs)")
    dest.mkdir(parents=True, exist_ok=True)
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=1))
    wanted = {p["name"]: p for p in manifest["parts"]}
    bad = []
    for source in sources:
        for path in sorted(source.glob("part-*")):
            part = wanted.get(path.name)
            if part is None or path.stat().st_size != part["bytes"] or \
                    sha256(path) != part["sha256"]:
                bad.append(str(path))
                continue
            shutil.copyfile(path, dest / path.name)
    missing, damaged = _check_parts(dest, manifest, hashes=False)
    per_call = int(manifest["per_call"])
    indexes = sorted({manifest["parts"].index(wanted[n]) // per_call for n in missing + damaged})
    print(f"{manifest['run']}: {len(manifest['parts']) - len(missing) - len(damaged)} of "
          f"{len(manifest['parts'])} parts in {dest}"
          + (f"; emit indexes still to call: {indexes}" if indexes else "; complete"))
    if bad:
        return _fail("refused (damaged, or not a part of this packing): " + ", ".join(bad))
    return 0


def groups(dest: Path, mib: float) -> int:
    """DEST's parts in folders ``in-NNN`` of at most ``mib`` MiB, one a call."""
    manifest = _manifest(dest)
    missing, damaged = _check_parts(dest, manifest)
    if missing or damaged:
        return _fail(f"{dest} is not complete: missing {missing}, damaged {damaged}")
    folders: list[list[dict]] = [[]]
    for part in manifest["parts"]:
        if part["bytes"] > mib * MIB:
            return _fail(f"{part['name']} ({part['bytes'] / MIB:.1f} MiB) is over --mib {mib}")
        if sum(p["bytes"] for p in folders[-1]) + part["bytes"] > mib * MIB:
            folders.append([])
        folders[-1].append(part)
    for k, members in enumerate(folders):
        folder = dest / f"in-{k:03d}"
        folder.mkdir(exist_ok=True)
        shutil.copyfile(dest / MANIFEST, folder / MANIFEST)
        for part in members:
            os.replace(dest / part["name"], folder / part["name"])
    print(f"{len(folders)} folders to carry, one a call: "
          + ", ".join(f"{dest}/in-{k:03d}" for k in range(len(folders))))
    return 0


def unpack(stage: Path, parent: Path, replace: bool) -> int:
    """STAGE's parts checked, joined and extracted into PARENT."""
    manifest = _manifest(stage)
    missing, damaged = _check_parts(stage, manifest)
    if missing or damaged:
        return _fail(f"{stage}: missing parts {missing}, damaged parts {damaged}; nothing written")
    whole = hashlib.sha256()
    for part in manifest["parts"]:
        with open(stage / part["name"], "rb") as f:
            while block := f.read(MIB):
                whole.update(block)
    if whole.hexdigest() != manifest["sha256"]:
        return _fail(f"{stage}: the joined parts' sha256 differs from {MANIFEST}'s")
    target = parent / manifest["run"]
    if target.exists() and not replace:
        return _fail(f"{target} exists: pass --replace to move it aside")
    parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".carry-", dir=parent))  # same disk: one rename
    try:
        with _JoinedParts(stage, manifest["parts"]) as stream, \
                tarfile.open(fileobj=stream, mode="r|") as tar:
            for member in tar:
                if Path(member.name).parts[:1] != (manifest["run"],):
                    return _fail(f"{member.name} lies outside the run's folder; nothing written")
                tar.extract(member, scratch, filter="data")
        if target.exists():
            os.replace(target, parent / f"{manifest['run']}.before-carry.{int(time.time())}")
        os.replace(scratch / manifest["run"], target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"unpacked {target} (checkpoint step {manifest['step']}): run the same command "
          "with --workdir there to resume it")
    return 0


class _JoinedParts(io.RawIOBase):
    """The parts of ``stage`` read one after the other as one stream."""

    def __init__(self, stage: Path, parts: list[dict]):
        self._paths = [stage / p["name"] for p in parts]
        self._file = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while True:
            if self._file is None:
                if not self._paths:
                    return 0
                self._file = open(self._paths.pop(0), "rb")
            n = self._file.readinto(buffer)
            if n:
                return n
            self._file.close()
            self._file = None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        super().close()


def _fail(message: str) -> int:
    print(f"carry_run: {message}", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack")
    p.add_argument("run_dir", type=Path)
    p.add_argument("stage", type=Path)
    p.add_argument("--part-mib", type=float, default=10.0)
    p.add_argument("--per-call", type=int, default=6)
    p = sub.add_parser("emit")
    p.add_argument("stage", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("index", type=int)
    p = sub.add_parser("collect")
    p.add_argument("dest", type=Path)
    p.add_argument("sources", type=Path, nargs="+")
    p = sub.add_parser("groups")
    p.add_argument("dest", type=Path)
    p.add_argument("--mib", type=float, default=40.0)
    p = sub.add_parser("unpack")
    p.add_argument("stage", type=Path)
    p.add_argument("parent", type=Path)
    p.add_argument("--replace", action="store_true")
    a = parser.parse_args(argv)
    if a.command == "pack":
        return pack(a.run_dir, a.stage, a.part_mib, a.per_call)
    if a.command == "emit":
        return emit(a.stage, a.out, a.index)
    if a.command == "collect":
        return collect(a.dest, a.sources)
    if a.command == "groups":
        return groups(a.dest, a.mib)
    return unpack(a.stage, a.parent, a.replace)


if __name__ == "__main__":
    sys.exit(main())
