"""Avg@k and Pass@k on held-out tasks (success = episode score > 0, as in AgentGym-RL)."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Callable, Sequence

from agentrl_jax.agent.actor_pool import ActorPool, TaskRef
from agentrl_jax.agent.trajectory import Trajectory


@dataclasses.dataclass
class EvalResult:
    k: int
    num_tasks: int
    avg_at_k: float  # mean success over all task x sample episodes
    pass_at_k: float  # fraction of tasks solved by at least one of k samples
    mean_reward: float
    dropped: int  # error episodes (excluded)
    per_env: dict[str, dict[str, float]]

    def as_metrics(self, prefix: str = "eval/") -> dict[str, float]:
        out = {f"{prefix}avg@{self.k}": self.avg_at_k, f"{prefix}pass@{self.k}": self.pass_at_k,
               f"{prefix}mean_reward": self.mean_reward, f"{prefix}dropped": float(self.dropped)}
        for env, m in self.per_env.items():
            out.update({f"{prefix}{env}/{name}": v for name, v in m.items()})
        return out


def score_trajectories(trajectories: Sequence[Trajectory], k: int) -> EvalResult:
    ok = [t for t in trajectories if t.ok]
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
    return EvalResult(k=k, num_tasks=len(groups), avg_at_k=avg, pass_at_k=passed,
                      mean_reward=reward, dropped=len(trajectories) - len(ok), per_env=per_env)


async def evaluate(pool: ActorPool, tasks: Sequence[TaskRef], k: int, horizon: int,
                   policy_version: int = 0, seed: int | None = 0,
                   progress: Callable[[Trajectory], None] | None = None
                   ) -> tuple[EvalResult, list[Trajectory]]:
    """``k`` episodes of every task; ``progress`` is called with each finished episode."""
    trajectories, _ = await pool.collect(tasks, n_samples=k, horizon=horizon,
                                         policy_version=policy_version, seed=seed,
                                         progress=progress)
    return score_trajectories(trajectories, k), trajectories
