"""Rewind a run's per-step logs to its checkpoint, so that a resumed run logs every step once.

A run killed after step ``s`` was logged but before checkpoint ``s`` was written resumes from an
earlier checkpoint ``C`` and runs steps ``C+1 .. s`` again. Without a rewind their rows would be
in the logs twice. ``rewind_run_logs`` drops, from each JSON-lines log of the
workdir, the rows the resumed session writes again:

* ``metrics.jsonl``: rows with ``step > C`` (a training step's row has the step of the update
  it ends, ``1..C`` done);
* ``trajectories_train*.jsonl``: rows with ``step > C`` (the episodes of update ``s`` carry
  ``step = s``, the number the terminal's ``[step s/n]`` shows);
* ``trajectories_eval*.jsonl``: rows with ``step > C`` (an evaluation carries the number of
  updates behind it);
* evaluation rows at ``step == C`` too (eval trajectories, and metric rows with ``eval/`` keys)
  when the resumed session evaluates step ``C`` again (``redo_eval``: the opening evaluation of
  a run resumed at 0, or the final evaluation of a run that was killed during it).

A line that is not a JSON object (a row cut short by the kill) is dropped too. Each file is
rewritten through a temporary file in the same directory, flushed to disk and renamed over the
original (``os.replace``), so a kill during the rewind leaves either the old or the new file.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any, Callable

METRICS_FILE = "metrics.jsonl"


def rewind_jsonl(path: str, keep: Callable[[dict[str, Any]], bool]) -> int:
    """Keep the rows of the JSON-lines file ``path`` for which ``keep(row)`` is true (and drop
    lines that are not JSON objects), atomically. Returns how many lines were dropped; the
    file is not touched when none is (or when it does not exist)."""
    try:
        with open(path, "rb") as f:
            lines = f.read().split(b"\n")
    except FileNotFoundError:
        return 0
    kept: list[bytes] = []
    dropped = 0
    for line in lines:
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if isinstance(row, dict) and keep(row):
            kept.append(line)
        else:
            dropped += 1
    if not dropped and (not lines or lines[-1] == b""):
        return 0
    tmp = f"{path}.rewind{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(b"".join(line + b"\n" for line in kept))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return dropped


def _step(row: dict[str, Any]) -> int:
    step = row.get("step")
    return int(step) if isinstance(step, (int, float)) and not isinstance(step, bool) else -1


def _is_eval_metrics(row: dict[str, Any]) -> bool:
    return any(k.startswith("eval/") for k in row)


def rewind_run_logs(workdir: str, step: int, redo_eval: bool = False,
                    metrics: bool = True, trajectory_suffix: str | None = "") -> dict[str, int]:
    """Rewind the logs of ``workdir`` to checkpoint ``step`` (module docstring); returns the
    number of dropped lines per file name (files with none left out).

    ``metrics``: also rewind ``metrics.jsonl`` (the process that writes it); ``trajectory_suffix``:
    which trajectory files to rewind (``""``: ``trajectories_<kind>.jsonl``; ``".process1"``:
    that process's; ``None``: every ``trajectories_*.jsonl``).
    """
    dropped: dict[str, int] = {}

    def rewind(path: str, keep: Callable[[dict[str, Any]], bool]) -> None:
        n = rewind_jsonl(path, keep)
        if n:
            dropped[os.path.basename(path)] = n

    if metrics:
        rewind(os.path.join(workdir, METRICS_FILE),
               lambda r: _step(r) < step or _step(r) == step and not (
                   redo_eval and _is_eval_metrics(r)))
    for kind in ("train", "eval"):
        pattern = (f"trajectories_{kind}*.jsonl" if trajectory_suffix is None
                   else f"trajectories_{kind}{trajectory_suffix}.jsonl")
        for path in sorted(glob.glob(os.path.join(workdir, pattern))):
            if kind == "train":
                rewind(path, lambda r: _step(r) <= step)
            else:
                rewind(path, lambda r: _step(r) < step or _step(r) == step and not redo_eval)
    return dropped
