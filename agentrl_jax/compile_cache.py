"""JAX's persistent compilation cache for the launchers (``launch/run.py``, ``sft.py``,
``eval.py``): a run started again (a resume after a kill or a preemption, the next seed of the
same config, an evaluation of its checkpoint) loads the programs an earlier one compiled
instead of compiling them again (the engine's warm-up shapes, the learner's update).

The ``compile_cache`` setting: ``"auto"`` (the default) is ``<cache_dir>/jax_compile`` (see
``models.tokenizer.cache_dir``: ``$AGENTRL_JAX_CACHE`` or ``~/.cache/agentrl_jax``), ``""`` turns
it off, anything else is the folder. ``$JAX_COMPILATION_CACHE_DIR``, when set, is JAX's own
choice and wins. The folder is bounded (least recently used entries go first).
"""

from __future__ import annotations

import os

#: the cache folder's bound, bytes (JAX's least-recently-used eviction)
MAX_BYTES = 8 * 2 ** 30
#: programs that compile faster than this are not written (their load would cost as much)
MIN_COMPILE_SECONDS = 1.0


def cache_folder(setting: str) -> str | None:
    """The folder ``setting`` names (module docstring), or None when the cache is off."""
    if not setting:
        return None
    if setting == "auto":
        from agentrl_jax.models.tokenizer import cache_dir

        return os.path.join(cache_dir(), "jax_compile")
    return os.path.abspath(os.path.expanduser(setting))


def enable(setting: str) -> str | None:
    """Turn the persistent cache on for this process as ``setting`` says; returns the folder in
    use (JAX's own ``$JAX_COMPILATION_CACHE_DIR`` when that is set), or None when it is off.
    Call before the first compilation."""
    import jax

    if os.environ.get("JAX_COMPILATION_CACHE_DIR") is not None:  # JAX reads it itself
        return os.environ["JAX_COMPILATION_CACHE_DIR"] or None
    folder = cache_folder(setting)
    if folder is None:
        return None
    os.makedirs(folder, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", folder)
    jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
    return folder
