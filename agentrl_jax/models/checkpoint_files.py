"""Opening the files of a checkpoint directory safely: every file a loader reads (config.json,
the safetensors index, ``model.safetensors``, each index shard) is named relative to the
checkpoint directory, resolved (symbolic links followed) and confined to it by one function,
``confined_path``, and opened by ``open_regular_file`` only if it is a regular file: never a
FIFO, device or socket, and without blocking (``O_NONBLOCK``, then ``fstat``), so a FIFO named
``model.safetensors`` is refused at once instead of freezing the reader until someone writes.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from typing import Any, Iterator

from agentrl_jax.models.weights import CheckpointError

#: config.json / the safetensors index are refused above this size (far above any real one)
MAX_JSON_BYTES = 64 * 1024**2

_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | \
    getattr(os, "O_NOFOLLOW", 0)


def confined_path(directory: str, name: Any, where: str) -> str:
    """The real path of ``name`` (a relative file name, e.g. an index's shard entry) inside
    ``directory``, with every symbolic link resolved; ``CheckpointError`` naming ``where`` if
    ``name`` is not a plain relative name or resolves outside the directory (a checkpoint must
    not make the loader read elsewhere). Nothing is opened."""
    if not isinstance(name, str) or not name or "\0" in name:
        raise CheckpointError(f"{where}: file names must be non-empty strings, got {name!r}")
    if os.path.isabs(name) or ".." in name.replace("\\", "/").split("/"):
        raise CheckpointError(f"{where}: {name!r} is not a relative path inside the checkpoint")
    root = os.path.realpath(directory)
    path = os.path.realpath(os.path.join(root, name))
    if os.path.commonpath([root, path]) != root:
        raise CheckpointError(f"{where}: {name!r} resolves outside the checkpoint directory "
                              f"{root} (copy the file in, e.g. cp -L, instead of linking it)")
    return path


def _kind(mode: int) -> str:
    for test, kind in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return kind
    return "not a regular file"


def check_regular_file(path: str) -> None:
    """``CheckpointError`` unless ``path`` (symbolic links followed: a path the operator
    chose, e.g. ``--model x.gguf``) is a regular file, so that opening it cannot block."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e.strerror})") from None
    if not stat.S_ISREG(mode):
        raise CheckpointError(f"{path}: is {_kind(mode)}, not a regular file")


@contextlib.contextmanager
def open_regular_file(path: str) -> Iterator[tuple[int, int]]:
    """``(fd, size)`` of ``path`` opened read-only, closed on exit. ``path`` must be a
    regular file (checked with ``lstat`` before opening, so no device is ever opened, and with
    ``fstat`` on the descriptor after, so a file swapped in between is caught); the open never
    blocks (``O_NONBLOCK``) and follows no final symbolic link (``O_NOFOLLOW``: pass a path
    from ``confined_path``). ``CheckpointError`` for anything else, ``OSError``s included."""
    try:
        mode = os.lstat(path).st_mode
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e.strerror})") from None
    if not stat.S_ISREG(mode):
        raise CheckpointError(f"{path}: is {_kind(mode)}, not a regular file")
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot open ({e.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CheckpointError(f"{path}: is {_kind(info.st_mode)}, not a regular file")
        yield fd, info.st_size
    finally:
        os.close(fd)


def read_into(fd: int, buffer: memoryview, offset: int, path: str) -> None:
    """Fill ``buffer`` with the bytes of ``fd`` from ``offset`` (``os.preadv``: no shared
    file position, no copy, the GIL released while reading); ``CheckpointError`` if the file
    ends first."""
    done = 0
    while done < len(buffer):
        try:
            got = os.preadv(fd, [buffer[done:done + (1 << 30)]], offset + done)
        except OSError as e:
            raise CheckpointError(f"{path}: read failed at byte {offset + done} "
                                  f"({e.strerror})") from None
        if not got:
            raise CheckpointError(f"{path}: ends at byte {offset + done}, expected "
                                  f"{offset + len(buffer)} (truncated while loading?)")
        done += got


def read_exactly(fd: int, size: int, offset: int, path: str) -> bytes:
    """``size`` bytes of ``fd`` at ``offset`` (see ``read_into``)."""
    buffer = bytearray(size)
    read_into(fd, memoryview(buffer), offset, path)
    return bytes(buffer)


def read_json_object(directory: str, name: str, what: str,
                     max_bytes: int = MAX_JSON_BYTES) -> dict[str, Any]:
    """The JSON object in ``directory/name`` (confined, a regular file of at most
    ``max_bytes``); ``CheckpointError`` if it is anything else."""
    path = confined_path(directory, name, what)
    with open_regular_file(path) as (fd, size):
        if size > max_bytes:
            raise CheckpointError(f"{path}: {what} is larger than {max_bytes} bytes")
        raw = read_exactly(fd, size, 0, path)
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError, nesting
        raise CheckpointError(f"{path}: {what} is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: {what} must be a JSON object, got {type(data).__name__}")
    return data
