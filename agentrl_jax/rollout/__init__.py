"""Rollout backends: the embedded JAX engine, its SGLang-compatible HTTP server, and a client
for SGLang servers, behind one async interface (``RolloutBackend``).

Heavy modules are imported lazily: ``from agentrl_jax.rollout import Engine`` loads JAX,
``SGLangBackend`` only aiohttp.
"""

from agentrl_jax.rollout.contract import (BackendUnavailableError, GenerateResult,
                                      InvalidRequestError, OverloadedError, RolloutBackend,
                                      RolloutError, SamplingParams, available_backends,
                                      create_backend, register_backend)

_LAZY = {
    "Engine": "agentrl_jax.rollout.engine.engine",
    "EngineConfig": "agentrl_jax.rollout.engine.engine",
    "EmbeddedBackend": "agentrl_jax.rollout.engine.engine",
    "RolloutServer": "agentrl_jax.rollout.servers.app",
    "ServerThread": "agentrl_jax.rollout.servers.server",
    "SGLangBackend": "agentrl_jax.rollout.backends.sglang",
    "launch_sglang_server": "agentrl_jax.rollout.servers.sglang_launch",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agentrl_jax.rollout' has no attribute {name!r}")


__all__ = ["SamplingParams", "GenerateResult", "RolloutBackend", "RolloutError",
           "InvalidRequestError", "OverloadedError", "BackendUnavailableError",
           "create_backend", "register_backend", "available_backends", *_LAZY]
