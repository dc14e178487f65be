"""Give the host memory a phase of a run freed back to the operating system.

glibc's ``malloc`` keeps freed memory in the arena of the thread that allocated it: after a
learner update (run in a worker thread) or a checkpoint write (orbax's threads), the freed
temporaries stay in the process's RSS, and the next phase, allocating from other threads (the
rollout engine's), cannot reuse them. ``malloc_trim(0)`` returns the free pages of every arena.
On the README's CPU taste run it returned most of a GB after an update and after a checkpoint
write (docs/PERFORMANCE.md, "Figures moved out of the code's comments"); the trainer calls
:func:`release_freed_memory` after each update and before the final evaluation.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL | None:
    """The C library if it has ``malloc_trim`` (glibc), else None (macOS, musl)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") else None


def release_freed_memory() -> bool:
    """``malloc_trim(0)``: free pages of every malloc arena back to the OS (a few ms).
    Returns whether it ran (False where the C library has no ``malloc_trim``)."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


__all__ = ["release_freed_memory"]
