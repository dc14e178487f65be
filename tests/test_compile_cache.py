"""agentrl_jax/compile_cache.py: the launchers' persistent compilation cache setting, and a
program compiled by one process is loaded, not compiled, by the next."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import pytest

from agentrl_jax import compile_cache

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def restore_jax_cache_config():
    keys = ("jax_compilation_cache_dir", "jax_compilation_cache_max_size",
            "jax_persistent_cache_min_compile_time_secs")
    before = {k: getattr(jax.config, k) for k in keys}
    yield
    for k, v in before.items():
        jax.config.update(k, v)


def test_setting_names_the_folder(tmp_path, monkeypatch, restore_jax_cache_config):
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.setenv("AGENTRL_JAX_CACHE", str(tmp_path / "home"))
    assert compile_cache.cache_folder("") is None
    assert compile_cache.cache_folder("auto") == str(tmp_path / "home" / "jax_compile")
    assert compile_cache.enable("") is None
    folder = compile_cache.enable(str(tmp_path / "mine"))
    assert folder == str(tmp_path / "mine") and os.path.isdir(folder)
    assert jax.config.jax_compilation_cache_dir == folder
    assert jax.config.jax_compilation_cache_max_size == compile_cache.MAX_BYTES
    # JAX's own variable wins (the test suite's subprocesses share one that way); empty: off
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "env"))
    assert compile_cache.enable("auto") == str(tmp_path / "env")
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "")
    assert compile_cache.enable("auto") is None


_PROGRAM = r"""
import sys
import jax, jax.numpy as jnp
from agentrl_jax import compile_cache
hits = []
jax.monitoring.register_event_listener(
    lambda event, **kw: hits.append(event) if event == "/jax/compilation_cache/cache_hits" else None)
compile_cache.enable(sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
@jax.jit
def f(x):
    for _ in range(40):
        x = jnp.sin(x @ x.T) + x
    return x
f.lower(jnp.ones((64, 64))).compile()
print(len(hits))
"""


def test_a_second_process_loads_what_the_first_compiled(tmp_path):
    """JAX's own cache-hit event: none in the first process, some in the second."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    folder = tmp_path / "cache"

    def hits() -> int:
        done = subprocess.run([sys.executable, "-c", _PROGRAM, str(folder)], cwd=REPO, env=env,
                              check=True, capture_output=True, text=True, timeout=120)
        return int(done.stdout.split()[-1])

    assert hits() == 0
    assert any(p.name.endswith("-cache") for p in folder.iterdir())  # it wrote its program
    assert hits() >= 1  # f and the small programs beside it
