"""Test-session set-up shared by every test module.

8 virtual CPU devices so sharded code paths (data / fsdp / tensor meshes) run in the ordinary
suite; computations that are not sharded still run on device 0. Must happen before JAX starts.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def compile_cache_env(tmp_path_factory) -> dict[str, str]:
    """Environment variables that give the subprocesses a test session starts (``launch/run.py``,
    ``launch/eval.py``, multi-process workers) one shared JAX persistent compilation cache, so a
    resumed or repeated smoke run does not compile its programs again. The cache changes only
    how long a start-up takes, not what runs; the pytest process itself does not use it (these
    variables are passed to the subprocesses only, never set in ``os.environ``)."""
    return {"JAX_COMPILATION_CACHE_DIR": str(tmp_path_factory.mktemp("jax_compile_cache")),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1"}


@pytest.fixture
def startup_heap_frozen():
    """The heap as a served process has it: servers freeze their start-up objects
    (``agentrl_common.httpguard.freeze_heap``), so full collections scan only what
    requests made. This pytest process carries the whole suite's objects (~1M by the middle of
    the suite); a full collection of them holds the GIL (long enough to matter:
    docs/PERFORMANCE.md) and stalls any event loop or timed call, whatever the code under test
    does."""
    import gc

    from agentrl_common.httpguard import freeze_heap

    freeze_heap()
    yield
    gc.unfreeze()
