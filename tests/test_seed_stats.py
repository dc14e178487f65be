"""benchmarks/analysis/seed_stats.py: seed-level mean, spread and the two-level bootstrap against hand
computations and an exact enumeration of every bootstrap resample of tiny cases."""

from __future__ import annotations

import itertools
import json
import math
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks", "analysis"))
import seed_stats  # noqa: E402

# 3 seeds x 2 tasks, a few samples a task: task values 0.5 / 1.0, 0.25 / 0.25, 0.5 / 0.0
RUNS = {0: {"a": [1, 1, 0, 0], "b": [1, 1, 1, 1]},
        1: {"a": [0, 0, 0, 1], "b": [1, 0, 0, 0]},
        2: {"a": [1, 0], "b": [0, 0]}}


def exact_distribution(units: list[list[float]]) -> tuple[np.ndarray, np.ndarray]:
    """Every outcome of the two-level bootstrap, enumerated: (values, probabilities). A seed
    tuple (S^S, each 1/S^S), then an independent task tuple (T^T, each 1/T^T) per slot."""
    vals, probs = [], []
    n = len(units)
    for seeds in itertools.product(range(n), repeat=n):
        per_slot = [[(float(np.mean([units[s][t] for t in ts])), len(units[s]) ** -len(units[s]))
                     for ts in itertools.product(range(len(units[s])), repeat=len(units[s]))]
                    for s in seeds]
        for combo in itertools.product(*per_slot):
            vals.append(sum(v for v, _ in combo) / n)
            probs.append(n ** -n * math.prod(p for _, p in combo))
    return np.array(vals), np.array(probs)


def assert_quantile(x: float, q: float, vals: np.ndarray, probs: np.ndarray, eps: float = 0.006):
    """``x`` is a q-quantile of the exact distribution, up to Monte Carlo error ``eps``."""
    assert probs[vals < x - 1e-12].sum() <= q + eps
    assert probs[vals <= x + 1e-12].sum() >= q - eps


def test_mean_spread_and_exact_bootstrap_distribution():
    r = seed_stats.seed_level(RUNS, draws=40_000, seed=3)
    # by hand: seed scores 0.75, 0.25, 0.25
    assert r["per_seed"] == {0: 0.75, 1: 0.25, 2: 0.25}
    assert r["mean"] == pytest.approx(1.25 / 3)
    assert (r["min"], r["max"]) == (0.25, 0.75)
    assert r["std"] == pytest.approx(math.sqrt(1 / 12))  # deviations 1/3, -1/6, -1/6; / (3-1)
    assert r["n_seeds"] == 3 and r["tasks"] == {0: 2, 1: 2, 2: 2}
    assert not r["single_seed"] and r["interval_covers"] == seed_stats.COVERS_SEEDS

    vals, probs = exact_distribution([[0.5, 1.0], [0.25, 0.25], [0.5, 0.0]])
    assert probs.sum() == pytest.approx(1.0)
    exact_mean = float((vals * probs).sum())
    exact_var = float(((vals - exact_mean) ** 2 * probs).sum())
    assert exact_mean == pytest.approx(1.25 / 3)
    # the docstring's variance: (1/S) [pop. var of seed scores + mean of sigma_s^2 / T_s]
    # = (1/3) [(1/6)/3 + (0.0625/2 + 0 + 0.0625/2)/3]
    assert exact_var == pytest.approx((1 / 3) * ((1 / 6) / 3 + (0.0625 / 2 + 0.0625 / 2) / 3))

    draws = seed_stats.hierarchical_draws([[0.5, 1.0], [0.25, 0.25], [0.5, 0.0]], 40_000, 3)
    assert draws.mean() == pytest.approx(exact_mean, abs=0.004)
    assert draws.var() == pytest.approx(exact_var, rel=0.05)
    assert_quantile(r["ci95_low"], 0.025, vals, probs)
    assert_quantile(r["ci95_high"], 0.975, vals, probs)
    # the seed level matters: a task-only bootstrap of the pooled tasks is far narrower
    assert r["ci95_high"] - r["ci95_low"] > 0.4


