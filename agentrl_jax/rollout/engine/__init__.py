"""The embedded JAX rollout engine: continuous batching (``engine.py``), decode slots and
requests, sampling and stop strings, the compiled prefill / decode steps (``compiled.py``,
``forward.py``), the decode-attention kernels, device placement, data-parallel replicas and
``EngineConfig``. Importing this package loads nothing; its modules load JAX."""
