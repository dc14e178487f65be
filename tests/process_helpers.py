"""Finding the processes a test's subprocess started (shared by the launch tests)."""

from __future__ import annotations

import os


def processes_with(marker: str) -> list[int]:
    """Living processes started with ``marker`` in their environment (a server started by a
    run inherits its environment, so a run given ``AGENTRL_TEST_MARKER=<marker>`` leaves
    none behind iff this is empty); Linux ``/proc`` only."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found
