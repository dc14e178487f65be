"""Avg@k, Pass@k and the success rate on held-out tasks (``training/evaluation/eval_metrics.py`` defines
them: Avg@k the mean task score in [0, 1], Pass@k a task with any episode scoring > 0, the
success rate the environment's completion flag).

Error episodes (``env_error`` / ``engine_error``: a server died, the engine failed) are not
outcomes of the policy: they are excluded. A task none of whose episodes finished is not
scored (``tasks_failed``). An evaluation that scored fewer than ``min_scored`` of its tasks is
not a result (``valid=False``): its Avg@k / Pass@k / success rate / mean reward are ``None``,
never a number that looks like one.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Callable, Sequence

from agentrl_jax.agent.actor_pool import ActorPool, TaskRef
from agentrl_jax.agent.trajectory import Trajectory
from agentrl_jax.training.evaluation import eval_metrics


#: default share of an evaluation's tasks that must be scored for it to count as a result
MIN_SCORED = 0.9


@dataclasses.dataclass
class EvalResult:
    k: int
    num_tasks: int  # tasks scored (at least one episode finished without an error)
    avg_at_k: float | None  # mean task score in [0, 1] (None: not valid)
    pass_at_k: float | None  # share of tasks with an episode scoring > 0 among its k
    mean_reward: float | None  # mean episode return (training-only shaping included)
    dropped: int  # error episodes (excluded)
    per_env: dict[str, dict[str, float]]
    tasks_total: int = 0  # tasks evaluated
    tasks_failed: int = 0  # tasks without a single finished episode (not scored)
    valid: bool = True  # tasks scored >= min_scored x tasks evaluated (and at least one)
    errors: dict[str, int] = dataclasses.field(default_factory=dict)  # error status -> episodes
    success_rate: float | None = None  # mean task completion rate (the environment's flag)
    scoring: str = eval_metrics.SCORING  # how avg_at_k was computed (eval_metrics)
    # the standard error of avg_at_k over the scored tasks (eval_metrics.avg_standard_error;
    # None: not valid, or fewer than 2 tasks): what train.stop_on_plateau calls noise
    avg_at_k_se: float | None = None

    @property
    def tasks_scored(self) -> int:
        return self.num_tasks

    def describe_scores(self) -> str:
        """``avg@k=... (mean score) pass@k=... success=...`` (``eval_metrics.describe``)."""
        return eval_metrics.describe(eval_metrics.Scores(
            k=self.k, tasks=self.num_tasks, episodes=0, avg_at_k=self.avg_at_k,
            pass_at_k=self.pass_at_k, success_rate=self.success_rate))

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
                    self.pass_at_k, f"{prefix}success_rate": self.success_rate,
                    f"{prefix}mean_reward": self.mean_reward})
        for env, m in self.per_env.items():
            out.update({f"{prefix}{env}/{name}": v for name, v in m.items()})
        return out


def score_trajectories(trajectories: Sequence[Trajectory], k: int,
                       min_scored: float = MIN_SCORED) -> EvalResult:
    """Avg@k / Pass@k / success rate of ``trajectories`` (k episodes per task,
    ``eval_metrics.score``); valid when at least ``min_scored`` of the tasks (and at least one)
    have a finished episode."""
    ok = [t for t in trajectories if t.ok]
    all_tasks = {(t.env, t.task_id) for t in trajectories}
    errors = dict(Counter(t.status for t in trajectories if not t.ok))
    finished = eval_metrics.outcomes(ok)
    overall = eval_metrics.score(finished, k)

    def mean_reward(env: str | None = None) -> float:
        rewards = [t.reward for t in ok if env is None or t.env == env]
        return sum(rewards) / len(rewards) if rewards else 0.0

    per_env = {env: {f"avg@{k}": s.avg_at_k, f"pass@{k}": s.pass_at_k,
                     "success_rate": s.success_rate, "mean_reward": mean_reward(env)}
               for env, s in eval_metrics.score_per_env(finished, k).items()}
    scored = overall.tasks
    valid = scored > 0 and scored >= min_scored * len(all_tasks)
    avg, passed, success = overall.avg_at_k, overall.pass_at_k, overall.success_rate
    reward: float | None = mean_reward()
    if not valid:
        avg = passed = success = reward = None
        per_env = {}
    return EvalResult(k=k, num_tasks=scored, avg_at_k=avg, pass_at_k=passed,
                      mean_reward=reward, dropped=len(trajectories) - len(ok), per_env=per_env,
                      tasks_total=len(all_tasks), tasks_failed=len(all_tasks) - scored,
                      valid=valid, errors=errors, success_rate=success,
                      avg_at_k_se=eval_metrics.avg_standard_error(finished) if valid else None)


async def evaluate(pool: ActorPool, tasks: Sequence[TaskRef], k: int, horizon: int,
                   policy_version: int = 0, seed: int | None = 0,
                   progress: Callable[[Trajectory], None] | None = None,
                   min_scored: float = MIN_SCORED) -> tuple[EvalResult, list[Trajectory]]:
    """``k`` episodes of every task; ``progress`` is called with each finished episode."""
    trajectories, _ = await pool.collect(tasks, n_samples=k, horizon=horizon,
                                         policy_version=policy_version, seed=seed,
                                         progress=progress)
    return score_trajectories(trajectories, k, min_scored), trajectories
