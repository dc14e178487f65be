"""Write failures of a run's workdir (disk full, quota, read-only): one line instead of a hang
or pages of tracebacks.

A run writes its workdir all the time: trajectory and metric logs every step, TensorBoard
events, orbax checkpoints in background threads. When the filesystem fills up, these writes
fail in different shapes: ``OSError(errno.ENOSPC)`` from Python's own writes, and from
orbax a ``ValueError`` of tensorstore whose text carries ``[os_error_code='28']`` (raised by a
later ``save`` or ``wait_until_finished``, after orbax has logged the traceback of every
thread it ran). :func:`storage_error` recognises all of them in an exception and its chain;
the trainer turns them into a :class:`StorageFailure` with one line (what failed, where, the
last good checkpoint), stops its servers and ``launch/run.py`` exits with
:data:`EXIT_STORAGE_FAILED`. :class:`QuietStorageErrors` keeps orbax's tracebacks of such a
failure out of the log (the one line says it all).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import re
import sys
import threading
from typing import Any, Awaitable, Callable, Iterator, TextIO

#: exit code of ``launch/run.py`` when the workdir could not be written (disk full, ...)
EXIT_STORAGE_FAILED = 4

#: errno values that mean "the filesystem refuses writes", not a bug of the caller
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})
# tensorstore (orbax) reports the OS error in its message: "... [os_error_code='28']"
_OS_ERROR_CODE = re.compile(r"os_error_code='?(\d+)'?")


class StorageFailure(RuntimeError):
    """The workdir could not be written; the message is the one line to print."""


def chain(error: BaseException) -> Iterator[BaseException]:
    """``error``, its causes / contexts and the members of exception groups, each once."""
    seen: set[int] = set()
    todo = [error]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo.extend(getattr(e, "exceptions", ()) or ())
        todo.extend([e.__cause__, e.__context__])


def error_code(error: BaseException) -> int | None:
    """The errno of one exception: ``OSError.errno``, or the ``os_error_code`` tensorstore puts
    in its message; ``None`` when it carries none."""
    if isinstance(error, OSError) and error.errno is not None:
        return error.errno
    match = _OS_ERROR_CODE.search(str(error))
    return int(match.group(1)) if match else None


def storage_error(error: BaseException) -> BaseException | None:
    """The first exception in ``error``'s chain that is a refused write (errno in
    :data:`STORAGE_ERRNOS`), or ``None``."""
    for e in chain(error):
        if error_code(e) in STORAGE_ERRNOS:
            return e
    return None


def reason(error: BaseException) -> str:
    """A short text for ``error``: ``"No space left on device"`` for a refused write (also
    inside a tensorstore message), else ``"<Type>: <first line>"`` (at most 200 characters)."""
    code = error_code(error)
    if code is not None and code in STORAGE_ERRNOS:
        return os.strerror(code)
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    text = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def failed_path(error: BaseException) -> str | None:
    """The file a refused write was for: ``OSError.filename``, or the quoted path of a
    tensorstore message (``Failed writing: "<path>"``)."""
    for e in chain(error):
        if isinstance(e, OSError) and e.filename:
            return str(e.filename)
        match = re.search(r'local file "([^"]+)"', str(e))
        if match:
            return match.group(1)
    return None


def with_path(error: OSError, path: str) -> OSError:
    """``error`` with its ``filename`` set to ``path`` when it has none (a failed ``write`` of
    an open file names no file); raise the result ``from error``."""
    if error.filename:
        return error
    return type(error)(error.errno, error.strerror or str(error), path)


class QuietStorageErrors(logging.Filter):
    """Drops log records (orbax's thread tracebacks, through absl) about a refused write: the
    trainer reports the failure itself, in one line. Other records pass."""

    #: the ``sys.stderr`` that :func:`quiet_storage_errors` wrapped (``None``: none)
    stderr: TextIO | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # a malformed record is not ours to judge
            return True
        if _mentions_storage_error(text):
            return False
        if record.exc_info and record.exc_info[1] is not None:
            return storage_error(record.exc_info[1]) is None
        return True


def _mentions_storage_error(text: str) -> bool:
    match = _OS_ERROR_CODE.search(text)
    if match and int(match.group(1)) in STORAGE_ERRNOS:
        return True
    return any(os.strerror(code) in text for code in STORAGE_ERRNOS)


#: the loggers whose records :func:`quiet_storage_errors` filters: orbax logs through absl;
#: asyncio reports the futures of orbax's other writes ("Future exception was never retrieved")
QUIET_LOGGERS = ("absl", "orbax", "asyncio")
_TRACEBACK = "Traceback (most recent call last):"
_CLOSED_LOOP = "RuntimeError: Event loop is closed"


class DropClosedLoopTracebacks:
    """A text stream (``sys.stderr``) that drops one kind of traceback: ``RuntimeError: Event
    loop is closed`` raised inside asyncio's ``call_soon_threadsafe`` and printed by native
    code.

    When one write of an orbax save fails (a full disk), orbax closes the event loop that ran
    the save while tensorstore still has the other writes in flight; each of them, finishing,
    calls ``call_soon_threadsafe`` on the closed loop from a tensorstore thread, which prints
    that traceback (tens of them for one save of a small model). They say nothing the one-line
    failure does not. Each thread's traceback is held until its last line decides: the
    exact kind above (every frame in ``asyncio/base_events.py``) is dropped, anything else is
    written as it was.
    """

    def __init__(self, stream: TextIO):
        self.stream = stream
        self._local = threading.local()

    def write(self, text: str) -> int:
        held = getattr(self._local, "held", None)
        if held is None:
            if not text.startswith(_TRACEBACK):
                return self.stream.write(text)
            held = self._local.held = []
        held.append(text)
        block = "".join(held)
        lines = block.split("\n")
        last = lines[-2] if block.endswith("\n") and len(lines) > 2 else None
        if last is None or last.startswith(" "):
            return len(text)  # the traceback goes on
        self._local.held = None
        frames = [ln for ln in lines[1:-2] if ln.startswith("  File ")]
        if last == _CLOSED_LOOP and frames and all("asyncio/base_events.py" in ln
                                                   for ln in frames):
            return len(text)
        self.stream.write(block)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def quiet_storage_errors() -> QuietStorageErrors:
    """Install a :class:`QuietStorageErrors` on :data:`QUIET_LOGGERS` and a
    :class:`DropClosedLoopTracebacks` on ``sys.stderr`` (remove both with :func:`unquiet`)."""
    quiet = QuietStorageErrors()
    for name in QUIET_LOGGERS:
        logging.getLogger(name).addFilter(quiet)
    if not isinstance(sys.stderr, DropClosedLoopTracebacks):
        quiet.stderr = sys.stderr
        sys.stderr = DropClosedLoopTracebacks(sys.stderr)
    return quiet


def unquiet(quiet: QuietStorageErrors) -> None:
    for name in QUIET_LOGGERS:
        logging.getLogger(name).removeFilter(quiet)
    if quiet.stderr is not None and isinstance(sys.stderr, DropClosedLoopTracebacks):
        sys.stderr = quiet.stderr


def failure_message(error: BaseException, *, step_done: int, total: int,
                    last_checkpoint: int | None, workdir: str) -> str | None:
    """The one line for a run ended by ``error`` when it is a failed checkpoint save or a
    refused write anywhere in its chain (``None`` otherwise).

    ``step_done``: the last training step finished; ``last_checkpoint``: the step of the
    newest finished checkpoint (``None``: none).
    """
    from agentrl_jax.learner.checkpoint import CheckpointSaveError

    save = next((e for e in chain(error) if isinstance(e, CheckpointSaveError)), None)
    refused = storage_error(error)
    if save is None and refused is None:
        return None
    if save is not None:
        cause = storage_error(save) or save.__cause__ or save
        what = f"checkpoint save of step {save.step} failed: {reason(cause)} ({save.path})"
    else:
        where = failed_path(refused)
        when = (f"during step {step_done + 1}/{total}" if step_done < total
                else f"after step {step_done}/{total}")
        what = f"writing {where or 'the workdir'} failed {when}: {reason(refused)}"
    last = (f"the last good checkpoint is step {last_checkpoint}" if last_checkpoint is not None
            else "no checkpoint was written")
    resume = ("free some space, then the same command resumes from it"
              if last_checkpoint is not None
              else "free some space, then the same command starts it again")
    if refused is None or error_code(refused) != errno.ENOSPC:
        resume = resume.replace("free some space", "fix the workdir")
    return (f"{what}; {last}; environment servers and rollout engine stopped; {resume} "
            f"(workdir {workdir})")



async def watched(work: Awaitable[Any], check: Callable[[], None],
                  interval_s: float = 1.0) -> Any:
    """``await work``, calling ``check`` (in a worker thread) every ``interval_s`` seconds
    meanwhile; when ``check`` raises (a checkpoint's background write failed), ``work`` is
    cancelled and that error raised at once, instead of at the next save, a step later."""
    main = asyncio.ensure_future(work)

    async def watch() -> None:
        while True:
            await asyncio.sleep(interval_s)
            await asyncio.to_thread(check)

    watcher = asyncio.ensure_future(watch())
    try:
        await asyncio.wait({main, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if main.done():
            return main.result()
        main.cancel()
        await asyncio.gather(main, return_exceptions=True)
        return watcher.result()  # raises check's error
    finally:
        for task in (watcher, main):
            if not task.done():
                task.cancel()
            await asyncio.gather(task, return_exceptions=True)
