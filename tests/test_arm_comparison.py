"""benchmarks/analysis/arm_comparison.py on hand-made evaluation files: the gains and the paired
difference, computed here by hand."""

import json
import math

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
