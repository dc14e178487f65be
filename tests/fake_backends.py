"""Shared pieces of the tests' fake rollout backends (no JAX)."""

from __future__ import annotations

from agentrl_jax.rollout.contract import RolloutBackend


class QuietBackend(RolloutBackend):
    """A rollout backend whose weight updates, health checks and closing do nothing; a test's
    fake defines only ``generate``."""

    async def update_weights(self, params=None, *, path=None, version=None):
        pass

    async def health(self):
        return True

    async def aclose(self):
        pass
