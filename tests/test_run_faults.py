"""Faults of a run's workdir, fast: the workdir lock, refused writes (a full disk) in the metrics
writer, the checkpointer and the trainer, session records in ``summary.json``, and a rerun
that completes a finished run's missing report.

A real full filesystem comes from a small tmpfs mount where the platform allows it (root on
Linux; skipped elsewhere); the same paths are also driven with an injected ``ENOSPC``. The
whole-run versions (a smoke run whose disk fills at a save and mid-step) are in
tests/test_disk_full_run.py.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import struct
import subprocess
import sys
import threading
import time
import types
import uuid

import numpy as np
import pytest

from agentrl_jax.learner.metrics import MetricsWriter
from agentrl_jax.training.outputs import storage
from agentrl_jax.training.outputs.summary import append_session, merge_summary, outcome, read_summary
from process_helpers import processes_with
from agentrl_jax.training.outputs.workdir_lock import (LOCK_FILE, WorkdirBusy, WorkdirLock,
                                               WorkdirLockError)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
TENSORSTORE_ENOSPC = (
    'RESOURCE_EXHAUSTED: Error writing "w/0" in OCDBT database at local file '
    '"/mnt/small/ck/2.orbax-checkpoint-tmp/params.orbax-checkpoint-tmp/ocdbt.process_0/": '
    'Failed writing: "/mnt/small/ck/2.orbax-checkpoint-tmp/params/d/88a1": Failed to write '
    "4091904 bytes to file 7: No space left on device [os_error_code='28']")


# ----------------------------------------------------------------------------- helpers
def mount_tmpfs(path: str, size: str) -> None:
    """Mount a tmpfs of ``size`` on ``path``; skips the test where mounting is not allowed."""
    os.makedirs(path, exist_ok=True)
    if sys.platform != "linux" or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root on Linux")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")


@pytest.fixture
def small_fs(tmp_path):
    """``mount(size) -> path``: a tmpfs of that size (unmounted after the test)."""
    mounted = []

    def mount(size: str, name: str = "small") -> str:
        path = str(tmp_path / name)
        mount_tmpfs(path, size)
        mounted.append(path)
        return path

    yield mount
    for path in mounted:
        subprocess.run(["umount", "-l", path], capture_output=True)


def fill(directory: str) -> str:
    """Fill the filesystem of ``directory`` with a file until it refuses more; its path."""
    path = os.path.join(directory, "filler")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for size in (1 << 20, 4096, 1):  # big blocks, then the last pages
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError as error:
                assert error.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return path


def read_events(path: str) -> list:
    """The ``Event`` protos of a TensorBoard event file (TFRecord framing: length, its CRC,
    the data, its CRC)."""
    from tensorboardX.proto.event_pb2 import Event

    data, events, pos = open(path, "rb").read(), [], 0
    while pos < len(data):
        (n,) = struct.unpack("Q", data[pos:pos + 8])
        events.append(Event.FromString(data[pos + 12:pos + 12 + n]))
        pos += 12 + n + 4
    return events


def hold_lock(workdir: str) -> subprocess.Popen:
    """A process that holds ``workdir``'s lock (until it is killed)."""
    code = ("import sys, time; from agentrl_jax.training.outputs.workdir_lock import WorkdirLock; "
            f"WorkdirLock({workdir!r}).acquire(); print('locked', flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code], env=ENV, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


# ----------------------------------------------------------------------------- the lock
def test_second_lock_on_a_busy_workdir_is_refused_in_one_line(tmp_path):
    workdir = str(tmp_path / "run")
    holder = hold_lock(workdir)
    try:
        with pytest.raises(WorkdirBusy) as busy:
            WorkdirLock(workdir).acquire()
        message = str(busy.value)
        assert "\n" not in message
        assert message.startswith(f"workdir {workdir} is in use by pid {holder.pid} on host ")
        assert busy.value.holder["pid"] == holder.pid
    finally:
        holder.kill()
        holder.wait()
    # the holder is gone (its lock with it); within one process a second lock is refused too
    # (flock belongs to the open file, not the process)
    with WorkdirLock(workdir) as first:
        assert first.stale["pid"] == holder.pid
        with pytest.raises(WorkdirBusy):
            WorkdirLock(workdir).acquire()


def test_lock_of_a_killed_holder_is_taken_over_with_its_record(tmp_path):
    workdir = str(tmp_path / "run")
    holder = hold_lock(workdir)
    holder.send_signal(signal.SIGKILL)  # dies without releasing: its record stays
    holder.wait()
    lock = WorkdirLock(workdir).acquire()
    try:
        assert lock.stale["pid"] == holder.pid
        assert lock.stale_message() == (
            f"workdir {workdir}: took over the lock left by pid {holder.pid} on host "
            f"{lock.stale['host']} (started {lock.stale['started']}), which is no longer "
            "running (it did not end cleanly)")
        record = json.loads(open(os.path.join(workdir, LOCK_FILE)).read())
        assert record["pid"] == os.getpid()
    finally:
        lock.release()
    # released cleanly: the record is emptied and the next holder finds nothing stale
    assert open(os.path.join(workdir, LOCK_FILE)).read() == ""
    with WorkdirLock(workdir) as again:
        assert again.stale is None and again.stale_message() is None


def test_lock_in_a_workdir_that_cannot_be_made_is_one_line(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(WorkdirLockError) as error:
        WorkdirLock(str(tmp_path / "file" / "run")).acquire()
    assert str(error.value).startswith(f"cannot create the lock file {tmp_path}/file/run/run.lock")
    assert not isinstance(error.value, WorkdirBusy)


def test_launch_refuses_a_busy_workdir_before_anything_starts(tmp_path):
    """Exit code 5 and one line; nothing started: no stdout line (servers and the model are
    announced there), nothing in the workdir but the holder's lock, no process of the run
    left (a server would inherit ``AGENTRL_TEST_MARKER``)."""
    workdir = str(tmp_path / "run")
    marker = uuid.uuid4().hex
    with WorkdirLock(workdir):
        proc = subprocess.run([sys.executable, "launch/run.py", "--config", "experiments/smoke.py",
                               "--workdir", workdir], cwd=REPO,
                              env=dict(ENV, AGENTRL_TEST_MARKER=marker), capture_output=True,
                              text=True, timeout=120)
    assert proc.returncode == 5, proc.stderr[-2000:]
    assert proc.stdout == ""  # no server, no model
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"workdir {workdir} is in use by pid {os.getpid()} on host ")
    assert line.endswith("one run per workdir: wait for it to end, stop it, or pass another "
                         "--workdir")
    assert os.listdir(workdir) == [LOCK_FILE]
    if os.path.isdir("/proc/self"):
        assert processes_with(marker) == []


def _finished_workdir(workdir: str) -> None:
    """A workdir as a finished one-step run leaves it, minus its report: summary, checkpoint
    directory, metrics (what a kill between the summary and the report leaves)."""
    os.makedirs(os.path.join(workdir, "checkpoints", "1"))
    summary = {"workdir": workdir, "start_step": 0, "final_step": 1, "finished_step": 1,
               "sessions": [{"start_step": 0, "final_step": 1, "steps": 1,
                             "stopped": "total_steps", "evals": [], "seconds": 9.0}]}
    json.dump(summary, open(os.path.join(workdir, "summary.json"), "w"))
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
        f.write(json.dumps({"step": 1, "rollout/mean_reward": 0.25, "train/horizon": 2}) + "\n")


def test_rerun_takes_over_a_killed_runs_lock_and_writes_the_missing_report(tmp_path):
    workdir = str(tmp_path / "run")
    _finished_workdir(workdir)
    holder = hold_lock(workdir)  # the run, killed after its summary, before its report
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    proc = subprocess.run([sys.executable, "launch/run.py", "--config", "experiments/smoke.py",
                           "--workdir", workdir, "--config.train.total_steps=1"], cwd=REPO,
                          env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"workdir {workdir}: took over the lock left by pid "
                               f"{holder.pid} on host ")
    assert lines[1] == (f"run already finished at step 1 (workdir {workdir}); pass --eval_again "
                        "to evaluate it again, or a larger --config.train.total_steps / "
                        "--config.train.max_seconds to train on")
    assert lines[2] == (f"run report: {workdir}/report.md (curves {workdir}/report_curves.png)")
    assert len(lines) == 3
    assert os.path.getsize(os.path.join(workdir, "report_curves.png")) > 1000
    report = open(os.path.join(workdir, "report.md")).read()
    assert "| steps | 1 (stopped: total_steps) |" in report  # not the killed record's
    assert "| train reward, first -> last step | 0.250 -> 0.250 |" in report
    assert "| wall time | 9 s (2 session(s)) |" in report
    sessions = read_summary(workdir)["sessions"]
    assert [s["stopped"] for s in sessions] == ["total_steps", "killed"]
    assert sessions[1]["lock_pid"] == holder.pid
    assert read_summary(workdir)["finished_step"] == 1  # a record touches nothing else
    # once the report is there, a rerun only says the run is finished (and leaves the lock)
    proc = subprocess.run([sys.executable, "launch/run.py", "--config", "experiments/smoke.py",
                           "--workdir", workdir, "--config.train.total_steps=1"], cwd=REPO,
                          env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.stdout.splitlines() == lines[1:2] and proc.returncode == 0
    assert open(os.path.join(workdir, LOCK_FILE)).read() == ""


# ----------------------------------------------------------------------------- recognising
def test_refused_writes_are_recognised_in_any_shape():
    oserror = OSError(errno.ENOSPC, "No space left on device", "/w/metrics.jsonl")
    assert storage.storage_error(oserror) is oserror
    orbax = ValueError(TENSORSTORE_ENOSPC)  # what orbax raises for a full disk
    assert storage.storage_error(orbax) is orbax
    assert storage.reason(orbax) == "No space left on device"
    assert storage.failed_path(orbax) == (
        "/mnt/small/ck/2.orbax-checkpoint-tmp/params.orbax-checkpoint-tmp/ocdbt.process_0/")
    try:  # deep in a chain (raised while handling another error)
        try:
            raise orbax
        except ValueError as inner:
            raise RuntimeError("close failed") from inner
    except RuntimeError as outer:
        assert storage.storage_error(outer) is orbax
    quota = OSError(errno.EDQUOT, "Disk quota exceeded")
    assert storage.storage_error(ExceptionGroup("g", [ValueError("x"), quota])) is quota
    # not a refused write: other OS errors, other tensorstore codes, plain errors
    assert storage.storage_error(OSError(errno.ECONNREFUSED, "refused")) is None
    assert storage.storage_error(ValueError("NOT_FOUND [os_error_code='2']")) is None
    assert storage.storage_error(KeyError("step")) is None
    assert storage.reason(KeyError("step")) == "KeyError: 'step'"


def test_failure_message_names_what_failed_where_and_the_last_good_checkpoint():
    from agentrl_jax.learner.checkpoint import CheckpointSaveError

    try:
        try:
            raise ValueError(TENSORSTORE_ENOSPC)
        except ValueError as cause:
            raise CheckpointSaveError(2, "/w/checkpoints/2", cause) from cause
    except CheckpointSaveError as save:
        message = storage.failure_message(save, step_done=3, total=4, last_checkpoint=1,
                                          workdir="/w")
    assert message == ("checkpoint save of step 2 failed: No space left on device "
                       "(/w/checkpoints/2); the last good checkpoint is step 1; environment "
                       "servers and rollout engine stopped; free some space, then the same "
                       "command resumes from it (workdir /w)")
    write = OSError(errno.ENOSPC, "No space left on device", "/w/trajectories_train.jsonl")
    assert storage.failure_message(write, step_done=1, total=3, last_checkpoint=None,
                                   workdir="/w") == (
        "writing /w/trajectories_train.jsonl failed during step 2/3: No space left on device; "
        "no checkpoint was written; environment servers and rollout engine stopped; free some "
        "space, then the same command starts it again (workdir /w)")
    readonly = OSError(errno.EROFS, "Read-only file system", "/w/metrics.jsonl")
    assert "fix the workdir, then the same command resumes" in storage.failure_message(
        readonly, step_done=3, total=3, last_checkpoint=3, workdir="/w")
    assert storage.failure_message(RuntimeError("boom"), step_done=1, total=3,
                                   last_checkpoint=1, workdir="/w") is None


def test_quiet_filter_drops_only_records_about_refused_writes():
    logger = logging.getLogger("absl")
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    handler = Keep()
    logger.addHandler(handler)
    logging.getLogger("asyncio").addHandler(handler)
    quiet = storage.quiet_storage_errors()
    try:
        logger.error("_SignalingThread.run() raised an exception: %s", TENSORSTORE_ENOSPC)
        try:
            raise ValueError(TENSORSTORE_ENOSPC)
        except ValueError:
            logger.exception("Save Finalize thread (save_finalize) failed.")
        logger.error("something else broke")
        # asyncio's report of an orbax write future nobody awaited (after the failed save)
        logging.getLogger("asyncio").error(
            "Future exception was never retrieved\nfuture: <Future finished exception="
            "ValueError(%r)>", TENSORSTORE_ENOSPC)
    finally:
        storage.unquiet(quiet)
        logger.error("after: %s", "No space left on device")
        logger.removeHandler(handler)
        logging.getLogger("asyncio").removeHandler(handler)
    assert seen == ["something else broke", "after: No space left on device"]


# ----------------------------------------------------------------------------- metrics writer
def test_metrics_writer_writes_tensorboard_events_synchronously(tmp_path):
    writer = MetricsWriter(str(tmp_path / "tb"), str(tmp_path / "metrics.jsonl"), purge_step=3)
    writer.write(3, {"train/horizon": 2, "eval/avg@4": np.float32(0.5), "x": float("nan"),
                     "text": "skipped"})
    writer.write(4, {"train/horizon": 3})
    # written and flushed already (no writer thread): readable before close
    (name,) = os.listdir(tmp_path / "tb")
    events = read_events(str(tmp_path / "tb" / name))
    assert events[0].file_version == "brain.Event:2"
    assert (events[1].step, events[2].step, events[2].session_log.status) == (3, 3, 1)  # START
    assert [(e.step, {v.tag: v.simple_value for v in e.summary.value}) for e in events[3:]] == [
        (3, {"train/horizon": 2.0, "eval/avg_4": 0.5}), (4, {"train/horizon": 3.0})]
    assert not any(type(t).__name__ == "_EventLoggerThread" for t in threading.enumerate())
    # the framing is tensorboardX's own: its RecordWriter writes the same bytes
    from tensorboardX.record_writer import RecordWriter
    copy = RecordWriter(str(tmp_path / "copy"))
    for event in events:
        copy.write(event.SerializeToString())
    copy.close()
    assert open(tmp_path / "copy", "rb").read() == open(tmp_path / "tb" / name, "rb").read()
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [(r["step"], r.get("train/horizon")) for r in rows] == [(3, 2.0), (4, 3.0)]
    writer.close()


def test_metrics_writer_raises_at_once_on_a_full_disk_injected(tmp_path, monkeypatch):
    writer = MetricsWriter(str(tmp_path / "tb"), str(tmp_path / "metrics.jsonl"))
    refused = OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(writer._writer, "_file", types.SimpleNamespace(
        write=lambda data: (_ for _ in ()).throw(refused), close=lambda: None))
    threads = threading.active_count()
    for _ in range(3):  # tensorboardX's queue (10 events) would be full after one step
        with pytest.raises(OSError) as error:  # each write raises in its caller, none blocks
            writer.write(1, {f"m{i}": i for i in range(20)})
        assert error.value.errno == errno.ENOSPC
        assert error.value.filename.startswith(str(tmp_path / "tb" / "events.out.tfevents."))
    assert threading.active_count() == threads  # no writer thread left holding the events


def test_metrics_writer_raises_at_once_on_a_full_tmpfs(small_fs):
    root = small_fs("256k")
    writer = MetricsWriter(os.path.join(root, "tb"), os.path.join(root, "metrics.jsonl"))
    writer.write(1, {"a": 1.0})
    fill(root)
    with pytest.raises(OSError) as error:  # raised by the write that no longer fits, not later
        for step in range(2, 200):  # one of them no longer fits
            writer.write(step, {f"metric/{i}": float(i) for i in range(50)})
    assert error.value.errno == errno.ENOSPC
    assert error.value.filename.startswith(root)
    writer.close()  # closing a writer whose disk is full does not hang either


# ----------------------------------------------------------------------------- checkpoints
def _tree(n: int, seed: int = 0) -> dict:
    import jax.numpy as jnp
    return {"w": jnp.asarray(np.random.default_rng(seed).random(n, np.float32))}


def test_checkpoint_save_on_a_full_tmpfs_fails_named_and_keeps_the_last_good_one(small_fs):
    from agentrl_jax.learner.checkpoint import Checkpointer, CheckpointSaveError

    root = small_fs("3m")
    directory = os.path.join(root, "ck")
    ck = Checkpointer(directory, max_to_keep=3)
    ck.save(1, {"params": _tree(1000)}, {"step": 1})
    ck.wait()
    ck.save(2, {"params": _tree(2_000_000, 1)}, {"step": 2})  # 8 MB of noise into 3 MB
    t0 = time.monotonic()
    with pytest.raises(CheckpointSaveError) as error:
        while time.monotonic() - t0 < 30:  # check() never blocks: poll it as the trainer does
            ck.check()
            time.sleep(0.05)
    assert error.value.step == 2 and error.value.path == os.path.join(directory, "2")
    assert storage.reason(storage.storage_error(error.value)) == "No space left on device"
    assert any(".orbax-checkpoint-tmp" in n for n in os.listdir(directory))
    assert ck.remove_partial() and sorted(os.listdir(directory)) == ["1"]
    trees, state = ck.restore(None, {"params": _tree(1000)})
    assert state == {"step": 1}
    np.testing.assert_array_equal(np.asarray(trees["params"]["w"]), np.asarray(_tree(1000)["w"]))
    ck.close()


def test_checkpoint_save_error_injected_names_the_step(tmp_path, monkeypatch):
    from agentrl_jax.learner.checkpoint import Checkpointer, CheckpointSaveError

    ck = Checkpointer(str(tmp_path / "ck"), max_to_keep=3)
    ck.save(1, {"params": _tree(10)}, {"step": 1})

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ck._manager, "save", full)
    with pytest.raises(CheckpointSaveError) as error:
        ck.save(2, {"params": _tree(10)}, {"step": 2})  # waits for step 1 first: it succeeded
    assert error.value.step == 2 and isinstance(error.value.__cause__, OSError)
    assert ck.all_steps() == [1]
    ck.close()


# ----------------------------------------------------------------------------- summary
def test_append_session_adds_a_record_and_touches_nothing_else(tmp_path):
    workdir = str(tmp_path)
    assert append_session(workdir, {"stopped": "interrupted"}) is None
    assert [s["stopped"] for s in read_summary(workdir)["sessions"]] == ["interrupted"]
    full = {"workdir": workdir, "final_step": 3, "finished_step": 3, "first_reward": 0.1,
            "evals": {"3": {"avg_at_k": 0.5}},
            "sessions": [{"steps": 3, "mean_step_seconds": 2.0, "stopped": "total_steps"}]}
    json.dump(full, open(tmp_path / "summary.json", "w"))
    assert append_session(workdir, {"stopped": "run_failed", "error": "boom", "steps": 1,
                                    "mean_step_seconds": 6.0}) is None
    summary = read_summary(workdir)
    assert {k: v for k, v in summary.items() if k not in ("sessions", "mean_step_seconds")} == {
        k: v for k, v in full.items() if k != "sessions"}
    assert summary["mean_step_seconds"] == pytest.approx((3 * 2.0 + 1 * 6.0) / 4)
    assert [s["stopped"] for s in summary["sessions"]] == ["total_steps", "run_failed"]
    assert summary["sessions"][1]["ended"]  # a timestamp


def test_append_session_on_a_full_disk_says_so_and_leaves_the_summary(small_fs):
    root = small_fs("64k")
    assert append_session(root, {"stopped": "interrupted"}) is None
    before = open(os.path.join(root, "summary.json")).read()
    fill(root)
    problem = append_session(root, {"stopped": "storage_failed", "error": "x" * 50000})
    assert problem == "summary.json not updated: No space left on device"
    assert open(os.path.join(root, "summary.json")).read() == before
    assert sorted(os.listdir(root)) == ["filler", "summary.json"]  # no temporary left


def test_outcome_classifies_how_a_session_ended():
    from agentrl_jax.training.rl.failed_steps import RunFailure

    assert outcome(KeyboardInterrupt()) == {"stopped": "interrupted"}
    assert outcome(RunFailure("stopped at step 3: babyai died")) == {
        "stopped": "run_failed", "error": "stopped at step 3: babyai died"}
    assert outcome(storage.StorageFailure("writing x failed")) == {
        "stopped": "storage_failed", "error": "writing x failed"}
    assert outcome(ZeroDivisionError("division by zero\nmore")) == {
        "stopped": "error", "error": "ZeroDivisionError: division by zero"}
    assert merge_summary({}, {"sessions": [outcome(KeyboardInterrupt())]}) == {
        "sessions": [{"stopped": "interrupted"}]}


# ----------------------------------------------------------------------------- the trainer
def _trainer(workdir: str):
    from agentrl_jax.training.rl.trainer import Trainer
    sys.path.insert(0, REPO)
    from experiments.smoke import get_config

    return Trainer(get_config(), workdir, progress=False)


@pytest.mark.parametrize("error,stopped", [
    (KeyboardInterrupt(), "interrupted"),
    (RuntimeError("the engine broke"), "error"),
])
def test_every_session_end_is_recorded_in_the_summary(tmp_path, error, stopped):
    trainer = _trainer(str(tmp_path / "run"))

    async def run():
        trainer.start_step, trainer.stop.step_done = 2, 3
        raise error

    trainer._run = run
    with pytest.raises(type(error)):
        trainer.run()
    (record,) = read_summary(trainer.workdir)["sessions"]
    assert record["stopped"] == stopped
    assert (record["start_step"], record["final_step"]) == (2, 3)
    assert "finished_step" not in read_summary(trainer.workdir)


def test_a_refused_write_ends_the_trainer_in_one_line(tmp_path):
    from agentrl_jax.learner.checkpoint import Checkpointer

    trainer = _trainer(str(tmp_path / "run"))
    checkpoints = os.path.join(trainer.workdir, "checkpoints")
    trainer.learner = types.SimpleNamespace(checkpointer=Checkpointer(checkpoints))
    os.makedirs(os.path.join(checkpoints, "1"))
    os.makedirs(os.path.join(checkpoints, "2.orbax-checkpoint-tmp"))  # a save cut short
    path = os.path.join(trainer.workdir, "trajectories_train.jsonl")

    async def run():
        trainer.start_step, trainer.stop.step_done = 0, 1
        raise OSError(errno.ENOSPC, "No space left on device", path)

    trainer._run = run
    with pytest.raises(storage.StorageFailure) as failure:
        trainer.run()
    assert str(failure.value) == (
        f"writing {path} failed during step 2/3: No space left on device; the last good "
        "checkpoint is step 1; environment servers and rollout engine stopped; free some "
        f"space, then the same command resumes from it (workdir {trainer.workdir})")
    assert failure.value.__cause__ is None and failure.value.__suppress_context__
    assert os.listdir(checkpoints) == ["1"]  # the partial checkpoint is gone
    (record,) = read_summary(trainer.workdir)["sessions"]
    assert record["stopped"] == "storage_failed" and record["error"] == str(failure.value)


def test_watched_work_stops_as_soon_as_the_check_fails():
    import asyncio

    calls = []

    def check():
        calls.append(time.monotonic())
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")

    ended = []

    async def work(seconds):
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            ended.append("cancelled")
            raise
        ended.append("done")
        return "done"

    async def main():
        assert await storage.watched(work(0.05), check, interval_s=0.02) == "done"
        calls.clear()
        ended.clear()
        with pytest.raises(OSError):
            await storage.watched(work(3600), check, interval_s=0.05)
        return asyncio.all_tasks()

    left = asyncio.run(main())
    # the third check stopped it: the work was cancelled, not waited for
    assert len(calls) == 3 and ended == ["cancelled"]
    assert len(left) == 1  # only main itself: the work and the watcher were cancelled


def test_stderr_drops_only_tracebacks_of_a_closed_event_loop():
    import io

    out = io.StringIO()
    stream = storage.DropClosedLoopTracebacks(out)
    closed = ['Traceback (most recent call last):\n',
              '  File "/usr/lib/python3.11/asyncio/base_events.py", line 806, in '
              'call_soon_threadsafe\n', '    self._check_closed()\n',
              '  File "/usr/lib/python3.11/asyncio/base_events.py", line 519, in _check_closed\n',
              "    raise RuntimeError('Event loop is closed')\n", "RuntimeError", ": ",
              "Event loop is closed", "\n"]
    other = ['Traceback (most recent call last):\n', '  File "x.py", line 1, in <module>\n',
             "    f()\n", "RuntimeError: Event loop is closed\n"]  # raised from our own code
    for piece in ["line before\n", *closed, *other, *closed, "line after\n"]:
        stream.write(piece)
    assert out.getvalue() == "line before\n" + "".join(other) + "line after\n"
    # tracebacks of different threads, written at once, are judged each on its own
    out.seek(0), out.truncate()
    thread = threading.Thread(target=lambda: [stream.write(p) for p in closed[:4]])
    thread.start(), thread.join()
    stream.write("main thread\n")
    assert out.getvalue() == "main thread\n"
