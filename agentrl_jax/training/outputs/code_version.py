"""Which code a run's session ran: a digest of the Python sources, and the git commit when the
checkout has one.

A run's files say what it was configured to do (``config.json``) but not which code did it; a
bug found later (docs/PERFORMANCE.md, "The row copy's one array dropped rows") then leaves no
way to tell, from the files alone, which committed runs it touched. Each session record in
``summary.json`` carries ``code`` (:func:`code_version`):

* ``source_sha256``: SHA-256 over the ``*.py`` files of the packages a run imports
  (:data:`PACKAGES`), each as its path relative to the repository root, a NUL, its bytes and a
  NUL, in sorted path order. It needs no ``.git``: the GPU machines run a copy of the working
  tree without one. ``benchmarks/analysis/run_code.py`` computes the same digest of any commit
  (``git ls-tree`` / ``git cat-file``) and names the commits whose tree a session ran;
* ``git_commit`` and ``git_dirty`` (whether those packages differ from the commit) when ``git``
  answers in the repository within a few seconds, else absent.
"""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
from typing import Any, Iterable

#: The packages whose sources a run executes (launch/ and experiments/ only build the config,
#: which ``config.json`` records whole).
PACKAGES = ("agentrl_jax", "agentrl_common", "environments")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
GIT_TIMEOUT_S = 5.0


def digest(files: Iterable[tuple[str, bytes]]) -> str:
    """SHA-256 hex of ``(relative path, bytes)`` pairs, in sorted path order: for each,
    ``path`` (POSIX separators) + NUL + ``bytes`` + NUL."""
    h = hashlib.sha256()
    for path, data in sorted(files, key=lambda item: item[0]):
        h.update(path.encode() + b"\0" + data + b"\0")
    return h.hexdigest()


def counted(rel: str) -> bool:
    """Whether the POSIX path ``rel`` (relative to the repository) is a source the digest
    reads: a ``*.py`` file outside ``__pycache__`` and hidden folders."""
    parts = rel.split("/")
    return rel.endswith(".py") and not any(p == "__pycache__" or p.startswith(".")
                                           for p in parts[:-1])


def source_files(root: str, packages: Iterable[str] = PACKAGES) -> list[str]:
    """The ``*.py`` files under ``root``'s ``packages``, as POSIX paths relative to ``root``
    (caches skipped)."""
    out = []
    for package in packages:
        for folder, _, names in os.walk(os.path.join(root, package)):
            for name in names:
                rel = os.path.relpath(os.path.join(folder, name), root).replace(os.sep, "/")
                if counted(rel):
                    out.append(rel)
    return out


def source_digest(root: str = REPO, packages: Iterable[str] = PACKAGES) -> str:
    """:func:`digest` of the working tree's sources under ``root``."""
    files = []
    for rel in source_files(root, packages):
        with open(os.path.join(root, rel), "rb") as f:
            files.append((rel, f.read()))
    return digest(files)


def _git(root: str, *args: str) -> str | None:
    """``git args`` in ``root``: its stdout, or None (no git, no repository, an error, slow)."""
    try:
        done = subprocess.run(("git", "-C", root) + args, capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


@functools.lru_cache(maxsize=None)
def code_version(root: str = REPO) -> dict[str, Any]:
    """``{"source_sha256", ["git_commit", "git_dirty"]}`` of the code under ``root`` (computed
    once a process: a run's code does not change under it)."""
    out: dict[str, Any] = {"source_sha256": source_digest(root)}
    top = _git(root, "rev-parse", "--show-toplevel")
    commit = _git(root, "rev-parse", "--verify", "HEAD")
    if commit and top and os.path.realpath(top.strip()) == os.path.realpath(root):
        status = _git(root, "status", "--porcelain", "--untracked-files=all", "--",
                      *PACKAGES)
        out["git_commit"] = commit.strip()
        if status is not None:
            # porcelain lines: "XY path" or "XY old -> new"
            out["git_dirty"] = any(counted(path) for line in status.splitlines()
                                   for path in line[3:].split(" -> "))
    return out


__all__ = ["PACKAGES", "code_version", "counted", "digest", "source_digest", "source_files"]
