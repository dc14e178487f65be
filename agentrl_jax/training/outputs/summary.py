"""``summary.json``: what a run did, merged over the sessions (invocations) of its workdir.

Each session adds one record to ``sessions``, however it ended:

* the trainer's normal end writes the whole summary (steps, rewards, evaluations, ``finished_step``)
  with a record whose ``stopped`` is ``total_steps``, ``time_budget`` or ``evaluate_only``;
* a session that ends with an exception appends only its record (:func:`append_session`):
  ``stopped`` is ``interrupted`` (Ctrl-C), ``run_failed`` (a ``RunFailure``: dead environment
  servers, env errors, an evaluation that is not a result), ``storage_failed`` (the workdir
  could not be written: a full disk) or ``error`` (anything else), with ``error``: the one-line
  message (:func:`outcome`);
* a session that died without a word (kill -9, out of memory, a lost host) cannot write
  anything; the next session finds the workdir lock it left (``training/outputs/workdir_lock.py``) and
  appends ``stopped: killed`` for it, with its pid, host and start time.

A failed session's record never touches the other fields (a failed session does not finish a
run). Writing the record is best effort: on a full disk it may fail, which is reported and
never hides the original failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any

SUMMARY_FILE = "summary.json"


def read_summary(workdir: str) -> dict[str, Any]:
    """``summary.json`` of ``workdir`` ({} when there is none or it is not a JSON object)."""
    try:
        with open(os.path.join(workdir, SUMMARY_FILE)) as f:
            summary = json.load(f)
    except (OSError, ValueError):
        return {}
    return summary if isinstance(summary, dict) else {}


def merge_summary(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The summary of a run that was started again, from the previous one and this session's.

    Fields only ``old`` has are kept; ``new`` wins elsewhere, except: ``evals`` are merged by
    step (a step evaluated again takes the new result), ``start_step`` and ``first_reward`` stay
    those of the first session, ``sessions`` (one record per invocation) are appended, and
    ``mean_step_seconds`` is the mean over every session's steps.
    """
    merged = {**old, **new}
    evals = {str(k): v for k, v in (old.get("evals") or {}).items()}
    evals.update({str(k): v for k, v in (new.get("evals") or {}).items()})
    if evals:
        merged["evals"] = dict(sorted(evals.items(), key=lambda kv: int(kv[0])))
    for key in ("start_step", "first_reward"):
        if key in old:
            merged[key] = old[key]
    sessions = list(old.get("sessions") or []) + list(new.get("sessions") or [])
    merged["sessions"] = sessions
    timed_steps = [(s["steps"], s["mean_step_seconds"]) for s in sessions
                   if s.get("steps") and s.get("mean_step_seconds") is not None]
    if timed_steps:
        merged["mean_step_seconds"] = (sum(n * t for n, t in timed_steps)
                                       / sum(n for n, _ in timed_steps))
    return merged


def write_json_atomic(path: str, data: Any) -> None:
    """Write ``data`` to ``path`` through a temporary file (never a half-written file)."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump(data, f, indent=2, default=str)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # a full disk: leave no half-written temporary
            os.remove(tmp)
        raise


def outcome(error: BaseException) -> dict[str, str]:
    """``{"stopped": ..., "error": one line}`` for a session ended by ``error`` (module
    docstring). Classified by name so that this module imports nothing of the trainer."""
    names = {cls.__name__ for cls in type(error).__mro__}
    if isinstance(error, KeyboardInterrupt):
        stopped = "interrupted"
    elif "StorageFailure" in names:
        stopped = "storage_failed"
    elif "RunFailure" in names:
        stopped = "run_failed"
    else:
        stopped = "error"
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    if stopped == "error":
        text = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return {"stopped": stopped, "error": text[:500]} if text else {"stopped": stopped}


def append_session(workdir: str, record: dict[str, Any]) -> str | None:
    """Append ``record`` to the ``sessions`` of ``workdir``'s summary (creating it when there
    is none), leaving every other field as it is. Never raises: returns ``None`` when it was
    written, else why not (one line)."""
    record = {"ended": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **record}
    try:
        summary = merge_summary(read_summary(workdir), {"sessions": [record]})
        write_json_atomic(os.path.join(workdir, SUMMARY_FILE), summary)
    except Exception as error:  # a full disk, an unwritable workdir
        return f"{SUMMARY_FILE} not updated: {getattr(error, 'strerror', None) or error}"
    return None
