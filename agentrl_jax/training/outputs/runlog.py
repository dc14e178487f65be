"""Rewind a run's per-step logs to its checkpoint, so that a resumed run logs every step once.

A run killed after step ``s`` was logged but before checkpoint ``s`` was written resumes from an
earlier checkpoint ``C`` and runs steps ``C+1 .. s`` again. Without a rewind their rows would be
in the logs twice. ``rewind_run_logs`` drops, from each JSON-lines log of the
workdir, the rows the resumed session writes again:

* ``metrics.jsonl``: rows with ``step > C`` (a training step's row has the step of the update
  it ends, ``1..C`` done);
* ``trajectories_train*.jsonl[.gz]``: rows with ``step > C`` (the episodes of update ``s`` carry
  ``step = s``, the number the terminal's ``[step s/n]`` shows);
* ``trajectories_eval*.jsonl[.gz]``: rows with ``step > C`` (an evaluation carries the number of
  updates behind it);
* evaluation rows at ``step == C`` too (eval trajectories, and metric rows with ``eval/`` keys)
  when the resumed session evaluates step ``C`` again (``redo_eval``: the opening evaluation of
  a run resumed at 0, or the final evaluation of a run that was killed during it).

A line that is not a JSON object (a row cut short by the kill) is dropped too, in a plain
file or in a compressed log's cut-off last gzip member. Each file is
rewritten through a temporary file in the same directory, flushed to disk and renamed over the
original (``os.replace``), so a kill during the rewind leaves either the old or the new file.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable

from agentrl_common.jsonl_files import (TRAJECTORY_FILE, is_whole, iter_lines,
                                        trajectory_files, write_lines_atomic)

METRICS_FILE = "metrics.jsonl"


def rewind_jsonl(path: str, keep: Callable[[dict[str, Any]], bool]) -> int:
    """Keep the rows of the JSON-lines file ``path`` (plain or ``.jsonl.gz``) for which
    ``keep(row)`` is true (and drop lines that are not JSON objects), atomically. Returns how
    many lines were dropped; the file is not touched when none is and every byte of it belongs
    to a whole line (or when it does not exist). A gzip file's cut-off last member (a killed
    run) is rewritten without its incomplete line, so that what the resumed run appends
    follows whole members; its rows are grouped into one member per step."""
    try:
        lines = list(iter_lines(path))
        whole = is_whole(path)
    except FileNotFoundError:
        return 0
    kept: list[tuple[int, bytes]] = []
    dropped = 0
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if isinstance(row, dict) and keep(row):
            kept.append((_step(row), line))
        else:
            dropped += 1
    if not dropped and whole:
        return 0
    members: list[list[bytes]] = []
    for i, (step, line) in enumerate(kept):
        if not i or step != kept[i - 1][0]:
            members.append([])
        members[-1].append(line)
    write_lines_atomic(path, members)
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
    which trajectory files to rewind (``""``: ``trajectories_<kind>.jsonl[.gz]``;
    ``".process1"``: that process's; ``None``: every ``trajectories_*.jsonl[.gz]``).
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
        for path in trajectory_files(workdir, kind):
            suffix = TRAJECTORY_FILE.match(os.path.basename(path)).group(2) or ""
            if trajectory_suffix is not None and suffix != trajectory_suffix:
                continue
            if kind == "train":
                rewind(path, lambda r: _step(r) <= step)
            else:
                rewind(path, lambda r: _step(r) < step or _step(r) == step and not redo_eval)
    return dropped
