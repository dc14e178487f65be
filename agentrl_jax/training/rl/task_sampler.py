"""Deterministic task sampling for training: which tasks a step's groups play
(``train.task_sampling``: :data:`SAMPLINGS`; :func:`make_task_sampler` builds each).

``permutation`` (:class:`TaskSampler`, the default): environments take turns (round-robin over
env names, so a family with many task ids does not crowd out the others); within an
environment, tasks come from a seeded permutation of its train split, a fresh one per epoch.
The whole state is one integer ``cursor`` (tasks handed out so far), saved in checkpoints: a
resumed run continues with exactly the next tasks. Each environment's permutation of the
current epoch is kept (not part of the state: it is a pure function of the seed, environment
and epoch), so a draw costs O(1), not a new permutation.

``learnability`` (:class:`LearnabilitySampler`): environments take turns as above; within an
environment a draw first picks a *level* (:func:`task_level`: the task id before its first
``/``), then the level's next task from a seeded permutation of the level's tasks (a fresh one
per pass over them). Each level keeps a running success estimate ``p`` (an exponential moving
average of the share of the step's finished training episodes with task score > 0, the score
evaluation uses: ``eval_metrics.outcome``), one update per level and step::

    p <- (1 - rate) p + rate * successes / episodes          (train.learnability_ema)

starting at the optimistic prior ``p = 1/2`` (the largest weight, so every level is tried).
A step draws an environment's ``k`` levels with probability proportional to the weight

    w = p (1 - p) + eps                                      (train.learnability_eps)

without replacement within the step while levels remain (then again from all of them).
``p (1 - p)`` is the variance of a level's 0/1 outcome: a level always or never solved gives
GRPO groups of equal scores (no gradient), one solved half the time the most informative
groups; ``eps`` keeps every level drawn now and then. The draws are a pure function of the
seed and the state (the step's randomness is seeded by ``[seed, cursor]``); the state is the
cursor, each level's draws so far and each level's estimate (:meth:`state`, saved in
checkpoints beside the cursor).
"""

from __future__ import annotations

import copy
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from agentrl_jax.agent.actor_pool import TaskRef
from agentrl_jax.training.config.sections import TASK_SAMPLINGS
from agentrl_jax.training.evaluation.eval_metrics import outcomes, passes

#: the choices of ``train.task_sampling`` (named once, in the config section)
SAMPLINGS = TASK_SAMPLINGS
#: the estimate of a level not yet observed: p (1 - p) is largest there, so it is tried early
PRIOR = 0.5
_LEARNABILITY_STREAM = 1  # keeps the step draws' seeds apart from the permutations'


def task_level(task_id: str) -> str:
    """A task's level: ``"BabyAI-GoTo-v0/seed=7"`` -> ``"BabyAI-GoTo-v0"``; an id without ``/``
    (TextCraft's goals) is a level of its own."""
    return task_id.partition("/")[0]


