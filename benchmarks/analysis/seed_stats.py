"""Seed-level statistics of held-out evaluations: several training runs of one configuration
that differ only in their training seed, each evaluated on held-out tasks with a few samples a
task.

Notation: seed s (s = 1..S) has tasks t = 1..T_s, each with samples x_{s,t,1..k}; the task value
is v_{s,t} = mean_j x_{s,t,j} (a success rate) and the seed's score m_s = mean_t v_{s,t}.

- point estimate: ``mean`` = (1/S) sum_s m_s (every seed weighs the same);
- spread across seeds: ``min`` / ``max`` of m_s and ``std`` = sample standard deviation
  sqrt(sum_s (m_s - mean)^2 / (S - 1)) (``None`` for one seed);
- 95% interval: two-level (hierarchical) bootstrap. A draw picks S seeds with replacement
  (s*_1..s*_S); for each picked seed it picks T_{s*} of that seed's tasks with replacement
  (a fresh pick for every time a seed is picked); the draw's value is
  (1/S) sum_i mean_{t in draw i} v_{s*_i, t}. The interval is the 2.5 / 97.5 percentiles of the
  draws (``numpy.percentile``, linear interpolation). Resampling seeds covers training
  variance, resampling tasks inside each seed covers evaluation sampling; samples within a
  task are not resampled (the task is the unit, as in the single-run bootstrap). The draws have
  mean ``mean`` and variance (1/S) [ (1/S) sum_s (m_s - mean)^2 + (1/S) sum_s sigma_s^2 / T_s ]
  with sigma_s^2 = (1/T_s) sum_t (v_{s,t} - m_s)^2: seed variance plus task variance.
- with one seed the seed level has nothing to resample: the interval is the task bootstrap
  alone and covers evaluation sampling only (``single_seed`` True, ``interval_covers`` says so).

A difference B - A works on per-task differences d_{s,t} = v^B_{s,t} - v^A_{s,t} over the tasks
both sides evaluated (paired over tasks) when seeds can be paired: seed s of B against seed s of
A for the seeds both sides ran (they share the seed, e.g. the same SFT policy; seeds only one
side ran are left out and listed), or, when one side is a *reference* with a single run (an
untrained policy such as the base model, whose evaluation has no training seed), that run
against every seed of the other side. The two-level bootstrap then runs on the d_{s,t}.
Otherwise (no seed in common) the two sides are bootstrapped independently (seeds and tasks
each) and the interval is that of the difference of the two draws.

Where only the per-seed scores m_s survive (no per-task results), ``t_interval`` gives the
Student-t 95% interval over the seeds: mean +- t_{0.975, S-1} * std / sqrt(S). Each m_s carries
its own evaluation noise, so the interval covers both sources; for paired differences pass
m^B_s - m^A_s. Command line (points, x100):
``python benchmarks/analysis/seed_stats.py --values 0.459 0.473 0.463 [--minus 0.523 0.475 0.486]``.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence

import numpy as np
from scipy import stats

#: what the interval covers, by number of seeds
COVERS_SEEDS = "training seeds and evaluation tasks (two-level bootstrap)"
COVERS_TASKS_ONLY = "evaluation tasks only (1 seed: no training variance)"


def task_values(successes: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """``{task: mean of its samples}`` (v_{s,t}); tasks without samples are dropped."""
    return {t: float(np.mean(x)) for t, x in successes.items() if len(x)}


def spread(scores: Sequence[float]) -> dict[str, float | None]:
    """Mean, min, max and sample standard deviation (ddof 1; ``None`` for one value) of the
    per-seed scores m_s."""
    m = np.asarray(scores, dtype=np.float64)
    if m.size == 0:
        raise ValueError("no seeds")
    return {"mean": float(m.mean()), "min": float(m.min()), "max": float(m.max()),
            "std": float(m.std(ddof=1)) if m.size > 1 else None}


def hierarchical_draws(units: Sequence[Sequence[float]], draws: int = 10_000,
                       seed: int = 0) -> np.ndarray:
    """``draws`` values of the two-level bootstrap (module docstring) of ``units``: one 1-D
    array of task values (or per-task differences) per seed. Returns shape ``(draws,)``."""
    arrays = [np.asarray(u, dtype=np.float64) for u in units]
    if not arrays or any(a.ndim != 1 or a.size == 0 for a in arrays):
        raise ValueError("every seed needs a 1-D, non-empty array of task values")
    n_seeds = len(arrays)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, n_seeds, (draws, n_seeds))  # picked seed of each draw's slot
    total = np.zeros(draws)
    for s, a in enumerate(arrays):
        rows = np.nonzero(picks == s)[0]  # one entry per (draw, slot) that picked seed s
        if rows.size:
            means = a[rng.integers(0, a.size, (rows.size, a.size))].mean(axis=1)
            np.add.at(total, rows, means)
    return total / n_seeds


def _interval(draws: np.ndarray) -> tuple[float, float]:
    lo, hi = np.percentile(draws, [2.5, 97.5])
    return float(lo), float(hi)


def _covers(n_seeds: int) -> dict:
    return {"single_seed": n_seeds == 1,
            "interval_covers": COVERS_TASKS_ONLY if n_seeds == 1 else COVERS_SEEDS}


def seed_level(per_seed: Mapping[int, Mapping[str, Sequence[float]]], draws: int = 10_000,
               seed: int = 0) -> dict:
    """Mean over seeds, spread and two-level 95% interval of one configuration.

    ``per_seed``: ``{training seed: {task: [sample successes]}}``. Returns ``seeds``,
    ``n_seeds``, ``per_seed`` (m_s), ``tasks`` (T_s), ``mean``, ``min``, ``max``, ``std``,
    ``ci95_low``, ``ci95_high``, ``single_seed`` and ``interval_covers``."""
    seeds = sorted(per_seed)
    values = [np.array(list(task_values(per_seed[s]).values())) for s in seeds]
    if not seeds or any(v.size == 0 for v in values):
        raise ValueError("every seed needs at least one evaluated task")
    scores = [float(v.mean()) for v in values]
    lo, hi = _interval(hierarchical_draws(values, draws, seed))
    return {"seeds": seeds, "n_seeds": len(seeds), "per_seed": dict(zip(seeds, scores)),
            "tasks": dict(zip(seeds, [int(v.size) for v in values])), **spread(scores),
            "ci95_low": lo, "ci95_high": hi, **_covers(len(seeds))}


def seed_pairs(b_seeds: Sequence[int], a_seeds: Sequence[int],
               reference: str | None = None) -> list[tuple[int, int]] | None:
    """The ``(seed of B, seed of A)`` pairs of a paired difference, ``None`` when the seeds
    cannot be paired. ``reference`` ``"a"`` / ``"b"``: that side, if it has a single run, pairs
    with every seed of the other side; otherwise the seeds both sides ran pair seed by seed."""
    b, a = sorted(b_seeds), sorted(a_seeds)
    if reference == "a" and len(a) == 1:
        return [(s, a[0]) for s in b]
    if reference == "b" and len(b) == 1:
        return [(b[0], s) for s in a]
    return [(s, s) for s in sorted(set(a) & set(b))] or None


def seed_level_difference(b: Mapping[int, Mapping[str, Sequence[float]]],
                          a: Mapping[int, Mapping[str, Sequence[float]]],
                          draws: int = 10_000, seed: int = 0,
                          reference: str | None = None) -> dict:
    """B - A over seeds (module docstring): ``mean`` (mean over seed pairs of the mean
    per-task difference; unpaired: mean_B - mean_A), the spread of the per-pair differences,
    the two-level 95% interval, ``paired_seeds``, the number of tasks per pair and
    ``left_out_seeds`` (seeds of one side only). ``reference``: :func:`seed_pairs`."""
    pairs = seed_pairs(list(b), list(a), reference)
    if pairs is None:
        eb, ea = seed_level(b, draws, seed), seed_level(a, draws, seed + 1)
        vb = [np.array(list(task_values(b[s]).values())) for s in eb["seeds"]]
        va = [np.array(list(task_values(a[s]).values())) for s in ea["seeds"]]
        diff = hierarchical_draws(vb, draws, seed) - hierarchical_draws(va, draws, seed + 1)
        lo, hi = _interval(diff)
        return {"paired_seeds": False, "b_seeds": eb["seeds"], "a_seeds": ea["seeds"],
                "n_seeds": min(eb["n_seeds"], ea["n_seeds"]), "mean": eb["mean"] - ea["mean"],
                "min": None, "max": None, "std": None, "ci95_low": lo, "ci95_high": hi,
                **_covers(min(eb["n_seeds"], ea["n_seeds"]))}
    units, per_pair, tasks = [], {}, {}
    for sb, sa in pairs:
        vb, va = task_values(b[sb]), task_values(a[sa])
        common = sorted(set(vb) & set(va))
        if not common:
            raise ValueError(f"no task evaluated by both B seed {sb} and A seed {sa}")
        d = np.array([vb[t] - va[t] for t in common])
        units.append(d)
        per_pair[f"{sb}:{sa}"] = float(d.mean())
        tasks[f"{sb}:{sa}"] = len(common)
    lo, hi = _interval(hierarchical_draws(units, draws, seed))
    used_b, used_a = {p[0] for p in pairs}, {p[1] for p in pairs}
    left_out = {"b": sorted(set(b) - used_b), "a": sorted(set(a) - used_a)}
    return {"paired_seeds": True, "pairs": [list(p) for p in pairs], "n_seeds": len(pairs),
            "per_pair": per_pair, "tasks": tasks, **spread(list(per_pair.values())),
            "ci95_low": lo, "ci95_high": hi, **_covers(len(pairs)),
            **({"left_out_seeds": left_out} if left_out["a"] or left_out["b"] else {})}


def fmt_points(entry: Mapping, signed: bool = False) -> str:
    """``entry`` as ``"m [lo, hi]"`` in points (x100), e.g. ``+4.3 [+1.0, +7.8]``."""
    f = "{:+.1f}" if signed else "{:.1f}"
    return (f"{f.format(100 * entry['mean'])} [{f.format(100 * entry['ci95_low'])}, "
            f"{f.format(100 * entry['ci95_high'])}]")


def t_interval(scores: Sequence[float], level: float = 0.95) -> dict[str, float | int]:
    """Student-t interval over per-seed scores m_s (module docstring): ``mean``, ``std``
    (ddof 1), ``ci95_low`` / ``ci95_high`` = mean -+ t_{(1+level)/2, S-1} std / sqrt(S)."""
    m = np.asarray(scores, dtype=np.float64)
    if m.size < 2:
        raise ValueError(f"a t-interval needs two seeds or more, got {m.size}")
    half = float(stats.t.ppf((1 + level) / 2, m.size - 1) * m.std(ddof=1) / np.sqrt(m.size))
    return {"n_seeds": int(m.size), "mean": float(m.mean()), "std": float(m.std(ddof=1)),
            "ci95_low": float(m.mean()) - half, "ci95_high": float(m.mean()) + half}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Student-t 95%% interval over per-seed scores "
                                             "(or paired differences), printed in points")
    ap.add_argument("--values", type=float, nargs="+", required=True, help="m_s of B, per seed")
    ap.add_argument("--minus", type=float, nargs="+", help="m_s of A, same seeds in order")
    args = ap.parse_args(argv)
    values = np.asarray(args.values)
    if args.minus is not None:
        if len(args.minus) != len(values):
            ap.error(f"--minus has {len(args.minus)} values, --values {len(values)}")
        values = values - np.asarray(args.minus)
    r = t_interval(values)
    signed = args.minus is not None
    print(f"{fmt_points(r, signed)} over {r['n_seeds']} seeds (t-interval); std "
          f"{100 * r['std']:.1f}; per seed "
          + ", ".join(f"{100 * v:{'+' if signed else ''}.1f}" for v in values))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
