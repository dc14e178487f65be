"""kill -9 campaign against the trainer: SIGKILL at random points, resume, check the run.

    python benchmarks/checks/kill_resume.py --kills 6 --seed 1 --json kills.json

Runs ``launch/run.py --config experiments/smoke.py`` (tiny random model, real BabyAI and
TextCraft servers) in a fresh workdir, kills it with SIGKILL ``--kills`` times at points drawn
at random (a phase: during a rollout, an update or a checkpoint save, then a random delay of up
to 0.5 s after the line that opens that phase, in the first or second step the session
runs), starting it again after each kill, then lets the
last session finish with ``train.max_staleness=1`` (every update after the resume but the last
overlaps a rollout). The run has ``2 x kills + 2`` steps. Then it checks (``check_run``): the run
finished; every step appears exactly once in ``metrics.jsonl`` and
``trajectories_train.jsonl.gz`` (the smoke config keeps every episode) and the final evaluation
once in ``trajectories_eval.jsonl.gz`` (a killed writer's cut-off gzip member is rewound away);
no episode failed (no env_error / engine_error) and every turn is within the staleness bound
of its step; each step's horizon is the schedule's; the checkpoint of the last step exists.

``tests/test_kill_resume.py`` uses the same pieces (``Run``, ``check_run``) with two kills.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:  # run as a script
    sys.path.insert(0, REPO)

from agentrl_common.jsonl_files import GZIP_SUFFIX, read_records  # noqa: E402

SMOKE = ["launch/run.py", "--config", "experiments/smoke.py", "--config.progress_seconds=0"]


class Run:
    """``launch/run.py`` on the smoke config as a subprocess; its merged stdout / stderr is read
    line by line (``lines``). ``cache``: a JAX compilation cache directory shared by sessions
    (a restart then compiles less)."""

    def __init__(self, workdir: str, cache: str | None, *overrides: str):
        env = dict(os.environ)
        env.pop("XLA_FLAGS", None)  # the job itself runs on the machine's real devices
        if cache:
            env.update(JAX_COMPILATION_CACHE_DIR=cache,
                       JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                       JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1")
        self.started = time.monotonic()
        self.proc = subprocess.Popen([sys.executable, *SMOKE, "--workdir", workdir, *overrides],
                                     cwd=REPO, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, bufsize=1)
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = 600.0, after: int = 0) -> int:
        """Index of the first line (from ``after``) matching the regex ``pattern``; raises
        ``AssertionError`` (with the output's tail) if the process ends first or on timeout."""
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern)
        with self._changed:
            while True:
                for i in range(after, len(self.lines)):
                    if regex.search(self.lines[i]):
                        return i
                if self.proc.poll() is not None and not self._reader.is_alive():
                    raise AssertionError(f"exited ({self.proc.returncode}) before {pattern!r}:\n"
                                         + self.output[-4000:])
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {pattern!r} in {timeout} s:\n" + self.output[-4000:])
                self._changed.wait(min(left, 1.0))

    def kill(self) -> None:
        """SIGKILL the trainer (its environment servers exit on their own: --parent-pid)."""
        self.proc.send_signal(signal.SIGKILL)
        code = self.finish(60)
        if code != -signal.SIGKILL:
            raise AssertionError(f"exit code {code}, not killed:\n" + self.output[-3000:])

    def finish(self, timeout: float = 900.0) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(30)
        return code


def children(pid: int, module: str | None = None) -> list[int]:
    """Processes whose parent is ``pid`` (and whose command line contains ``module``)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = open(f"/proc/{entry}/stat").read()
            cmdline = open(f"/proc/{entry}/cmdline", "rb").read().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid and (module is None or module in cmdline):
            found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pids: list[int], timeout: float = 20.0) -> None:
    """Wait until every process of ``pids`` has exited (AssertionError after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in pids):
        if time.monotonic() > deadline:
            raise AssertionError(f"processes {[p for p in pids if _alive(p)]} still alive")
        time.sleep(0.1)


