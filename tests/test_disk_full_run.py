"""A smoke run whose disk fills up, on a small tmpfs (skipped where mounting is not allowed).

Three sessions of one 3-step run (tiny random model, real BabyAI and TextCraft servers) in a
workdir on its own tmpfs:

1. the tmpfs holds one checkpoint (46 MB) but not two: the save of step 2 fails in orbax's
   background write. The run stops within seconds of it with one line on stderr (exit code 4),
   no traceback, the partial checkpoint removed, checkpoint 1 intact, the session recorded in
   ``summary.json``;
2. the tmpfs is grown; the rerun resumes from step 1 and the test fills the disk while step 2's
   episodes are in flight: the step's first log write fails. Before, TensorBoard's writer
   thread died there and the trainer blocked on its queue for good; now the run stops within
   seconds, one line, environment servers gone;
3. the filler is removed; the rerun resumes from step 1 again and finishes, every step once in
   ``metrics.jsonl``.

The sessions share the test session's JAX compilation cache (``compile_cache_env``).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from urllib.parse import urlparse

import pytest

from test_run_faults import fill, mount_tmpfs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CMD = [sys.executable, "launch/run.py", "--config", "experiments/smoke.py",
       "--config.train.total_steps=3", "--config.progress_seconds=0"]


def _port_open(url: str) -> bool:
    parsed = urlparse(url)
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((parsed.hostname, parsed.port)) == 0


class Session:
    """``launch/run.py`` in the background, its stdout read line by line."""

    def __init__(self, workdir: str, env: dict[str, str], stderr_path: str):
        self.stderr_path = stderr_path
        self._err = open(stderr_path, "w")
        self.proc = subprocess.Popen([*CMD, "--workdir", workdir], cwd=REPO, env=env,
                                     stdout=subprocess.PIPE, stderr=self._err, text=True)
        self.lines: list[str] = []
        self.urls: list[str] = []

    def wait_for(self, pattern: str) -> str:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if line.startswith("environment servers: "):
                self.urls = [w.rstrip(",") for w in line.split() if w.startswith("http://")]
            if re.search(pattern, line):
                return line
        raise AssertionError(f"{pattern!r} never came:\n" + "\n".join(self.lines[-40:])
                             + open(self.stderr_path).read()[-3000:])

    def finish(self, timeout: float = 600) -> tuple[int, list[str], float]:
        """(exit code, stderr lines, seconds from now to the exit)."""
        t0 = time.monotonic()
        self.lines += self.proc.stdout.read().splitlines()
        code = self.proc.wait(timeout=timeout)
        seconds = time.monotonic() - t0
        self._err.close()
        stderr = [ln for ln in open(self.stderr_path).read().splitlines() if ln.strip()]
        return code, stderr, seconds

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.mark.slow
def test_disk_full_at_a_save_and_mid_step_stops_in_one_line_then_resumes(
        tmp_path, compile_cache_env):
    mount = str(tmp_path / "small")
    mount_tmpfs(mount, "70m")
    env = dict(os.environ, **compile_cache_env)
    env.pop("XLA_FLAGS", None)
    workdir = os.path.join(mount, "run")
    checkpoints = os.path.join(workdir, "checkpoints")
    sessions: list[Session] = []
    try:
        # 1. a save that does not fit
        run = Session(workdir, env, str(tmp_path / "err1.txt"))
        sessions.append(run)
        run.wait_for(r"^\[step 2/3\]")
        code, stderr, seconds = run.finish()
        assert code == 4, "\n".join(run.lines[-30:] + stderr)
        assert len(stderr) == 1, "\n".join(stderr)
        (line,) = stderr
        # orbax's background write failed; polled every second, it stops the run at once
        assert line.startswith(f"run failed: checkpoint save of step 2 failed: No space left "
                               f"on device ({checkpoints}/2); "), line
        assert "the last good checkpoint is step 1; environment servers and rollout engine " \
               "stopped; free some space, then the same command resumes from it" in line, line
        assert os.listdir(checkpoints) == ["1"]  # the partial checkpoint is gone
        assert not any(_port_open(u) for u in run.urls)
        (record,) = json.load(open(os.path.join(workdir, "summary.json")))["sessions"]
        assert record["stopped"] == "storage_failed" and record["error"] == line[12:]
        failed_after = seconds

        # 2. room for the checkpoints, then the disk fills while step 2's episodes run
        subprocess.run(["mount", "-o", "remount,size=200m", mount], check=True)
        run = Session(workdir, env, str(tmp_path / "err2.txt"))
        sessions.append(run)
        run.wait_for(r"^resumed at step 1$")
        run.wait_for(r"^step 2/3 rollout \(horizon 2\): 0/4 episodes")
        filler = fill(mount)
        t_full = time.monotonic()
        code, stderr, _ = run.finish(timeout=300)
        stopped_in = time.monotonic() - t_full
        assert code == 4, "\n".join(run.lines[-30:] + stderr)
        assert len(stderr) == 1, "\n".join(stderr)
        assert re.fullmatch(
            rf"run failed: (writing {re.escape(workdir)}/\S+ failed during step 2/3|checkpoint "
            r"save of step \d failed): No space left on device.*; the last good checkpoint is "
            r"step 1; .*; summary\.json not updated: No space left on device", stderr[0]), stderr
        assert not any(_port_open(u) for u in run.urls)
        assert "[step 2/3]" not in "\n".join(run.lines)
        assert os.listdir(checkpoints) == ["1"]

        # 3. space again: the rerun resumes from the last good checkpoint and finishes
        os.remove(filler)
        run = Session(workdir, env, str(tmp_path / "err3.txt"))
        sessions.append(run)
        code, stderr, _ = run.finish()
        out = "\n".join(run.lines)
        assert code == 0, out[-3000:] + "\n".join(stderr)
        assert "resumed at step 1" in out and "[step 3/3]" in out and "run finished" in out
        rows = [json.loads(ln) for ln in open(os.path.join(workdir, "metrics.jsonl"))]
        assert [r["step"] for r in rows if "train/horizon" in r] == [1, 2, 3]
        summary = json.load(open(os.path.join(workdir, "summary.json")))
        assert summary["finished_step"] == 3
        # session 2's record could not be written (the disk was full): it said so instead
        assert [s["stopped"] for s in summary["sessions"]] == ["storage_failed", "total_steps"]
        assert os.path.exists(os.path.join(workdir, "report.md"))
        print(f"session 1 exited {failed_after:.1f} s after its step-2 line; session 2 "
              f"{stopped_in:.1f} s after the disk filled")
    finally:
        for run in sessions:
            run.kill()
        subprocess.run(["umount", "-l", mount], capture_output=True)
