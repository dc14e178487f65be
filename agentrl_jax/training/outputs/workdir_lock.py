"""One run per workdir: an exclusive lock on ``<workdir>/run.lock``.

Two runs on one workdir would append to each other's logs, rewind them under each other and
race in the checkpoint saves. ``launch/run.py`` takes this lock before anything starts (on the
main process of a multi-host run) and holds it to the end:

* the lock is ``fcntl.flock(LOCK_EX | LOCK_NB)`` on the open lock file, so the kernel releases
  it when the holder dies, however it dies (kill -9 included): a lock is never stale by
  accident, and nothing is guessed from pids;
* the file holds a one-line JSON record of the holder (pid, host, start time, command) for the
  messages: a second run is refused with :class:`WorkdirBusy` (``"workdir X is in use by pid
  1234 on host h since ...; ..."``), and a record left by a holder that did not release (killed,
  crashed) is reported when the next run takes the lock over (:attr:`WorkdirLock.stale`);
* the holder empties the record when it releases the lock.

``flock`` holds between processes of one host and on most network filesystems (NFS v4 emulates
it with POSIX locks); a filesystem without locks raises :class:`WorkdirLockError`.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import time
from typing import Any

LOCK_FILE = "run.lock"


class WorkdirLockError(RuntimeError):
    """The lock file could not be created or locked (unwritable workdir, no locks); the
    message is one line."""


class WorkdirBusy(WorkdirLockError):
    """Another live process holds the workdir's lock; ``holder`` is its record ({} when it
    had not written it yet)."""

    def __init__(self, message: str, holder: dict[str, Any]):
        super().__init__(message)
        self.holder = holder


def describe(record: dict[str, Any]) -> str:
    """``"pid 1234 on host h (started 2026-11-27T20:03:31+0000)"`` from a lock record."""
    text = f"pid {record.get('pid', '?')}"
    if record.get("host"):
        text += f" on host {record['host']}"
    if record.get("started"):
        text += f" (started {record['started']})"
    return text


def _read_record(fd: int) -> dict[str, Any]:
    os.lseek(fd, 0, os.SEEK_SET)
    data = b""
    while chunk := os.read(fd, 65536):
        data += chunk
    try:
        record = json.loads(data.decode("utf-8", "replace") or "null")
    except ValueError:
        return {"unreadable": data[:200].decode("utf-8", "replace")} if data.strip() else {}
    return record if isinstance(record, dict) else {}


class WorkdirLock:
    """The exclusive lock of one workdir, for one process.

    ``acquire()`` raises :class:`WorkdirBusy` when a live process holds it; otherwise it
    holds the lock, writes this process's record and sets :attr:`stale` to the record a dead
    holder left behind (``None`` when the lock was released cleanly or never taken).
    ``release()`` empties the record and unlocks; also a context manager.
    """

    def __init__(self, workdir: str):
        self.workdir = os.path.abspath(workdir)
        self.path = os.path.join(self.workdir, LOCK_FILE)
        self.fd: int | None = None
        self.stale: dict[str, Any] | None = None
        self.record: dict[str, Any] = {}

    def acquire(self) -> "WorkdirLock":
        if self.fd is not None:
            return self
        try:
            os.makedirs(self.workdir, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            raise WorkdirLockError(f"cannot create the lock file {self.path}: "
                                   f"{error.strerror or error}") from error
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            holder = _read_record(fd)
            os.close(fd)
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                who = describe(holder) if holder.get("pid") else "another process"
                raise WorkdirBusy(
                    f"workdir {self.workdir} is in use by {who}; one run per workdir: wait for "
                    f"it to end, stop it, or pass another --workdir", holder) from None
            raise WorkdirLockError(f"cannot lock {self.path}: {error.strerror or error}") from error
        previous = _read_record(fd)
        self.stale = previous or None
        self.record = {"pid": os.getpid(), "host": socket.gethostname(),
                       "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                       "command": " ".join(sys.argv)[:500]}
        try:
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, (json.dumps(self.record) + "\n").encode())
        except OSError:  # a full disk: the lock holds all the same, only the record is missing
            pass
        self.fd = fd
        return self

    def stale_message(self) -> str | None:
        """The line that reports a taken-over stale lock (``None`` when there was none)."""
        if not self.stale:
            return None
        return (f"workdir {self.workdir}: took over the lock left by {describe(self.stale)}, "
                "which is no longer running (it did not end cleanly)")

    def release(self) -> None:
        """Empty the record and unlock (idempotent; never raises)."""
        fd, self.fd = self.fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)
        except OSError:
            pass
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        except OSError:
            pass
        os.close(fd)

    def __enter__(self) -> "WorkdirLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
