"""Shared harness for tests that run several JAX processes on one machine (CPU, gloo).

The pytest process starts N worker subprocesses (each with 4 virtual CPU devices), may do its
own work meanwhile, then waits for all of them; a failure or timeout fails the test with the
tail of each failing worker's output.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_NOISE = ("Involuntary full rematerialization", "[Gloo]")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env(**extra: str) -> dict[str, str]:
    """Environment of a worker: 4 CPU devices, the repository importable, plus ``extra``."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.update(extra)
    return env


class Workers:
    """``Popen`` of each command (output to its log file); :meth:`wait` collects them."""

    def __init__(self, commands: list[list[str]], envs: list[dict], logs: list[Path]):
        self.start = time.monotonic()
        self.procs = []
        for cmd, env, log in zip(commands, envs, logs):
            f = open(log, "w+")
            self.procs.append((subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f,
                                                stderr=subprocess.STDOUT), f))

    def wait(self, timeout_s: float, tail: int = 80) -> list[str]:
        """Wait for every worker (killing all once ``timeout_s`` since the start has passed);
        their outputs. Fails the test if any exited non-zero or timed out."""
        outputs, failed = [], []
        for i, (proc, f) in enumerate(self.procs):
            try:
                rc = proc.wait(timeout=max(1.0, timeout_s - (time.monotonic() - self.start)))
            except subprocess.TimeoutExpired:
                rc = f"timeout after {timeout_s} s"
                self.kill()
            f.seek(0)
            output = f.read()
            f.close()
            outputs.append(output)
            if rc != 0:
                lines = [ln for ln in output.splitlines() if not any(n in ln for n in _NOISE)]
                failed.append(f"process {i}: exit {rc}\n" + "\n".join(lines[-tail:]))
        self.kill()
        if failed:
            pytest.fail("\n\n".join(failed))
        print(f"\n{len(self.procs)} processes: {time.monotonic() - self.start:.1f} s")
        return outputs

    def kill(self) -> None:
        for proc, _ in self.procs:
            if proc.poll() is None:
                proc.kill()


def init_worker(process_id: int, coordinator: str, num_processes: int) -> None:
    """In a worker: join the run (gloo CPU collectives) and check the global device count."""
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator, num_processes=num_processes, process_id=process_id)
    assert jax.process_count() == num_processes, jax.devices()
    assert jax.device_count() == 4 * num_processes and jax.local_device_count() == 4
