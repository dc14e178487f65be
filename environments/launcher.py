"""Start family servers as subprocesses on loopback and stop them cleanly.

``start_env_server("babyai")`` runs ``python -m environments.babyai --host 127.0.0.1 --port P``
in its own process group, waits until ``GET /health`` answers, and returns a ``ServerProcess``;
``stop()`` sends SIGTERM to the whole group (the server closes every instance), then SIGKILL
after a grace period, so no environment process (a JVM, a browser) outlives it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Sequence

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

    def __init__(self, name: str, host: str, port: int, process: subprocess.Popen, log_file) -> None:
        self.name = name
        self.host = host
        self.port = port
        self.process = process
        self._log_file = log_file
        self._final_log: str | None = None  # the output kept when stop() deletes the log file

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

    def _signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, sig)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"ServerProcess({self.name!r}, url={self.url!r}, pid={self.pid}, alive={self.alive()})"


def start_env_server(
    name: str,
    port: int | None = None,
    host: str = "127.0.0.1",
    extra_args: Sequence[str] = (),
    *,
    startup_timeout: float = 120.0,
    env: dict[str, str] | None = None,
    exit_with_parent: bool = True,
) -> ServerProcess:
    """Start ``python -m environments.<name>`` and wait until it is healthy.

    port: None picks a free port. extra_args: more server options, e.g.
    ``["--max-sessions", "64", "--idle-timeout", "300"]``. env: extra environment variables.
    exit_with_parent: the server shuts itself down (within ~1 s) if this process dies without
    calling ``stop()``. Raises ``ServerStartError`` (with the server's output tail) if it dies or
    stays unhealthy.
    """
    port = free_port(host) if port is None else port
    child_env = dict(os.environ)
    child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_REPO_ROOT), child_env.get("PYTHONPATH")]))
    child_env["PYTHONUNBUFFERED"] = "1"
    if env:
        child_env.update(env)
    log_file = tempfile.NamedTemporaryFile(prefix=f"envserver-{name}-", suffix=".log", delete=False)
    command = [sys.executable, "-m", f"environments.{name}", "--host", host, "--port", str(port), *extra_args]
    if exit_with_parent:
        command += ["--parent-pid", str(os.getpid())]
    process = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        env=child_env,
        cwd=str(_REPO_ROOT),
        start_new_session=True,  # its own process group: stop() reaches every descendant
    )
    server = ServerProcess(name, host, port, process, log_file)
    try:
        server.wait_healthy(startup_timeout)
    except BaseException:
        server.stop()
        raise
    return server
