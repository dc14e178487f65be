"""Which commit's code each session of a run ran: the ``code`` of every session record in a
run's ``summary.json`` (``agentrl_jax/training/outputs/code_version.py``) matched against the
same source digest computed for the last commits of this repository.

    python benchmarks/analysis/run_code.py results/x/run_s0 results/x/run_s1 [--commits 200]

A session on a GPU machine has no ``.git`` (the machines run a copy of the working tree), so
its record has the digest alone; this names the commits whose tree it equals (several when
commits in a row leave the sources unchanged, none when the session ran uncommitted edits).
The digest of a commit is computed from git's objects (``git ls-tree`` / ``git cat-file``),
with no checkout. Sessions written before the field existed say so.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from agentrl_jax.training.outputs.code_version import PACKAGES, REPO, counted, digest  # noqa: E402


def _git(repo: str, *args: str, stdin: bytes | None = None) -> bytes:
    return subprocess.run(("git", "-C", repo) + args, input=stdin, capture_output=True,
                          check=True).stdout


def commit_digest(repo: str, commit: str, packages: Sequence[str] = PACKAGES) -> str:
    """``code_version.digest`` of ``commit``'s ``*.py`` files under ``packages``."""
    listing = _git(repo, "ls-tree", "-r", "-z", commit, "--", *packages).split(b"\0")
    blobs = []
    for entry in filter(None, listing):
        meta, path = entry.split(b"\t", 1)
        name = path.decode()
        if meta.split()[1] == b"blob" and counted(name):
            blobs.append((name, meta.split()[2].decode()))
    if not blobs:
        return digest([])
    out = _git(repo, "cat-file", "--batch", stdin="\n".join(b for _, b in blobs).encode() + b"\n")
    files, pos = [], 0
    for name, _ in blobs:  # each: "<sha> blob <size>\n<bytes>\n"
        end = out.index(b"\n", pos)
        size = int(out[pos:end].split()[2])
        files.append((name, out[end + 1:end + 1 + size]))
        pos = end + 1 + size + 1
    return digest(files)


def recent_digests(repo: str, commits: int) -> list[tuple[str, str, str]]:
    """``(commit, subject, digest)`` of the last ``commits`` commits of HEAD, newest first."""
    log = _git(repo, "log", f"-{commits}", "--format=%H%x09%s").decode().splitlines()
    return [(c, subject, commit_digest(repo, c))
            for c, subject in (line.split("\t", 1) for line in log)]


def sessions(run: str) -> list[dict[str, Any]]:
    """The session records of ``run``'s ``summary.json`` ([] when it has none)."""
    try:
        with open(os.path.join(run, "summary.json")) as f:
            return list(json.load(f).get("sessions") or [])
    except (OSError, ValueError):
        return []


def report(runs: Sequence[str], known: list[tuple[str, str, str]]) -> list[str]:
    """One line per session: its digest and the commits (short) whose sources equal it."""
    by_digest: dict[str, list[str]] = {}
    for commit, _, d in known:
        by_digest.setdefault(d, []).append(commit[:10])
    lines = []
    for run in runs:
        records = sessions(run)
        if not records:
            lines.append(f"{run}: no session records")
        for i, record in enumerate(records):
            code = record.get("code")
            if not code:
                lines.append(f"{run} session {i}: no code recorded (written before the field)")
                continue
            d = code["source_sha256"]
            match = by_digest.get(d)
            where = (f"the sources of {', '.join(match)}" if match
                     else f"no commit of the last {len(known)}")
            git = (f"; ran from a checkout at {code['git_commit'][:10]}"
                   + (" with edits" if code.get("git_dirty") else "")
                   if "git_commit" in code else "")
            lines.append(f"{run} session {i} (ended {record.get('ended', '?')}): sources "
                         f"{d[:12]} = {where}{git}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="run folders (each with a summary.json)")
    p.add_argument("--commits", type=int, default=200, help="how many recent commits to try")
    p.add_argument("--repo", default=REPO, help="the git repository (default: this one)")
    args = p.parse_args(argv)
    print("\n".join(report(args.runs, recent_digests(args.repo, args.commits))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
