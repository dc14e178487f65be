"""The ``RolloutBackend`` contract (``base.py``: sampling parameters, results, errors, the
backend registry; standard library only, so actor workers import it without JAX) and its
implementations: ``sglang.py`` (client for SGLang-API servers), ``engine_servers.py`` (one
engine server process per device group behind that client) and the embedded engine
(``rollout/engine/engine.py``)."""
