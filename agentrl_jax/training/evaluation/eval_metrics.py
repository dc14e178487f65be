"""The paper's evaluation metrics from evaluation episodes: Avg@k, Pass@k and the success rate.

The one place these numbers are defined; the evaluation during a run, ``summary.json``, the
terminal lines, the run report, the viewer and the results table
(``benchmarks/analysis/results_table.py``) all call it.

Definitions (AgentGym-RL, arXiv 2509.08755, section "Evaluation"; notation: task t has the
finished episodes j = 1..k_t, usually k_t = k):

- **score** s_tj in [0, 1]: the episode's total task reward, clipped to [0, 1]
  (:func:`episode_score` of :func:`task_reward`): its total environment reward less the
  training-only bonus the environment marked as shaping (``Trajectory.shaping``, the steps'
  ``info[SHAPING_KEY]``, e.g. deep search's evidence reward; 0 for most runs), so a bonus the
  trainer's return keeps never counts as task score. Every family scales its reward so:
  BabyAI ``1 - 0.9 * steps / max_steps`` on success else 0 (MiniGrid's), TextCraft 0/1, ScienceWorld
  ``max(final score, 0) / 100`` (partial credit), web navigation (MiniWoB++) 1 when MiniWoB's raw
  reward is > 0 else 0, deep search exact match 0/1.
- **pass** (the paper's "success = score > 0"): p_tj = 1[s_tj > 0] (:func:`passes`).
- **completed**: the environment's own completion flag (``success`` of the episode: BabyAI the
  goal reached, TextCraft the item crafted, ScienceWorld the task completed, i.e. score 100, not
  any partial score; MiniWoB++ the task done; deep search the exact answer).

- ``avg_at_k``  = (1/T) sum_t (1/k_t) sum_j s_tj          (Avg@k: mean task score)
- ``pass_at_k`` = (1/T) sum_t max_j p_tj                   (Pass@k: a task passes when any of
  its k episodes scores above 0)
- ``success_rate`` = (1/T) sum_t (1/k_t) sum_j completed_tj (the completion rate)

Every mean is over tasks first (a task whose episodes partly failed with an error weighs the
same as the others). Error episodes (``env_error`` / ``engine_error``: a server died, the engine
failed) are not outcomes of the policy and are left out; a task without a finished episode is
not scored.

Files written before this module existed (no ``"scoring"`` key in a ``summary.json``
evaluation) hold an older Avg@k: the share of episodes with the success flag or a positive
reward (``OLD_AVG_MEANING``). Their episodes re-score with these functions.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from typing import Any, Iterable, Mapping, Sequence

#: marks an evaluation scored by this module (``summary.json``'s ``evals[step]["scoring"]``)
SCORING = "paper"
#: what ``avg_at_k`` meant in an evaluation without the ``scoring`` key
OLD_AVG_MEANING = "old metric: share of episodes with success flag or score > 0"
#: episode statuses that are not outcomes of the policy
ERROR_STATUSES = ("env_error", "engine_error")
#: per-task values :func:`task_values` can give (the three metrics)
METRICS = ("avg", "pass", "success")
#: how each metric is named in tables
METRIC_TITLES = {"avg": "Avg@{k} (mean task score)",
                 "pass": "Pass@{k} (a task passes when any of its {k} episodes scores > 0)",
                 "success": "success rate (the environment's completion flag)"}


@dataclasses.dataclass(frozen=True)
class EpisodeOutcome:
    """What the metrics need of one finished evaluation episode."""

    env: str
    task_id: str
    score: float  # in [0, 1]
    completed: bool  # the environment's completion flag

    @property
    def task(self) -> str:
        """``env/task_id``: the key of the episode's task."""
        return f"{self.env}/{self.task_id}"


@dataclasses.dataclass(frozen=True)
class Scores:
    """Avg@k, Pass@k and the success rate of a set of evaluation episodes (module docstring);
    the three are ``None`` when no task was scored."""

    k: int  # episodes per task asked for
    tasks: int  # tasks scored (at least one finished episode)
    episodes: int  # finished episodes scored
    avg_at_k: float | None
    pass_at_k: float | None
    success_rate: float | None


def episode_score(reward: Any) -> float:
    """An episode's score in [0, 1]: its total reward clipped to [0, 1] (a missing or non-finite
    reward scores 0)."""
    try:
        value = float(reward if reward is not None else 0.0)
    except (TypeError, ValueError):
        return 0.0
    if not math.isfinite(value):
        return 0.0
    return min(max(value, 0.0), 1.0)


