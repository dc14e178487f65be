"""benchmarks/gpu/detached.sh: a command that outlives the call that started it.

The lent GPU machine kills what a call leaves behind except processes in a new session; here a
"call" is a process group that is killed after ``start`` returns, and the detached command
must run on, report its new log lines to each ``wait`` and its exit status at the end."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "detached.sh"
pytestmark = pytest.mark.skipif(subprocess.run(["which", "setsid"], capture_output=True).returncode,
                                reason="needs setsid (util-linux)")


def _det(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def _gated(tmp_path: Path, code: int) -> list[str]:
    """A command that prints "one", waits for the file ``go``, prints "two" and exits ``code``."""
    gate = tmp_path / "go"
    return ["bash", "-c", f"echo one; while [ ! -f {gate} ]; do sleep 0.1; done; echo two; "
            f"exit {code}"]


def test_a_started_command_outlives_its_call_and_reports_to_each_wait(tmp_path):
    work = tmp_path / "det"
    # the "call": its own process group, killed (as the machine does) once start returned
    call = subprocess.Popen(["bash", str(SCRIPT), "start", str(work), "--", *_gated(tmp_path, 7)],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert "started pid" in call.communicate(timeout=60)[0]
    try:
        os.killpg(call.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    pid = int((work / "pid").read_text())
    os.kill(pid, 0)  # still there
    first = _det("wait", work, 1)
    assert first.returncode == 124 and "one" in first.stdout and "still running" in first.stdout
    assert "two" not in first.stdout
    again = _det("start", work, "--", "true")
    assert again.returncode == 2 and "already runs" in again.stderr
    (tmp_path / "go").touch()
    last = _det("wait", work, 50)
    assert last.returncode == 7 and "two" in last.stdout and "exit 7" in last.stdout
    assert "one" not in last.stdout  # only the lines after the last wait


def test_stop_ends_the_command_and_wait_reports_its_status(tmp_path):
    work = tmp_path / "det"
    assert _det("start", work, "--", *_gated(tmp_path, 0)).returncode == 0
    stopped = _det("stop", work)
    assert stopped.returncode == 0 and "SIGTERM" in stopped.stdout
    assert _det("wait", work, 50).returncode == 128 + signal.SIGTERM
    # a finished DIR takes a new command
    assert _det("start", work, "--", "bash", "-c", "echo fresh").returncode == 0
    done = _det("wait", work, 50)
    assert done.returncode == 0 and "fresh" in done.stdout


def test_usage_mistakes_exit_2(tmp_path):
    assert _det("wait", tmp_path / "none", 1).returncode == 2
    assert _det("start", tmp_path / "x", "--").returncode == 2
    assert _det("bogus", tmp_path / "x").returncode == 2


def test_snapshot_runs_from_a_copy_that_later_changes_to_the_folder_do_not_touch(tmp_path):
    """Each GPU call rewrites the repository folder; a --snapshot command keeps reading (and
    importing from) the copy taken at start, with PYTHONPATH's entry for the folder moved."""
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "__init__.py").write_text("")
    (repo / "pkg" / "late.py").write_text("VALUE = 'from the copy'\n")
    work = tmp_path / "det"
    gate = tmp_path / "go"
    # imports pkg.late only after the gate opens, as a lazy import does after a long start-up
    command = ["bash", "-c", f"while [ ! -f {gate} ]; do sleep 0.1; done; pwd; "
               "echo \"path=$PYTHONPATH\"; "
               "python3 -c 'import pkg.late; print(pkg.late.VALUE, pkg.late.__file__)'"]
    env = dict(os.environ, PYTHONPATH=f"{repo}:/elsewhere")
    started = subprocess.run(["bash", str(SCRIPT), "start", str(work), "--snapshot", "--",
                              *command], cwd=repo, env=env, capture_output=True, text=True,
                             timeout=60)
    assert started.returncode == 0, started.stderr
    assert f"runs in a copy of {repo}" in started.stdout
    (repo / "pkg" / "late.py").unlink()  # the next call's copy, half written
    gate.touch()
    done = _det("wait", work, 50)
    assert done.returncode == 0, done.stdout
    copy = work.resolve() / "tree"
    assert f"\n{copy}\n" in f"\n{done.stdout}"
    assert f"path={copy}:/elsewhere" in done.stdout
    assert f"from the copy {copy / 'pkg' / 'late.py'}" in done.stdout


def test_snapshot_refuses_a_dir_inside_the_folder_it_copies(tmp_path):
    refused = subprocess.run(["bash", str(SCRIPT), "start", str(tmp_path / "det"), "--snapshot",
                              "--", "true"], cwd=tmp_path, capture_output=True, text=True,
                             timeout=60)
    assert refused.returncode == 2 and "outside the folder" in refused.stderr


def test_stop_reaches_a_job_in_its_own_process_group_and_waits_for_it(tmp_path):
    """jobs.sh runs each job under ``timeout``, which leads a process group of its own: a stop
    that signalled only the command's group left such jobs running (and holding the GPU). Now
    every group of the session gets SIGTERM and ``stop`` returns once the job has cleaned up
    (here: a second's work after the signal, then a file)."""
    work, cleaned = tmp_path / "det", tmp_path / "cleaned"
    job = (f"trap 'sleep 1; echo done > {cleaned}; exit 0' TERM; echo trap set; "
           f"while :; do sleep 0.1; done")
    started = _det("start", work, "--", "bash", "-c", f'timeout 60 bash -c "{job}" & wait')
    assert started.returncode == 0
    log = work / "log"
    for _ in range(600):  # the job prints once its trap is set (a loaded box: up to 30 s)
        if log.exists() and "trap set" in log.read_text():
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the job never started")
    pid = int((work / "pid").read_text())
    try:
        stopped = _det("stop", work, 30)
        assert stopped.returncode == 0, stopped.stderr
        assert cleaned.read_text() == "done\n"  # stop returned after the job's clean-up
        assert "every process of session" in stopped.stdout
        assert not _session_pids(pid)
    finally:
        for other in _session_pids(pid):  # never leave a job behind, whatever failed
            os.kill(other, signal.SIGKILL)


def _session_pids(sid: int) -> list[int]:
    """The processes whose session id is ``sid``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == sid:
                    pids.append(int(entry.name))
            except (ProcessLookupError, PermissionError):
                pass
    return pids
