"""The tracked tree stays small enough to travel: every call to the lent GPU machine copies the
repository's tracked files, together with what the call carries (the offline wheels and the
model), under a hard limit of 64 MiB in all. So the tracked files stay under 40 MiB, and no
committed run file ``results/**/*.jsonl`` is over 64 KiB: large ones are stored
``X.jsonl.gz`` (results/README.md), which every reader takes.

Reference: ``git ls-files`` (what is tracked) and ``os.path.getsize``.
"""

from __future__ import annotations

import os
import pathlib
import subprocess

import pytest

from agentrl_common.jsonl_files import COMPRESS_ABOVE_BYTES

REPO = pathlib.Path(__file__).resolve().parent.parent
TRACKED_LIMIT_BYTES = 40 << 20
WHY = ("every call to the GPU machine copies the tracked tree plus what it carries under a "
       "64 MiB limit")
FIX = ("store large JSON-lines files compressed: `python3 benchmarks/analysis/compact_results.py "
       "results/NAME` (or `gzip -n -9 FILE`); every reader takes X.jsonl.gz")


def tracked_sizes(repo: pathlib.Path) -> dict[str, int]:
    """``{path: bytes}`` of the tracked files present in the work tree."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=repo, capture_output=True,
                             check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as error:
        pytest.skip(f"not a git checkout ({error})")
    sizes = {}
    for name in out.decode().split("\0"):
        path = repo / name
        if name and path.is_file() and not path.is_symlink():
            sizes[name] = path.stat().st_size
    return sizes


def oversized_run_files(sizes: dict[str, int]) -> list[str]:
    """The tracked ``results/**/*.jsonl`` files over ``COMPRESS_ABOVE_BYTES``."""
    return sorted(f"{name} ({size} bytes)" for name, size in sizes.items()
                  if name.startswith("results/") and name.endswith(".jsonl")
                  and size > COMPRESS_ABOVE_BYTES)


def test_the_tracked_tree_stays_under_its_limit():
    sizes = tracked_sizes(REPO)
    total = sum(sizes.values())
    largest = sorted(sizes, key=sizes.get, reverse=True)[:10]
    assert total < TRACKED_LIMIT_BYTES, (
        f"the tracked files hold {total / 2**20:.1f} MiB, over {TRACKED_LIMIT_BYTES >> 20} MiB: "
        f"{WHY}. Largest: {', '.join(f'{n} ({sizes[n]})' for n in largest)}. {FIX}")


def test_no_committed_run_file_is_left_uncompressed():
    oversized = oversized_run_files(tracked_sizes(REPO))
    assert not oversized, (
        f"run files over {COMPRESS_ABOVE_BYTES >> 10} KiB committed plain ({WHY}): "
        f"{', '.join(oversized)}. {FIX}")


def test_the_guard_sees_a_plain_run_file_over_the_limit():
    sizes = {"results/a/metrics.jsonl": COMPRESS_ABOVE_BYTES + 1,
             "results/a/eval_episodes.jsonl.gz": 10 * COMPRESS_ABOVE_BYTES,
             "results/b/metrics.jsonl": COMPRESS_ABOVE_BYTES,
             "tests/data/big.jsonl": 10 * COMPRESS_ABOVE_BYTES}
    assert oversized_run_files(sizes) == [
        f"results/a/metrics.jsonl ({COMPRESS_ABOVE_BYTES + 1} bytes)"]
