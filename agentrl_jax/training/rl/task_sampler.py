"""Deterministic task sampling for training.

Environments take turns (round-robin over env names, so a family with many task ids does not
crowd out the others); within an environment, tasks come from a seeded permutation of its train
split, a fresh one per epoch. The whole state is one integer ``cursor`` (tasks handed out so
far), saved in checkpoints: a resumed run continues with exactly the next tasks. Each
environment's permutation of the current epoch is kept (not part of the state: it is a pure
function of the seed, environment and epoch), so a draw costs O(1), not a new permutation.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from agentrl_jax.agent.actor_pool import TaskRef


class TaskSampler:
    def __init__(self, tasks: Sequence[TaskRef], seed: int = 0, cursor: int = 0):
        if not tasks:
            raise ValueError("no training tasks")
        self.envs = sorted({t.env for t in tasks})
        self.by_env = {e: [t for t in tasks if t.env == e] for e in self.envs}
        self.seed = seed
        self.cursor = cursor
        self._orders: dict[int, tuple[int, np.ndarray]] = {}  # env index -> (epoch, order)

    def _order(self, env_index: int, epoch: int, n: int) -> np.ndarray:
        """The permutation of environment ``env_index``'s ``n`` tasks for ``epoch``."""
        cached = self._orders.get(env_index)
        if cached is None or cached[0] != epoch:
            order = np.random.default_rng([self.seed, env_index, epoch]).permutation(n)
            cached = self._orders[env_index] = (epoch, order)
        return cached[1]

    def _task(self, env_index: int, draw: int) -> TaskRef:
        tasks = self.by_env[self.envs[env_index]]
        epoch, index = divmod(draw, len(tasks))
        return tasks[int(self._order(env_index, epoch, len(tasks))[index])]

    def next(self, count: int) -> list[TaskRef]:
        out = []
        for _ in range(count):
            draw, env_index = divmod(self.cursor, len(self.envs))
            out.append(self._task(env_index, draw))
            self.cursor += 1
        return out
