"""The Pallas (Triton) GPU kernels of agentrl-jax, in one place, each next to its plain-JAX
reference where one exists. ``interpret=True`` runs every kernel in the Pallas interpreter
(the CPU tests).

| module | kernel | caller |
|---|---|---|
| ``gae.py`` | multi-turn GAE, blocked scan + whitening statistics ``[B, T]`` | ``algorithms/gae.py`` |
| ``flash_attention.py`` | packed-row causal attention (JAX's ``mha`` with segment ids) | ``models/sharded_attention.py`` |
| ``segment_attention.py`` | packed-row causal attention skipping the blocks between sequences | ``models/llama.py`` |
| ``decode_attention.py`` | decode attention over the engine's KV cache: dense and ragged (``mqa``) | ``rollout/engine/forward.py`` |
| ``fused_decode_attention.py`` | decode attention + RoPE + cache write in one kernel | ``rollout/engine/forward.py`` |
| ``prefill_attention.py`` | prefill attention: dense and flash (gathered rows or in the cache) | ``rollout/engine/forward.py`` |

The kernels import only JAX (and ``agentrl_common``), never the rest of the library; which
kernel runs when (the fallbacks, the platform) is decided by their callers. Nothing is imported
here, so ``import agentrl_jax.kernels.x`` loads only ``x``.
"""
