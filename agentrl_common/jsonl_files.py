"""JSON-lines files, plain (``.jsonl``) or gzip-compressed (``.jsonl.gz``): the one way a run's
trajectory logs are written, found and read (the trainer, its resume, the viewer, reports and
benchmarks all use this module).

A compressed file is a sequence of gzip members, one per :func:`append_lines` call (a training
step's episodes), each flushed to disk when written: a run killed while writing leaves every
earlier member whole and a cut-off last one, of which :func:`iter_lines` still yields the
complete lines (what ``zlib`` could decompress). Any gzip reader (``gzip.open``, ``zcat``) reads
a file of whole members as one stream.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import zlib
from typing import Any, BinaryIO, Iterable, Iterator

GZIP_SUFFIX = ".gz"
_GZIP_WBITS = 31  # zlib: a gzip header and trailer
_READ_CHUNK = 8 << 20
#: gzip level of the trajectory logs: 6 (zlib's default) compresses JSON nearly as well as 9
GZIP_LEVEL = 6
#: ``trajectories_<kind>[.process<i>].jsonl[.gz]`` (the trainer's logs)
TRAJECTORY_FILE = re.compile(r"^trajectories_(train|eval)(\.process\d+)?\.jsonl(\.gz)?$")


def is_gzip(path: str) -> bool:
    """Whether ``path`` names a compressed file (by its ``.gz`` suffix)."""
    return path.endswith(GZIP_SUFFIX)


def trajectory_file_name(kind: str, suffix: str = "", compressed: bool = True) -> str:
    """``trajectories_<kind><suffix>.jsonl`` (``.gz`` when ``compressed``); ``suffix``: ``""``
    or ``".process<i>"``."""
    return f"trajectories_{kind}{suffix}.jsonl" + (GZIP_SUFFIX if compressed else "")


def trajectory_files(run_dir: str, kind: str | None = None) -> list[str]:
    """The trajectory logs of ``run_dir`` (plain and compressed, every process), sorted;
    ``kind``: ``"train"`` / ``"eval"`` only (None: both)."""
    try:
        names = os.listdir(run_dir)
    except OSError:
        return []
    out = []
    for name in sorted(names):
        m = TRAJECTORY_FILE.match(name)
        if m and (kind is None or m.group(1) == kind):
            out.append(os.path.join(run_dir, name))
    return out


def append_lines(path: str, lines: Iterable[bytes], fsync: bool = False) -> None:
    """Append ``lines`` (each without its newline) to ``path``: plain, or for a ``.gz`` path
    one gzip member holding them all; flushed (and ``fsync``-ed when asked) before returning,
    so that a kill afterwards loses nothing of it."""
    data = b"".join(line + b"\n" for line in lines)
    if not data:
        return
    if is_gzip(path):
        data = gzip.compress(data, compresslevel=GZIP_LEVEL, mtime=0)
    with open(path, "ab") as f:
        f.write(data)
        f.flush()
        if fsync:
            os.fsync(f.fileno())


def iter_gzip_members(f: BinaryIO, start: int = 0, partial: bool = False
                      ) -> Iterator[tuple[int, int | None, bytes]]:
    """``(offset, length, data)`` of each gzip member of ``f`` from byte ``start``: its
    compressed position and size and its decompressed bytes. Stops at the end of the file, at
    a member cut short (a killed writer) or at bytes that are not gzip; with ``partial`` that
    last member is yielded too, with ``length=None`` and what could be decompressed of it."""
    f.seek(start)
    pos = member_start = start
    decomp = zlib.decompressobj(_GZIP_WBITS)
    out: list[bytes] = []
    while True:
        block = f.read(_READ_CHUNK)
        if not block:
            break
        data = block
        while data:
            try:
                out.append(decomp.decompress(data))
            except zlib.error:
                if partial and out:
                    yield member_start, None, b"".join(out)
                return
            if not decomp.eof:
                pos += len(data)
                break
            pos += len(data) - len(decomp.unused_data)
            yield member_start, pos - member_start, b"".join(out)
            data, out, member_start = decomp.unused_data, [], pos
            decomp = zlib.decompressobj(_GZIP_WBITS)
    if partial and any(out):
        yield member_start, None, b"".join(out)


def iter_lines(path: str) -> Iterator[bytes]:
    """The lines (without newline, blank ones skipped) of a plain or ``.gz`` file, the last one
    too when its newline is missing (a plain file's last write, or what a cut-off gzip member
    decompresses to): a line cut short is not valid JSON, which :func:`iter_records` skips, so
    every complete record is read and no broken one."""
    with open(path, "rb") as f:
        if is_gzip(path):
            for _, _, data in iter_gzip_members(f, partial=True):
                yield from (line for line in data.split(b"\n") if line.strip())
            return
        carry = b""
        while True:
            block = f.read(_READ_CHUNK)
            if not block:
                break
            lines = (carry + block).split(b"\n")
            carry = lines.pop()
            yield from (line for line in lines if line.strip())
        if carry.strip():
            yield carry


def iter_records(path: str) -> Iterator[dict[str, Any]]:
    """The JSON objects of :func:`iter_lines` (lines that are not one are skipped)."""
    for line in iter_lines(path):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            yield row


def read_records(path: str) -> list[dict[str, Any]]:
    """:func:`iter_records` as a list ([] when ``path`` does not exist)."""
    try:
        return list(iter_records(path))
    except FileNotFoundError:
        return []


def is_whole(path: str) -> bool:
    """Whether every byte of ``path`` belongs to a complete line (a plain file ending with a
    newline, or a gzip file of complete members each ending with one)."""
    size = os.path.getsize(path)
    if not size:
        return True
    with open(path, "rb") as f:
        if not is_gzip(path):
            f.seek(size - 1)
            return f.read(1) == b"\n"
        end = 0
        for offset, length, data in iter_gzip_members(f, partial=True):
            if length is None or not data.endswith(b"\n"):
                return False
            end = offset + length
    return end == size


def write_lines_atomic(path: str, members: Iterable[list[bytes]]) -> None:
    """Replace ``path`` by ``members``' lines (for a ``.gz`` path one gzip member per list)
    through a temporary file flushed to disk and renamed over it: a kill leaves the old file
    or the new one."""
    tmp = f"{path}.rewrite{os.getpid()}"
    with open(tmp, "wb") as f:
        for lines in members:
            data = b"".join(line + b"\n" for line in lines)
            if data:
                f.write(gzip.compress(data, compresslevel=GZIP_LEVEL, mtime=0)
                        if is_gzip(path) else data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# --- committed run files: plain or gzip-compressed, found by their plain name -----------------

#: a JSON-lines run file larger than this is stored gzip-compressed when committed to
#: ``results/`` (the GPU machine copies the whole tracked tree under a 64 MiB limit)
COMPRESS_ABOVE_BYTES = 64 << 10
#: gzip level of committed run files (``gzip -n -9``: best ratio, no name, no time stamp)
STORED_GZIP_LEVEL = 9


def find_run_file(folder: str, name: str) -> str | None:
    """The path of the run file ``name`` (e.g. ``"metrics.jsonl"``) in ``folder``: the plain
    file, else its compressed copy ``name + ".gz"``; None when neither exists. ``name`` may
    itself end with ``.gz`` (then only that file is looked for)."""
    candidates = [name] if is_gzip(name) else [name, name + GZIP_SUFFIX]
    for candidate in candidates:
        path = os.path.join(folder, candidate)
        if os.path.isfile(path):
            return path
    return None


def run_file(folder: str, name: str) -> str:
    """:func:`find_run_file`, raising ``FileNotFoundError`` naming both places looked at when
    neither the plain nor the compressed file exists."""
    path = find_run_file(folder, name)
    if path is None:
        plain = os.path.join(folder, name)
        raise FileNotFoundError(
            f"no {name} in {folder}: neither {plain} nor {plain}{GZIP_SUFFIX} exists")
    return path


def read_run_file(folder: str, name: str, missing_ok: bool = False) -> list[dict[str, Any]]:
    """The JSON objects of the run file ``name`` of ``folder``, plain or ``.gz``
    (:func:`run_file`, :func:`iter_records`); ``missing_ok``: [] instead of the error when
    neither exists."""
    if missing_ok and find_run_file(folder, name) is None:
        return []
    return list(iter_records(run_file(folder, name)))


def run_file_name(name: str) -> str:
    """``name`` without its ``.gz`` suffix: the plain name a run file is known by."""
    return name[:-len(GZIP_SUFFIX)] if is_gzip(name) else name


def store_compact(path: str, above: int = COMPRESS_ABOVE_BYTES) -> str:
    """Store the plain JSON-lines file ``path`` as committed run files are kept: over
    ``above`` bytes it is replaced by ``path + ".gz"`` (``gzip -n -9``, deterministic; written
    to a temporary file, checked to decompress to the same bytes, then renamed, and only then is
    the plain file removed), else it stays plain and a stale ``.gz`` copy of an earlier run is
    removed. Returns the path kept."""
    packed = path + GZIP_SUFFIX
    if os.path.getsize(path) <= above:
        if os.path.exists(packed):
            os.remove(packed)
        return path
    with open(path, "rb") as f:
        data = f.read()
    compressed = gzip.compress(data, compresslevel=STORED_GZIP_LEVEL, mtime=0)
    if gzip.decompress(compressed) != data:  # pragma: no cover - zlib's own guarantee
        raise OSError(f"{packed}: the compressed copy does not decompress to {path}")
    tmp = f"{packed}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(compressed)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, packed)
    os.remove(path)
    return packed


def store_compact_tree(root: str, above: int = COMPRESS_ABOVE_BYTES) -> list[str]:
    """:func:`store_compact` for every plain ``*.jsonl`` file under ``root`` (recursively);
    returns the paths now compressed."""
    out = []
    for folder, _, names in os.walk(root):
        for name in sorted(names):
            if name.endswith(".jsonl"):
                kept = store_compact(os.path.join(folder, name), above)
                if is_gzip(kept):
                    out.append(kept)
    return out
