"""train.stop_on_plateau's rule (training/rl/plateau.py) on hand-computed curves, and the
standard error of Avg@k it calls noise against a NumPy computation."""

from __future__ import annotations

import json
import math
import types

import numpy as np
import pytest

from agentrl_jax.training.evaluation.eval_metrics import EpisodeOutcome, avg_standard_error
from agentrl_jax.training.rl.plateau import (Point, PlateauWatch, flat_run, plateau_reached,
                                             rises)


def test_a_rise_must_clear_the_noise_of_the_difference():
    best = Point(0, 0.40, 0.03)
    # sqrt(0.03^2 + 0.04^2) = 0.05: two standard errors are 0.10
    assert rises(Point(10, 0.51, 0.04), best, noise=2.0)
    assert not rises(Point(10, 0.49, 0.04), best, noise=2.0)
    assert rises(Point(10, 0.49, 0.04), best, noise=1.0)
    assert not rises(Point(10, 0.40, 0.0), Point(0, 0.40, 0.0), noise=2.0)  # equal, no noise


def test_the_flat_run_counts_from_the_last_rise_against_the_best_so_far():
    se = 0.01  # two standard errors of a difference: 2 * sqrt(2) * 0.01 = 0.028
    curve = [Point(s, a, se) for s, a in
             [(0, 0.05), (10, 0.30), (20, 0.32), (30, 0.50), (40, 0.51), (50, 0.49),
              (60, 0.52)]]
    # rises: 10 (+0.25), 30 (+0.18 over 0.32); then 0.51, 0.49, 0.52 stay within 0.028 of
    # the best (0.51 after step 40, 0.52 after 60 is +0.01 over it)
    assert flat_run(curve[:2], 2.0) == 0
    assert flat_run(curve[:3], 2.0) == 1
    assert flat_run(curve[:4], 2.0) == 0
    assert flat_run(curve, 2.0) == 3
    assert plateau_reached(curve, patience=3, noise=2.0)
    assert not plateau_reached(curve[:6], patience=3, noise=2.0)
    assert not plateau_reached(curve, patience=0, noise=2.0)  # 0: never
    assert flat_run(curve[:1], 2.0) == 0 and flat_run([], 2.0) == 0


def test_the_watch_reads_earlier_sessions_and_skips_what_is_not_a_result(tmp_path):
    earlier = {"0": {"avg_at_k": 0.1, "avg_at_k_se": 0.01, "valid": True},
               "5": {"avg_at_k": 0.1, "avg_at_k_se": 0.01, "valid": True},
               "7": {"avg_at_k": None, "avg_at_k_se": None, "valid": False},
               "8": {"avg_at_k": 0.3, "valid": True}}  # written before the standard error
    (tmp_path / "summary.json").write_text(json.dumps({"evals": earlier}))
    train = types.SimpleNamespace(stop_on_plateau=2, plateau_noise=2.0, plateau_min_seconds=60.0)
    watch = PlateauWatch.from_summary(train, str(tmp_path))
    assert sorted(watch.points) == [0, 5]
    assert not watch.flat()  # one flat evaluation (step 5) of the two asked
    result = {"avg_at_k": 0.11, "avg_at_k_se": 0.01, "valid": True}
    assert watch.observe(10, result)  # the second in a row
    assert not watch.stops(59.0) and watch.stops(60.0)  # plateau_min_seconds holds it back
    assert "0.110 (step 10)" in watch.describe() and "0.110 at step 10" in watch.describe()
    # no summary (a new run), or the rule off: nothing read
    assert PlateauWatch.from_summary(train, str(tmp_path / "new")).points == {}
    off = types.SimpleNamespace(stop_on_plateau=0, plateau_noise=2.0, plateau_min_seconds=0.0)
    assert PlateauWatch.from_summary(off, str(tmp_path)).points == {}
    assert PlateauWatch(3, 2.0).describe() == "another process found the curve flat"


def test_the_standard_error_of_avg_at_k_matches_numpy():
    rng = np.random.default_rng(3)
    scores = rng.uniform(0, 1, size=(7, 4))  # 7 tasks x 4 episodes
    items = [EpisodeOutcome(env="e", task_id=f"t{t}", score=float(scores[t, j]),
                            completed=False) for t in range(7) for j in range(4)]
    means = scores.mean(axis=1)
    assert avg_standard_error(items) == pytest.approx(means.std(ddof=1) / math.sqrt(7),
                                                      rel=1e-12)
    assert avg_standard_error(items[:4]) is None  # one task