class TaskSampler:
    """``permutation``: environments in turn, a seeded permutation per environment and epoch
    (module docstring). ``cursor``: the tasks handed out so far."""

    sampling = "permutation"

    def __init__(self, tasks: Sequence[TaskRef], seed: int = 0, cursor: int = 0):
        if not tasks:
            raise ValueError("no training tasks")
        self.envs = sorted({t.env for t in tasks})
        self.by_env = {e: [t for t in tasks if t.env == e] for e in self.envs}
        self.seed = seed
        self.cursor = cursor
        self._orders: dict[int, tuple[int, np.ndarray]] = {}  # env index -> (epoch, order)
        # what the last draw did (train/* metrics of its step): distinct levels drawn
        self.last_draw: dict[str, float] = {}

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
        self.last_draw = {"train/task_levels": float(_distinct_levels(out))}
        return out

    # --------------------------------------------------------------- state and feedback
    @property
    def observes(self) -> bool:
        """Whether :meth:`observe` uses the episodes (the loop gathers them only then)."""
        return False

    def observe(self, episodes: Iterable[Any]) -> None:
        """The step's finished training episodes (``Trajectory`` or trajectory-file mappings);
        the permutation ignores them."""

    def position(self) -> dict[str, Any]:
        """Where the draws stand (a copy): what a cancelled rollout rewinds to."""
        return {"cursor": self.cursor}

    def rewind(self, position: Mapping[str, Any]) -> None:
        """Draw again from ``position`` (:meth:`position`); what was observed is kept."""
        self.cursor = int(position["cursor"])

    def state(self, position: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The checkpoint's entries of the sampler at ``position`` (default: now): for the
        permutation only ``{"cursor": n}``, as checkpoints always held."""
        return {"cursor": int((position or self.position())["cursor"])}


class LearnabilitySampler(TaskSampler):
    """``learnability``: levels drawn in proportion to ``p (1 - p) + eps`` (module docstring).
    ``saved``: a checkpoint's ``task_sampler`` entry (:meth:`state`) to resume from."""

    sampling = "learnability"

    def __init__(self, tasks: Sequence[TaskRef], seed: int = 0, cursor: int = 0, *,
                 rate: float, eps: float, saved: Mapping[str, Any] | None = None):
        super().__init__(tasks, seed, cursor)
        if not 0 < rate <= 1 or eps <= 0:
            raise ValueError(f"learnability needs 0 < rate <= 1 and eps > 0 "
                             f"(got rate={rate}, eps={eps})")
        self.rate, self.eps = float(rate), float(eps)
        # env -> level -> its tasks in the split's order; levels sorted by name
        self.levels: dict[str, dict[str, list[TaskRef]]] = {}
        for env in self.envs:
            grouped: dict[str, list[TaskRef]] = {}
            for t in self.by_env[env]:
                grouped.setdefault(task_level(t.task_id), []).append(t)
            self.levels[env] = {name: grouped[name] for name in sorted(grouped)}
        # the state beside the cursor: env -> level -> draws so far / success estimate
        self.level_draws: dict[str, dict[str, int]] = {e: {} for e in self.envs}
        self.estimates: dict[str, dict[str, float]] = {e: {} for e in self.envs}
        if saved:
            for env, draws in saved.get("level_draws", {}).items():
                if env in self.level_draws:
                    self.level_draws[env].update({k: int(v) for k, v in draws.items()})
            for env, estimates in saved.get("estimates", {}).items():
                if env in self.estimates:
                    self.estimates[env].update({k: float(v) for k, v in estimates.items()})
        self._level_orders: dict[tuple[int, int], tuple[int, np.ndarray]] = {}

    def weights(self, env: str) -> np.ndarray:
        """``p (1 - p) + eps`` of each of ``env``'s levels (sorted by name), shape [levels]."""
        p = np.array([self.estimates[env].get(name, PRIOR) for name in self.levels[env]])
        return p * (1.0 - p) + self.eps

    def _level_task(self, env_index: int, level_index: int) -> TaskRef:
        """The next task of a level: its seeded permutation of the current pass, in turn."""
        env = self.envs[env_index]
        name = list(self.levels[env])[level_index]
        tasks = self.levels[env][name]
        draw = self.level_draws[env].get(name, 0)
        self.level_draws[env][name] = draw + 1
        epoch, index = divmod(draw, len(tasks))
        key = (env_index, level_index)
        cached = self._level_orders.get(key)
        if cached is None or cached[0] != epoch:
            order = np.random.default_rng([self.seed, env_index, level_index, epoch])
            cached = self._level_orders[key] = (epoch, order.permutation(len(tasks)))
        return tasks[int(cached[1][index])]

    def next(self, count: int) -> list[TaskRef]:
        rng = np.random.default_rng([self.seed, _LEARNABILITY_STREAM, self.cursor])
        slots = []  # the environment of each draw, in turn as the permutation's
        for _ in range(count):
            slots.append(self.cursor % len(self.envs))
            self.cursor += 1
        picked = {e: list(_draw_without_replacement(self.weights(self.envs[e]),
                                                    slots.count(e), rng))
                  for e in sorted(set(slots))}
        out = [self._level_task(e, picked[e].pop(0)) for e in slots]
        shares = [float(w.max() / w.sum()) for w in map(self.weights, self.envs)]
        self.last_draw = {"train/task_levels": float(_distinct_levels(out)),
                          "train/task_level_max_share": max(shares)}
        return out

    @property
    def observes(self) -> bool:
        return True

    def observe(self, episodes: Iterable[Any]) -> None:
        """One moving-average update per level with finished episodes (errors left out):
        ``p <- (1 - rate) p + rate * (share of them with task score > 0)``."""
        tally: dict[tuple[str, str], list[int]] = {}
        for o in outcomes(episodes):
            if o.env not in self.estimates:
                continue
            counts = tally.setdefault((o.env, task_level(o.task_id)), [0, 0])
            counts[0] += int(passes(o.score))
            counts[1] += 1
        for (env, name), (wins, n) in sorted(tally.items()):
            p = self.estimates[env].get(name, PRIOR)
            self.estimates[env][name] = (1.0 - self.rate) * p + self.rate * wins / n

    def position(self) -> dict[str, Any]:
        return {"cursor": self.cursor, "level_draws": copy.deepcopy(self.level_draws)}

    def rewind(self, position: Mapping[str, Any]) -> None:
        super().rewind(position)
        self.level_draws = copy.deepcopy(dict(position["level_draws"]))

    def state(self, position: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """``{"cursor": n, "task_sampler": {sampling, level_draws, estimates}}``: the draws
        at ``position`` (default: now), the estimates as they are now."""
        position = position or self.position()
        return {"cursor": int(position["cursor"]),
                "task_sampler": {"sampling": self.sampling,
                                 "level_draws": copy.deepcopy(position["level_draws"]),
                                 "estimates": copy.deepcopy(self.estimates)}}


def _distinct_levels(tasks: Sequence[TaskRef]) -> int:
    return len({(t.env, task_level(t.task_id)) for t in tasks})


def _draw_without_replacement(weights: np.ndarray, k: int,
                              rng: np.random.Generator) -> Iterable[int]:
    """``k`` indices, each drawn with probability proportional to ``weights`` among those not
    yet drawn; once all are drawn, again from all of them."""
    remaining = np.arange(len(weights))
    for _ in range(k):
        if not len(remaining):
            remaining = np.arange(len(weights))
        w = weights[remaining]
        j = int(rng.choice(len(remaining), p=w / w.sum()))
        yield int(remaining[j])
        remaining = np.delete(remaining, j)


def make_task_sampler(tasks: Sequence[TaskRef], seed: int, sampling: str = "permutation",
                      resumed: Mapping[str, Any] | None = None, *, rate: float | None = None,
                      eps: float | None = None) -> TaskSampler:
    """The sampler ``sampling`` names (``rate`` / ``eps``: ``train.learnability_ema`` /
    ``_eps``, which learnability needs), at a checkpoint's entries ``resumed`` (``cursor``, and
    ``task_sampler`` for learnability; ``None``: a new run). A checkpoint of the permutation
    (only a cursor) resumes learnability with every level at its prior."""
    if sampling not in SAMPLINGS:
        raise ValueError(f"unknown task sampling {sampling!r}; known: {', '.join(SAMPLINGS)}")
    cursor = int((resumed or {}).get("cursor", 0))
    if sampling == "permutation":
        return TaskSampler(tasks, seed=seed, cursor=cursor)
    if rate is None or eps is None:
        raise ValueError("learnability needs rate and eps (train.learnability_ema, _eps)")
    saved = (resumed or {}).get("task_sampler")
    return LearnabilitySampler(tasks, seed=seed, cursor=cursor, rate=rate, eps=eps,
                               saved=saved if isinstance(saved, Mapping) else None)
