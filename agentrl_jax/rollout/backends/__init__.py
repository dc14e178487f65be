"""The implementations of the ``RolloutBackend`` contract (``agentrl_jax/rollout/contract.py``:
sampling parameters, results, errors, the backend registry; standard library only, so actor
workers import it without JAX): ``sglang.py`` (client for SGLang-API servers),
``engine_servers.py`` (one engine server process per device group behind that client) and
``embedded.py`` (the in-process engine of ``rollout/engine/``). Each is one entry of
``contract.ROLLOUT_BACKENDS``."""