def test_one_seed_is_flagged_and_is_the_task_bootstrap():
    one = {7: {"a": [1, 1], "b": [0, 1], "c": [0, 0]}}  # task values 1, 0.5, 0
    r = seed_stats.seed_level(one, draws=40_000, seed=1)
    assert r["single_seed"] and r["n_seeds"] == 1 and r["seeds"] == [7]
    assert r["interval_covers"] == seed_stats.COVERS_TASKS_ONLY
    assert r["std"] is None and r["mean"] == pytest.approx(0.5)
    vals, probs = exact_distribution([[1.0, 0.5, 0.0]])  # 27 task resamples
    assert_quantile(r["ci95_low"], 0.025, vals, probs)
    assert_quantile(r["ci95_high"], 0.975, vals, probs)
    d = seed_stats.seed_level_difference(one, {7: {"a": [0, 0], "b": [0, 0], "c": [0, 0]}})
    assert d["paired_seeds"] and d["single_seed"]
    assert d["interval_covers"] == seed_stats.COVERS_TASKS_ONLY


def test_paired_difference_pairs_tasks_within_a_seed_and_seeds_across_sides():
    # A differs a lot between seeds and tasks; B = A + 0.25 on every task but one: paired
    # over tasks and seeds, only that task varies
    a = {0: {"x": [0, 0, 0, 0], "y": [1, 1, 1, 1]}, 1: {"x": [0, 1, 0, 0], "y": [0, 0, 0, 0]},
         2: {"x": [1, 1, 1, 0], "y": [0, 0, 1, 0]}}
    b = {0: {"x": [1, 0, 0, 0], "y": [1, 1, 1, 1, 1, 1, 1, 1]},  # y: 1.0 = A's
         1: {"x": [1, 1, 0, 0], "y": [1, 0, 0, 0]}, 2: {"x": [1, 1, 1, 1], "y": [1, 1, 0, 0]}}
    # per-task differences (B - A): seed 0: 0.25, 0.0; seed 1: 0.25, 0.25; seed 2: 0.25, 0.25
    d = seed_stats.seed_level_difference(b, a, draws=40_000, seed=5)
    assert d["paired_seeds"] and d["pairs"] == [[0, 0], [1, 1], [2, 2]]
    assert d["per_pair"] == {"0:0": 0.125, "1:1": 0.25, "2:2": 0.25}
    assert d["mean"] == pytest.approx(0.625 / 3)
    assert d["std"] == pytest.approx(np.std([0.125, 0.25, 0.25], ddof=1))
    vals, probs = exact_distribution([[0.25, 0.0], [0.25, 0.25], [0.25, 0.25]])
    assert_quantile(d["ci95_low"], 0.025, vals, probs)
    assert_quantile(d["ci95_high"], 0.975, vals, probs)
    assert d["ci95_high"] == pytest.approx(0.25)
    # unpaired (different seed sets): the two sides' own variances add up, a far wider interval
    u = seed_stats.seed_level_difference({3: b[0], 4: b[1], 5: b[2]}, a, draws=20_000)
    assert not u["paired_seeds"] and u["mean"] == pytest.approx(d["mean"])
    assert u["ci95_high"] - u["ci95_low"] > 3 * (d["ci95_high"] - d["ci95_low"])


def test_single_reference_run_pairs_with_every_seed_and_bad_input_is_refused():
    base = {0: {"x": [0, 0], "y": [0, 1]}}
    b = {0: {"x": [1, 1], "y": [0, 1]}, 1: {"x": [1, 0], "y": [0, 1]}}
    d = seed_stats.seed_level_difference(b, base, draws=2_000, reference="a")
    assert d["pairs"] == [[0, 0], [1, 0]] and d["per_pair"] == {"0:0": 0.5, "1:0": 0.25}
    assert "left_out_seeds" not in d
    # not a reference: only the seed both sides ran pairs, the other is listed as left out
    d = seed_stats.seed_level_difference(b, base, draws=2_000)
    assert d["pairs"] == [[0, 0]] and d["left_out_seeds"] == {"b": [1], "a": []}
    assert seed_stats.seed_pairs([0, 1], [1, 2]) == [(1, 1)]
    assert seed_stats.seed_pairs([0, 1], [2, 3]) is None
    with pytest.raises(ValueError, match="no task evaluated by both"):
        seed_stats.seed_level_difference({0: {"x": [1]}}, {0: {"z": [1]}})
    with pytest.raises(ValueError):
        seed_stats.seed_level({0: {}})
    assert seed_stats.fmt_points({"mean": 0.043, "ci95_low": 0.01, "ci95_high": 0.078},
                                 signed=True) == "+4.3 [+1.0, +7.8]"


