"""Starting a real SGLang server process (``python -m sglang.launch_server``) and waiting for
its ``/health``; used by the ``sglang`` backend's ``launch={...}`` option."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time


def sglang_available() -> bool:
    return importlib.util.find_spec("sglang") is not None


def launch_sglang_server(model_path: str, port: int = 30000, host: str = "127.0.0.1",
                         extra_args: list[str] | None = None, log_file: str | None = None,
                         python: str | None = None, wait: bool = True,
                         timeout: float = 900.0) -> tuple[subprocess.Popen, str]:
    """Start ``python -m sglang.launch_server --model-path ... --port ...`` and (by default)
    wait until its ``/health`` answers. Returns ``(process, base_url)``. Raises RuntimeError
    with install instructions when SGLang is not importable."""
    if python is None and not sglang_available():
        raise RuntimeError(
            "SGLang is not installed in this environment (`import sglang` fails). Install it on "
            "a CUDA machine (e.g. `pip install \"sglang[all]>=0.5\"`) or point the backend at "
            "running servers with urls=[...]. Our own server speaks the same API: "
            "`python -m agentrl_jax.rollout.servers.server --model <path> --port 30000`.")
    cmd = [python or sys.executable, "-m", "sglang.launch_server", "--model-path", model_path,
           "--host", host, "--port", str(port), *(extra_args or [])]
    out = open(log_file, "ab") if log_file else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://{host}:{port}"
    if wait:
        import urllib.error
        import urllib.request

        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"SGLang server exited with code {proc.returncode} "
                                   f"(command: {' '.join(cmd)}; log: {log_file or 'discarded'})")
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as resp:
                    if resp.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                proc.terminate()
                raise RuntimeError(f"SGLang server at {url} not healthy after {timeout}s")
            time.sleep(2)
    return proc, url


__all__ = ["launch_sglang_server", "sglang_available"]