def task_reward(reward: Any, shaping: Any = 0.0) -> Any:
    """An episode's task reward: ``reward - shaping`` (``Trajectory.shaping``, the training-only
    part), rounded to 12 decimals when there is shaping (the two sums add the same bonuses in
    another order: a last-bit remainder must not score above 0); ``reward`` itself, as given,
    when ``shaping`` is 0 or missing."""
    try:
        bonus = float(shaping or 0.0)
        if not bonus:
            return reward
        return round(float(reward if reward is not None else 0.0) - bonus, 12)
    except (TypeError, ValueError):
        return reward


def passes(score: float) -> bool:
    """The paper's episode success for Pass@k: score > 0."""
    return score > 0.0


def outcome(episode: Any) -> EpisodeOutcome | None:
    """The :class:`EpisodeOutcome` of ``episode``: a ``Trajectory`` or a mapping from a
    trajectory file (``env``, ``task_id``, ``status``, ``reward``, ``shaping`` (missing: 0),
    ``success``); ``None`` for an error episode (``ERROR_STATUSES``). The score is the task
    reward's (:func:`task_reward`), never the shaped return."""
    get = episode.get if isinstance(episode, Mapping) else (
        lambda name: getattr(episode, name, None))
    if get("status") in ERROR_STATUSES:
        return None
    return EpisodeOutcome(env=str(get("env")), task_id=str(get("task_id")),
                          score=episode_score(task_reward(get("reward"), get("shaping"))),
                          completed=bool(get("success")))


def outcomes(episodes: Iterable[Any]) -> list[EpisodeOutcome]:
    """:func:`outcome` of every episode, error episodes left out."""
    return [o for o in map(outcome, episodes) if o is not None]


def by_task(items: Iterable[EpisodeOutcome]) -> dict[str, list[EpisodeOutcome]]:
    """``{env/task_id: [its outcomes]}`` in first-seen order."""
    out: dict[str, list[EpisodeOutcome]] = defaultdict(list)
    for o in items:
        out[o.task].append(o)
    return dict(out)


def task_values(items: Iterable[EpisodeOutcome], metric: str = "avg") -> dict[str, list[float]]:
    """``{task: values}`` whose per-task mean is the task's value of ``metric`` (the input of
    ``benchmarks/analysis/seed_stats.py`` and the paired bootstraps): ``avg`` the episodes' scores,
    ``success`` their completion flags (0/1), ``pass`` one value per task, 1 when any episode
    scored > 0."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; one of {', '.join(METRICS)}")
    out = {}
    for task, group in by_task(items).items():
        if metric == "avg":
            out[task] = [o.score for o in group]
        elif metric == "success":
            out[task] = [float(o.completed) for o in group]
        else:
            out[task] = [float(any(passes(o.score) for o in group))]
    return out


def _mean_over_tasks(values: Mapping[str, Sequence[float]]) -> float | None:
    means = [sum(v) / len(v) for v in values.values() if v]
    return sum(means) / len(means) if means else None


def avg_standard_error(items: Iterable[EpisodeOutcome]) -> float | None:
    """The standard error of Avg@k over tasks: with m_t = (1/k_t) sum_j s_tj the task means
    and T tasks, ``sqrt(sum_t (m_t - mean(m))^2 / (T - 1)) / sqrt(T)`` (how far Avg@k moves
    between two evaluations of the same policy on these tasks); None for fewer than 2 tasks."""
    means = [sum(v) / len(v) for v in task_values(items, "avg").values() if v]
    if len(means) < 2:
        return None
    centre = sum(means) / len(means)
    variance = sum((m - centre) ** 2 for m in means) / (len(means) - 1)
    return math.sqrt(variance / len(means))


def score(items: Sequence[EpisodeOutcome], k: int) -> Scores:
    """Avg@k, Pass@k and the success rate of ``items`` (finished episodes, ``k`` asked per
    task; module docstring)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    items = list(items)
    return Scores(k=k, tasks=len(by_task(items)), episodes=len(items),
                  avg_at_k=_mean_over_tasks(task_values(items, "avg")),
                  pass_at_k=_mean_over_tasks(task_values(items, "pass")),
                  success_rate=_mean_over_tasks(task_values(items, "success")))


def score_per_env(items: Sequence[EpisodeOutcome], k: int) -> dict[str, Scores]:
    """:func:`score` of each environment's episodes, by environment name (sorted)."""
    envs: dict[str, list[EpisodeOutcome]] = defaultdict(list)
    for o in items:
        envs[o.env].append(o)
    return {env: score(envs[env], k) for env in sorted(envs)}


def describe(s: Scores) -> str:
    """One terminal line's worth: ``avg@4=0.478 (mean score) pass@4=0.600 success=0.521``."""
    if s.avg_at_k is None:
        return "no task scored"
    return (f"avg@{s.k}={s.avg_at_k:.3f} (mean score) pass@{s.k}={s.pass_at_k:.3f} "
            f"success={s.success_rate:.3f}")
