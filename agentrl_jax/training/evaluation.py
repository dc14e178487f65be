"""Avg@k and Pass@k on held-out tasks (success = episode score > 0, as in AgentGym-RL).

Error episodes (``env_error`` / ``engine_error``: a server died, the engine failed) are not
outcomes of the policy: they are excluded. A task none of whose episodes finished is not
scored (``tasks_failed``). An evaluation that scored fewer than ``min_scored`` of its tasks is
not a result (``valid=False``): its Avg@k / Pass@k / mean reward are ``None``, never a number
that looks like one.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from typing import Callable, Sequence

from agentrl_jax.agent.actor_pool import ActorPool, TaskRef
from agentrl_jax.agent.trajectory import Trajectory


#: default share of an evaluation's tasks that must be scored for it to count as a result
MIN_SCORED = 0.9


@dataclasses.dataclass
class EvalResult:
    k: int
    num_tasks: int  # tasks scored (at least one episode finished without an error)
    avg_at_k: float | None  # mean success over all task x sample episodes (None: not valid)
    pass_at_k: float | None  # fraction of tasks solved by at least one of k samples
    mean_reward: float | None
    dropped: int  # error episodes (excluded)
    per_env: dict[str, dict[str, float]]
    tasks_total: int = 0  # tasks evaluated
    tasks_failed: int = 0  # tasks without a single finished episode (not scored)
    valid: bool = True  # tasks scored >= min_scored x tasks evaluated (and at least one)
    errors: dict[str, int] = dataclasses.field(default_factory=dict)  # error status -> episodes

    @property
    def tasks_scored(self) -> int:
        return self.num_tasks

    def describe_failure(self) -> str:
        """Why the evaluation is not a result (one line)."""
        errors = ", ".join(f"{n} {status}" for status, n in sorted(self.errors.items()))
        return (f"only {self.num_tasks} of {self.tasks_total} tasks scored ({self.tasks_failed} "
                f"failed; error episodes: {errors or 'none'})")

    def as_metrics(self, prefix: str = "eval/") -> dict[str, float]:
        out = {f"{prefix}dropped": float(self.dropped),
               f"{prefix}tasks_scored": float(self.num_tasks),
               f"{prefix}tasks_failed": float(self.tasks_failed),
               f"{prefix}valid": float(self.valid)}
        if not self.valid:  # no success number that could be taken for a result
            return out
        out.update({f"{prefix}avg@{self.k}": self.avg_at_k, f"{prefix}pass@{self.k}":
                    self.pass_at_k, f"{prefix}mean_reward": self.mean_reward})
        for env, m in self.per_env.items():
            out.update({f"{prefix}{env}/{name}": v for name, v in m.items()})
        return out


def score_trajectories(trajectories: Sequence[Trajectory], k: int,
                       min_scored: float = MIN_SCORED) -> EvalResult:
    """Avg@k / Pass@k of ``trajectories`` (k episodes per task); valid when at least
    ``min_scored`` of the tasks (and at least one) have a finished episode."""
    ok = [t for t in trajectories if t.ok]
    all_tasks = {(t.env, t.task_id) for t in trajectories}
    errors = dict(Counter(t.status for t in trajectories if not t.ok))
    groups: dict[tuple[str, str], list[Trajectory]] = defaultdict(list)
    for t in ok:
        groups[(t.env, t.task_id)].append(t)

    def success(t: Trajectory) -> bool:
        return t.success or t.reward > 0

    def summary(items: dict[tuple[str, str], list[Trajectory]]) -> tuple[float, float, float]:
        episodes = [t for g in items.values() for t in g]
        if not episodes:
            return 0.0, 0.0, 0.0
        avg = sum(success(t) for t in episodes) / len(episodes)
        passed = sum(any(success(t) for t in g) for g in items.values()) / len(items)
        return avg, passed, sum(t.reward for t in episodes) / len(episodes)

    avg, passed, reward = summary(groups)
    per_env = {}
    for env in sorted({e for e, _ in groups}):
        a, p, r = summary({key: g for key, g in groups.items() if key[0] == env})
        per_env[env] = {f"avg@{k}": a, f"pass@{k}": p, "mean_reward": r}
    scored = len(groups)
    valid = scored > 0 and scored >= min_scored * len(all_tasks)
    if not valid:
        avg = passed = reward = None
        per_env = {}
    return EvalResult(k=k, num_tasks=scored, avg_at_k=avg, pass_at_k=passed,
                      mean_reward=reward, dropped=len(trajectories) - len(ok), per_env=per_env,
                      tasks_total=len(all_tasks), tasks_failed=len(all_tasks) - scored,
                      valid=valid, errors=errors)


async def evaluate(pool: ActorPool, tasks: Sequence[TaskRef], k: int, horizon: int,
                   policy_version: int = 0, seed: int | None = 0,
                   progress: Callable[[Trajectory], None] | None = None,
                   min_scored: float = MIN_SCORED) -> tuple[EvalResult, list[Trajectory]]:
    """``k`` episodes of every task; ``progress`` is called with each finished episode."""
    trajectories, _ = await pool.collect(tasks, n_samples=k, horizon=horizon,
                                         policy_version=policy_version, seed=seed,
                                         progress=progress)
    return score_trajectories(trajectories, k, min_scored), trajectories
