"""When a run's held-out curve has stopped rising: ``train.stop_on_plateau``.

An evaluation **rises** when its Avg@k beats the best earlier evaluation of the run by more
than the noise of the two:

    rises_i  =  a_i - a_b  >  z * sqrt(se_i^2 + se_b^2),   b = argmax_{j < i} a_j

with ``a`` the evaluations' Avg@k, ``se`` their standard errors over tasks
(``eval_metrics.avg_standard_error``) and ``z = train.plateau_noise``. The curve is flat once
the last ``train.stop_on_plateau`` evaluations in a row did not rise (the first evaluation,
usually step 0's, is the baseline and never counts). Issue 48's "three evaluations in a row
within noise" is ``stop_on_plateau = 3``.

:func:`plateau_reached` is the rule on a list of evaluations; :class:`PlateauWatch` keeps the
run's list across sessions (the earlier sessions' evaluations come from the run's
``summary.json``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from agentrl_jax.training.outputs.summary import read_summary

if TYPE_CHECKING:
    from agentrl_jax.training.config.sections import TrainConfig


@dataclasses.dataclass(frozen=True)
class Point:
    """One evaluation of the curve: its step, Avg@k and the standard error of Avg@k."""

    step: int
    avg: float
    se: float


def rises(point: Point, best: Point, noise: float) -> bool:
    """``point`` beats ``best`` by more than ``noise`` standard errors of their difference."""
    return point.avg - best.avg > noise * math.hypot(point.se, best.se)


def flat_run(points: Sequence[Point], noise: float) -> int:
    """How many of the last evaluations in a row did not rise (``points`` in step order; the
    first is the baseline)."""
    count = 0
    best = points[0] if points else None
    for point in points[1:]:
        if rises(point, best, noise):
            count = 0
        else:
            count += 1
        if point.avg > best.avg:
            best = point
    return count


def plateau_reached(points: Sequence[Point], patience: int, noise: float) -> bool:
    """The last ``patience`` evaluations (> 0) in a row did not rise (module docstring)."""
    return patience > 0 and flat_run(points, noise) >= patience


def point_of(step: int, result: Any) -> Point | None:
    """The :class:`Point` of an evaluation result (an ``EvalResult`` or its ``summary.json``
    mapping); None when it is not a valid result or has no standard error."""
    get = result.get if isinstance(result, Mapping) else (
        lambda name, default=None: getattr(result, name, default))
    avg, se = get("avg_at_k"), get("avg_at_k_se")
    if not get("valid", True) or avg is None or se is None:
        return None
    return Point(int(step), float(avg), float(se))


class PlateauWatch:
    """The run's evaluations so far and whether its curve has flattened.

    ``patience``: ``train.stop_on_plateau`` (0: never); ``noise``: ``train.plateau_noise``;
    ``min_seconds``: ``train.plateau_min_seconds``; ``earlier``: the evaluations of the run's
    earlier sessions (``summary.json``'s ``evals``, :meth:`from_summary`)."""

    def __init__(self, patience: int, noise: float, min_seconds: float = 0.0,
                 earlier: Mapping[str, Mapping[str, Any]] | None = None):
        self.patience, self.noise = int(patience), float(noise)
        self.min_seconds = float(min_seconds)
        self.points: dict[int, Point] = {}
        for step, result in (earlier or {}).items():
            point = point_of(int(step), result)
            if point is not None:
                self.points[point.step] = point

    @classmethod
    def of_config(cls, train: TrainConfig,
                  earlier: Mapping[str, Mapping[str, Any]] | None = None) -> PlateauWatch:
        """The watch of ``train``'s settings, from the evaluations ``earlier``."""
        return cls(int(train.stop_on_plateau), float(train.plateau_noise),
                   float(train.plateau_min_seconds), earlier)

    @classmethod
    def from_summary(cls, train: TrainConfig, workdir: str) -> PlateauWatch:
        """The watch of ``train``'s settings, from the evaluations in ``workdir``'s
        ``summary.json`` (none there: a new run)."""
        earlier = read_summary(workdir).get("evals") if train.stop_on_plateau else None
        return cls.of_config(train, earlier)

    def observe(self, step: int, result: Any) -> bool:
        """Record the evaluation of ``step``; whether the curve is now flat."""
        point = point_of(step, result)
        if point is not None:
            self.points[point.step] = point
        return self.flat()

    def flat(self) -> bool:
        return plateau_reached([self.points[s] for s in sorted(self.points)], self.patience,
                               self.noise)

    def stops(self, train_seconds: float) -> bool:
        """The run stops here: its curve is flat and it has trained ``min_seconds``."""
        return self.flat() and train_seconds >= self.min_seconds

    def describe(self) -> str:
        """One line: the last evaluations and the best one."""
        points = [self.points[s] for s in sorted(self.points)]
        if not points:  # (several processes: another one found it flat)
            return "another process found the curve flat"
        best = max(points, key=lambda p: p.avg)
        last = ", ".join(f"{p.avg:.3f} (step {p.step})" for p in points[-self.patience:])
        return (f"the last {self.patience} evaluations ({last}) did not rise above the best, "
                f"{best.avg:.3f} at step {best.step}, by more than {self.noise:g} standard "
                f"errors")
