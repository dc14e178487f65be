"""Start family servers as subprocesses on loopback and stop them cleanly.

``start_env_server("babyai")`` runs ``python -m environments.babyai --host 127.0.0.1 --port P``
in its own process group, waits until ``GET /health`` answers, and returns a ``ServerProcess``;
``stop()`` sends SIGTERM to the whole group (the server closes every instance), then SIGKILL
after a grace period, so no environment process (a JVM, a browser) outlives it.

``ServerSupervisor`` watches servers started here and restarts one that dies (``restart()``: a
fresh process on the same port, so clients keep their URL), up to ``max_restarts`` times per
server; past that it gives up on the server and reports it (``failures``). The sessions a dead
server held are gone: their episodes end with an ``env_error`` status.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Sequence

_REPO_ROOT = Path(__file__).resolve().parent.parent


class ServerStartError(RuntimeError):
    """The server process died or did not become healthy in time."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now on ``host``."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class ServerProcess:
    """A running family server. Use as a context manager or call ``stop()``."""

    def __init__(self, name: str, host: str, port: int, process: subprocess.Popen, log_file,
                 spawn: Callable[[], tuple[subprocess.Popen, object]] | None = None,
                 startup_timeout: float = 120.0) -> None:
        self.name = name
        self.host = host
        self.port = port
        self.process = process
        self._log_file = log_file
        self._final_log: str | None = None  # the output kept when stop() deletes the log file
        self._spawn = spawn  # starts the same command again (restart)
        self._startup_timeout = startup_timeout
        self.restarts = 0
        self.previous_exit_codes: list[int | None] = []  # of the processes restart() replaced

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, max_bytes: int = 4000) -> str:
        """The end of the server's combined stdout/stderr (also after ``stop()``)."""
        if self._final_log is not None:
            return self._final_log[-max_bytes:]
        try:
            self._log_file.flush()
            with open(self._log_file.name, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - max_bytes))
                return fh.read().decode(errors="replace")
        except (OSError, ValueError):
            return ""

    def wait_healthy(self, timeout: float) -> None:
        """Poll ``/health`` until it answers; raise ``ServerStartError`` if the process dies first."""
        deadline = time.monotonic() + timeout
        delay = 0.02
        while True:
            if not self.alive():
                raise ServerStartError(
                    f"{self.name} server exited with code {self.process.returncode} before becoming healthy;"
                    f" output tail:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2.0) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise ServerStartError(f"{self.name} server not healthy after {timeout:.0f} s; output tail:\n{self.log_tail()}")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.25)

    def stop(self, grace: float = 15.0) -> int | None:
        """SIGTERM the process group, SIGKILL it after ``grace`` seconds; returns the exit code."""
        if self.process.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.process.wait()
        # children that ignored SIGTERM or were orphaned by it
        self._signal_group(signal.SIGKILL)
        if self._final_log is None:
            self._final_log = self.log_tail(1 << 20)
        with contextlib.suppress(OSError):
            self._log_file.close()
            os.unlink(self._log_file.name)
        return self.process.returncode

    def restart(self) -> None:
        """Replace a dead (or live) server process by a fresh one with the same command on the
        same port, and wait until it is healthy (``ServerStartError`` otherwise). Whatever the
        old process group left behind is killed; its sessions are lost."""
        if self._spawn is None:
            raise RuntimeError(f"{self.name} server was not started by start_env_server")
        self._signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5.0)
        self.previous_exit_codes.append(self.process.returncode)
        with contextlib.suppress(OSError):
            self._log_file.close()
            os.unlink(self._log_file.name)
        self.process, self._log_file = self._spawn()
        self._final_log = None
        self.restarts += 1
        try:
            self.wait_healthy(self._startup_timeout)
        except ServerStartError:
            self._signal_group(signal.SIGKILL)  # dead for the supervisor's next look
            raise

    def _signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, sig)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"ServerProcess({self.name!r}, url={self.url!r}, pid={self.pid}, alive={self.alive()})"


def server_environment(env: dict[str, str] | None = None, accelerator: bool = False
                       ) -> dict[str, str]:
    """The environment variables of a server process: this process's, the repository on
    ``PYTHONPATH``, unbuffered output, then ``env``. Without ``accelerator`` (every environment
    server) JAX is kept on the CPU (``JAX_PLATFORMS=cpu`` unless ``env`` sets it): a server
    needs no accelerator, and one that imports JAX (the deep-search server does, through bm25s)
    otherwise initialises the GPU it inherits and preallocates most of its memory, so the
    trainer's engine on that GPU ran out of memory at start (seen on an H100)."""
    child_env = dict(os.environ)
    child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_REPO_ROOT), child_env.get("PYTHONPATH")]))
    child_env["PYTHONUNBUFFERED"] = "1"
    if not accelerator:
        child_env["JAX_PLATFORMS"] = "cpu"
    if env:
        child_env.update(env)
    return child_env


