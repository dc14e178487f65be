"""benchmarks/analysis/arm_comparison.py on hand-made evaluation files: the gains and the paired
difference, computed here by hand."""

import json
import math

import pytest

from benchmarks.analysis.arm_comparison import compare


def _run(path, before, after):
    """One task, k = 1: an episode scoring ``before`` at step 0 and ``after`` at step 10."""
    path.mkdir()
    rows = [{"step": s, "env": "babyai", "task_id": "t", "reward": r, "success": r > 0,
             "status": "done", "num_turns": 2, "invalid_actions": 1}
            for s, r in ((0, before), (10, after))]
    (path / "eval_episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_gains_and_paired_difference(tmp_path):
    a = [_run(tmp_path / f"a{i}", 0.0, x) for i, x in enumerate((0.4, 0.5, 0.6))]
    b = [_run(tmp_path / f"b{i}", 0.1, x) for i, x in enumerate((0.3, 0.5, 0.4))]
    report = compare(a, b, k=1)["avg_at_k"]
    assert math.isclose(report["gain_a"]["mean"], 0.5)
    assert math.isclose(report["gain_b"]["mean"], (0.2 + 0.4 + 0.3) / 3)
    diffs = [-0.1, 0.0, -0.2]
    assert all(math.isclose(x, y, abs_tol=1e-12)
               for x, y in zip(report["per_seed_b_minus_a"], diffs))
    mean, sd = -0.1, 0.1  # of the diffs, ddof 1
    half = 4.302652729911275 * sd / math.sqrt(3)  # t_{0.975, 2}
    assert math.isclose(report["last_b_minus_a"]["ci95_low"], mean - half, rel_tol=1e-9)


def _summary_run(path, before, after, scoring="paper", k=1):
    """A run folder with no evaluation episodes, its evaluations only in ``summary.json``."""
    path.mkdir()
    evals = {str(s): {"k": k, "scoring": scoring, "avg_at_k": r, "pass_at_k": float(r > 0),
                      "success_rate": r / 2} for s, r in ((0, before), (10, after))}
    (path / "summary.json").write_text(json.dumps({"evals": evals}))
    return str(path)


def test_a_run_without_episodes_is_read_from_its_summary(tmp_path):
    a = [_run(tmp_path / f"a{i}", 0.0, x) for i, x in enumerate((0.4, 0.5, 0.6))]
    b = [_run(tmp_path / "b0", 0.1, 0.3), _run(tmp_path / "b1", 0.1, 0.5),
         _summary_run(tmp_path / "b2", 0.1, 0.4)]
    report = compare(a, b, k=1)
    assert report["from_summary"] == [b[2]]
    assert math.isclose(report["avg_at_k"]["per_seed_b_minus_a"][2], 0.4 - 0.6)
    # a2 succeeds on its one episode (reward > 0); b2's summary says 0.4 / 2
    assert math.isclose(report["success_rate"]["per_seed_b_minus_a"][2], 0.2 - 1.0)
    assert math.isclose(report["avg_at_k"]["gain_b"]["mean"], (0.2 + 0.4 + 0.3) / 3)


def test_a_summary_scored_otherwise_is_refused(tmp_path):
    a = [_run(tmp_path / f"a{i}", 0.0, 0.5) for i in range(2)]
    for name, kwargs in (("old", {"scoring": "success"}), ("k4", {"k": 4})):
        b = [_run(tmp_path / f"{name}_b0", 0.0, 0.5), _summary_run(tmp_path / name, 0.0, 0.5,
                                                                     **kwargs)]
        with pytest.raises(SystemExit, match="paper's metric at k = 1"):
            compare(a, b, k=1)