def write_run(path, steps: dict[int, dict[str, list[int]]]) -> str:
    """A run directory at ``path`` with ``eval_episodes.jsonl``: ``{step: {task: [score of
    each sample]}}`` (what ``learning_report.py`` reads); a score of 1 is a completed episode
    (success flag), a score between 0 and 1 partial credit."""
    os.makedirs(path)
    with open(os.path.join(path, "eval_episodes.jsonl"), "w") as f:
        for step, tasks in steps.items():
            for task, oks in tasks.items():
                for ok in oks:
                    f.write(json.dumps({"env": "babyai", "task_id": task, "step": step,
                                        "status": "done", "reward": float(ok),
                                        "success": ok == 1}) + "\n")
    return str(path)


def test_learning_report_groups_seeds_and_reports_them(tmp_path, monkeypatch):
    import learning_report

    monkeypatch.setattr(learning_report, "plot", lambda *a: None)  # the figure is not tested here

    def run(name: str, steps: dict[int, dict[str, list[int]]]) -> str:
        return write_run(tmp_path / name, steps)

    runs = [run("base", {0: {"1": [0, 0], "2": [0, 1]}}),                     # 0.25
            run("rl", {0: {"1": [0, 0], "2": [0, 1]}, 5: {"1": [1, 1], "2": [0, 1]}}),  # 0.75
            run("rl_s1", {0: {"1": [0, 0], "2": [0, 1]}, 4: {"1": [1, 0], "2": [0, 0]}}),  # 0.25
            str(tmp_path / "never_ran_s2")]
    out = tmp_path / "out"
    assert learning_report.main([*runs, "--seeds", "--diff", "rl:base,rl:rl@first",
                                 "--out", str(out)]) == 0
    r = json.load(open(out / "gain.json"))["seed_level"]
    assert r["configurations"]["rl"]["labels"] == {"0": "rl", "1": "rl_s1"}
    last = r["configurations"]["rl"]["last"]
    assert last["n_seeds"] == 2 and last["mean"] == pytest.approx(0.5)
    assert last["steps"] == {"0": 5, "1": 4} and last["std"] == pytest.approx(np.sqrt(0.125))
    assert r["configurations"]["base"]["last"]["single_seed"]
    assert "never_ran" in r["configurations"]["never_ran"]["missing"][0]
    d = r["differences"]["rl:base"]
    assert d["paired_seeds"] and d["pairs"] == [[0, 0], [1, 0]] and d["mean"] == pytest.approx(0.25)
    assert r["differences"]["rl:rl@first"]["per_pair"] == {"0:0": 0.5, "1:1": 0.0}


def test_t_interval_against_a_hand_computed_case(capsys):
    """Scores 0.1, 0.2, 0.3: mean 0.2, std 0.1, t_{0.975, 2} = 4.302652729749464 (tables), half
    width 4.302652729749464 * 0.1 / sqrt(3) = 0.248413...; the command line prints points."""
    r = seed_stats.t_interval([0.1, 0.2, 0.3])
    half = 4.302652729749464 * 0.1 / math.sqrt(3)
    assert r["n_seeds"] == 3 and r["mean"] == pytest.approx(0.2) and r["std"] == pytest.approx(0.1)
    assert r["ci95_low"] == pytest.approx(0.2 - half, abs=1e-12)
    assert r["ci95_high"] == pytest.approx(0.2 + half, abs=1e-12)
    with pytest.raises(ValueError, match="two seeds"):
        seed_stats.t_interval([0.5])
    assert seed_stats.main(["--values", "0.5", "0.6", "0.7", "--minus", "0.4", "0.4", "0.5"]) == 0
    # differences 0.1, 0.2, 0.2: mean 0.1667, std 0.0577, half 4.3027 * 0.0577 / sqrt(3) = 0.1434
    assert capsys.readouterr().out.startswith("+16.7 [+2.3, +31.0] over 3 seeds")