def _stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is stopped (state T)."""
    try:
        return all(open(f"/proc/{pid}/task/{t}/stat").read().rsplit(")", 1)[1].split()[0] == "T"
                   for t in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return False


def kill_server_holding_a_session(run: Run, server: int, url: str, until: str,
                                  settle: float = 0.05, timeout: float = 120.0) -> None:
    """SIGKILL the environment server ``server`` (at ``url``) at a moment it holds an episode
    of ``run``'s trainer that has not ended, before a line matching ``until`` is printed.

    Racing a kill against the output cannot promise that: a rollout can end between the line
    read and the kill. So the trainer (whose episodes run in its own process, the default
    ``rollout.actor_workers=0``) is paused with SIGSTOP, the server is given ``settle`` seconds
    to answer what the trainer had already sent, and its ``GET /stats`` read: an open session
    then belongs to an episode that has not ended (an episode closes its session as it ends).
    Kill if one is open, else resume the trainer and look again a moment later. AssertionError
    if ``until`` is printed (or ``timeout`` passes) first.
    """
    regex = re.compile(until)
    start = len(run.lines)
    deadline = time.monotonic() + timeout
    while True:
        if any(regex.search(line) for line in run.lines[start:]) or time.monotonic() > deadline:
            raise AssertionError(f"no open {url} session seen before {until!r}:\n"
                                 + run.output[-3000:])
        os.kill(run.proc.pid, signal.SIGSTOP)
        try:
            while not _stopped(run.proc.pid):
                time.sleep(0.001)
            time.sleep(settle)
            with urllib.request.urlopen(url + "/stats", timeout=10) as answer:
                if json.load(answer)["live_sessions"] > 0:
                    os.kill(server, signal.SIGKILL)
                    return
        finally:
            os.kill(run.proc.pid, signal.SIGCONT)
        time.sleep(0.01)


def rows(path: str) -> list[dict[str, Any]]:
    """The JSON rows of a plain or ``.jsonl.gz`` file; the compressed log when ``path`` names
    the plain one and only the compressed one exists."""
    if not os.path.exists(path) and os.path.exists(path + GZIP_SUFFIX):
        path += GZIP_SUFFIX
    return read_records(path)


PHASES = ("rollout", "update", "save", "later save", "first update")


def kill_point(phase: str, step: int, total: int) -> str:
    """The regex of the line that opens ``phase`` of training step ``step`` (1-based) of a run
    of ``total`` steps: the rollout (a progress line with a generated turn), the update (the
    rollout's last progress line: every episode done), the checkpoint save; ``later save``: the
    save of a step >= 2, by which time checkpoint ``step - 1`` is complete (restored, or saved
    in this session: orbax finishes one save before it starts the next), so the next session
    resumes from a checkpoint; ``first update``: the session's first update (its compilation)."""
    if phase == "rollout":
        return rf"^step {step}/{total} rollout \(horizon \d+\): \d+/\d+ episodes, [1-9]\d* turns"
    if phase == "update":
        return rf"^step {step}/{total} rollout \(horizon \d+\): (\d+)/\1 episodes"
    if phase in ("save", "later save"):
        return rf"^saving checkpoint step {step} \.\.\.$"
    if phase == "first update":
        return r"^first update \(compiles the train step\) \.\.\.$"
    raise ValueError(f"unknown phase {phase!r}; known: {PHASES}")


def target_step(phase: str, checkpoint: int, offset: int, total: int) -> int:
    """The step a session that resumes from ``checkpoint`` is killed in: ``offset`` steps after
    its first (at least 2 for ``later save``), at most ``total - 1``. A session moves the
    checkpoint on by at most ``offset + 1`` steps, so with offsets <= 1 a run of
    ``2 x kills + 2`` steps reaches every kill point and leaves the last session >= 2 steps."""
    return min(max(checkpoint + 1 + offset, 2 if phase == "later save" else 1), total - 1)


def resumed_at(output: str) -> int:
    found = re.search(r"^resumed at step (\d+)$", output, re.M)
    return int(found.group(1)) if found else 0


def check_run(workdir: str, total: int, overlap_from: int) -> dict[str, Any]:
    """Check a finished run (see the module docstring); ``overlap_from``: the first rollout
    step (0-based) of the session with ``max_staleness=1``. Returns counts for the report."""
    from agentrl_jax.training.rl.schedule import HorizonSchedule
    from experiments.smoke import get_config

    schedule = HorizonSchedule.from_config(dict(get_config().horizon))
    metrics = rows(os.path.join(workdir, "metrics.jsonl"))
    train_rows = [m for m in metrics if "train/horizon" in m]
    assert [m["step"] for m in train_rows] == list(range(1, total + 1)), \
        [m["step"] for m in train_rows]
    # each step's horizon is the schedule's, across resumes
    assert [m["train/horizon"] for m in train_rows] == [schedule.horizon(s) for s in range(total)]
    for m in train_rows:
        assert m.get("rollout/status/engine_error", 0) == 0, m
        assert m.get("rollout/status/env_error", 0) == 0, m
        assert m["rollout/stale_dropped"] == 0, m
    assert [m["step"] for m in metrics if "eval/tasks_scored" in m] == [total]
    episodes = rows(os.path.join(workdir, "trajectories_train.jsonl"))
    per_step = collections.Counter(t["step"] for t in episodes)
    assert per_step == {s: 4 for s in range(1, total + 1)}, per_step  # update s's episodes
    for t in episodes:
        s = t["step"] - 1  # the 0-based loop index of update t["step"]
        assert t["horizon"] == schedule.horizon(s), (t["step"], t["horizon"])
        assert t["status"] in ("done", "max_turns", "context_limit"), (t["step"], t["status"])
        bound = 1 if s >= overlap_from else 0
        assert t["turn_versions"] and all(0 <= s - v <= bound
                                          for v in t["turn_versions"]), t["turn_versions"]
    evals = rows(os.path.join(workdir, "trajectories_eval.jsonl"))
    assert [t["step"] for t in evals] == [total] * 4, [t["step"] for t in evals]
    summary = json.load(open(os.path.join(workdir, "summary.json")))
    assert summary["finished_step"] == total and summary["evals"][str(total)]["valid"]
    assert os.path.isdir(os.path.join(workdir, "checkpoints", str(total)))
    return {"train_rows": len(train_rows), "episodes": len(episodes), "eval_episodes": len(evals)}


def kill_and_resume(workdir: str, cache: str | None, kills: list[tuple[str, float, int]],
                    total: int | None = None, say=print) -> dict[str, Any]:
    """Kill a smoke run of ``total`` steps (default ``2 x len(kills) + 2``) once per
    ``(phase, delay, offset)`` of ``kills``: ``delay`` seconds after the line that opens
    ``phase`` of step ``target_step(phase, latest checkpoint, offset, total)``, starting it
    again after each kill; then let the last session finish with ``max_staleness=1`` and check
    the run. Returns a report (one record per session)."""
    from agentrl_jax.training.runtime.policy import checkpoint_steps

    total = total or 2 * len(kills) + 2
    sessions = []
    for phase, delay, offset in kills:
        checkpoint = max(checkpoint_steps(os.path.join(workdir, "checkpoints")), default=0)
        step = target_step(phase, checkpoint, offset, total)
        run = Run(workdir, cache, f"--config.train.total_steps={total}")
        run.wait_for(kill_point(phase, step, total))
        time.sleep(delay)
        servers = children(run.proc.pid, "environments.")
        last = run.lines[-1]
        run.kill()
        wait_gone(servers)
        dropped = re.search(r"^logs rewound to step \d+: dropped (.*) \(written", run.output, re.M)
        sessions.append({"killed": phase, "step": step, "delay_s": round(delay, 3),
                         "last_line": last, "resumed_at": resumed_at(run.output),
                         "rewound": dropped.group(1) if dropped else None,
                         "seconds": round(time.monotonic() - run.started, 1)})
        say(f"session {len(sessions)}: {sessions[-1]}", flush=True)
    run = Run(workdir, cache, f"--config.train.total_steps={total}",
              "--config.train.max_staleness=1")
    code = run.finish()
    if code != 0:
        raise AssertionError(f"the last session exited with {code}:\n" + run.output[-4000:])
    start = resumed_at(run.output)
    dropped = re.search(r"^logs rewound to step \d+: dropped (.*) \(written", run.output, re.M)
    sessions.append({"finished": True, "resumed_at": start,
                     "rewound": dropped.group(1) if dropped else None,
                     "overlapped_updates": total - start - 1,
                     "seconds": round(time.monotonic() - run.started, 1)})
    say(f"session {len(sessions)}: {sessions[-1]}", flush=True)
    counts = check_run(workdir, total, overlap_from=start)
    return {"steps": total, "sessions": sessions, "check": counts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=6)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--phases", default="rollout,update,save,first update",
                        help=f"comma-separated, from {', '.join(PHASES)}")
    parser.add_argument("--json", default=None, help="write the report here")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    phases = [p.strip() for p in args.phases.split(",")]
    kills = [(rng.choice(phases), rng.uniform(0.0, 0.5), rng.randint(0, 1))
             for _ in range(args.kills)]
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kill-resume-") as tmp:
        report = kill_and_resume(os.path.join(tmp, "run"), os.path.join(tmp, "jax_cache"), kills)
    report.update(seed=args.seed, seconds=round(time.monotonic() - t0, 1), ok=True)
    print(json.dumps(report, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