def start_env_server(
    name: str,
    port: int | None = None,
    host: str = "127.0.0.1",
    extra_args: Sequence[str] = (),
    *,
    startup_timeout: float = 120.0,
    env: dict[str, str] | None = None,
    exit_with_parent: bool = True,
    module: str | None = None,
) -> ServerProcess:
    """Start ``python -m environments.<name>`` and wait until it is healthy.

    port: None picks a free port. extra_args: more server options, e.g.
    ``["--max-sessions", "64", "--idle-timeout", "300"]``. env: extra environment variables.
    exit_with_parent: the server shuts itself down (within ~1 s) if this process dies without
    calling ``stop()``. module: run ``python -m <module>`` instead (another server with the
    same ``--host/--port/--parent-pid`` flags and ``GET /health``, e.g. the rollout server).
    Raises ``ServerStartError`` (with the server's output tail) if it dies or
    stays unhealthy.
    """
    port = free_port(host) if port is None else port
    child_env = server_environment(env, accelerator=module is not None)
    command = [sys.executable, "-m", module or f"environments.{name}", "--host", host, "--port", str(port), *extra_args]
    if exit_with_parent:
        command += ["--parent-pid", str(os.getpid())]

    def spawn() -> tuple[subprocess.Popen, object]:
        log_file = tempfile.NamedTemporaryFile(prefix=f"envserver-{name}-", suffix=".log", delete=False)
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=child_env,
            cwd=str(_REPO_ROOT),
            start_new_session=True,  # its own process group: stop() reaches every descendant
        )
        return process, log_file

    process, log_file = spawn()
    server = ServerProcess(name, host, port, process, log_file, spawn=spawn,
                           startup_timeout=startup_timeout)
    try:
        server.wait_healthy(startup_timeout)
    except BaseException:
        server.stop()
        raise
    return server


class ServerSupervisor:
    """Restarts the servers it watches when they die, up to ``max_restarts`` times each.

    A background thread checks every ``poll_interval`` seconds whether each server's process is
    alive; a dead one is restarted on its port (``ServerProcess.restart``) while it has
    restarts left (a failed restart attempt counts as one), otherwise it is given up on and
    listed in ``failures``. ``on_event`` gets one line per death, restart and give-up (from
    the supervisor's thread). Stop the supervisor before stopping the servers (``stop()``);
    as a context manager it starts and stops itself.
    """

    def __init__(self, servers: Sequence[ServerProcess], max_restarts: int = 3,
                 poll_interval: float = 0.5, on_event: Callable[[str], None] | None = None) -> None:
        if max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {max_restarts}")
        self.servers = list(servers)
        self.max_restarts = max_restarts
        self.poll_interval = poll_interval
        self.on_event = on_event
        self.events: list[str] = []
        self._failures: dict[int, str] = {}  # index of a given-up server -> why
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def failures(self) -> list[str]:
        """One line per server that died and could not be restarted (restarts exhausted)."""
        with self._lock:
            return list(self._failures.values())

    def start(self) -> ServerSupervisor:
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="env-server-supervisor", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> ServerSupervisor:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def _event(self, message: str) -> None:
        self.events.append(message)
        if self.on_event is not None:
            with contextlib.suppress(Exception):
                self.on_event(message)

    def check_once(self) -> None:
        """One pass over the servers: restart (or give up on) each dead one."""
        for i, server in enumerate(self.servers):
            if self._stop.is_set():
                return
            if i in self._failures or server.alive():
                continue
            code = server.process.returncode
            if server.restarts >= self.max_restarts:
                why = (f"{server.name} server {server.url} died (exit code {code}) after "
                       f"{server.restarts} restart(s); env.max_restarts={self.max_restarts} "
                       "reached, not restarting it")
                with self._lock:
                    self._failures[i] = why
                self._event(why)
                continue
            self._event(f"{server.name} server {server.url} died (exit code {code}); restarting it "
                        f"(restart {server.restarts + 1} of at most {self.max_restarts})")
            t0 = time.monotonic()
            try:
                server.restart()
            except (ServerStartError, OSError) as error:
                self._event(f"{server.name} server {server.url}: restart failed: "
                            f"{str(error).splitlines()[0]}")
                continue
            self._event(f"{server.name} server {server.url} restarted (pid {server.pid}) in "
                        f"{time.monotonic() - t0:.1f} s")

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_interval):
            self.check_once()
