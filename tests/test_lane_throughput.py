"""benchmarks/analysis/lane_throughput.py on hand-made run folders: per-window steps, tokens,
seconds a step and the totals over runs, against values worked out by hand."""

from __future__ import annotations

import gzip
import json

import pytest

from benchmarks.analysis import lane_throughput as lt


def _run(path, rows):
    path.mkdir()
    with gzip.open(path / "metrics.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return str(path)


@pytest.fixture
def runs(tmp_path):
    # run a: a step every 10 s from t=100 (steps 1..6), 100 generated tokens a step (40 of
    # them in groups trained on), 3 turns; an evaluation row at t=125 (not a training row)
    a = [{"step": s, "time": 90 + 10 * s, "rollout/generated_tokens": 100,
          "batch/generated_tokens": 40, "rollout/mean_turns": 3.0} for s in range(1, 7)]
    a.append({"step": 2, "time": 125, "eval/avg@4": 0.5})
    # run b: steps at t=100, 104, 108, 112, 116, 120, 124, 128: 50 tokens, turns 1 then 2
    b = [{"step": s, "time": 96 + 4 * s, "rollout/generated_tokens": 50,
          "batch/generated_tokens": 50,
          "rollout/mean_turns": 1.0 if s % 2 else 2.0} for s in range(1, 9)]
    return _run(tmp_path / "a", a), _run(tmp_path / "b", b)


def test_a_window_counts_the_rows_inside_it(runs):
    a, b = runs
    report = lt.throughput([a, b], [("w", 100.0, 120.0)])["w"]
    # a: t=100, 110 (t=120 is outside: END excluded); b: t=100..116, 5 rows
    ra, rb = report["runs"][a], report["runs"][b]
    assert (ra["steps"], ra["first_step"], ra["last_step"]) == (2, 1, 2)
    assert ra["generated_tokens"] == 200 and ra["seconds_per_step"] == pytest.approx(10.0)
    assert ra["trained_tokens"] == 80  # the flat groups' tokens are generated, not trained
    assert (rb["steps"], rb["generated_tokens"]) == (5, 250)
    assert rb["seconds_per_step"] == pytest.approx(4.0)
    assert rb["turns_mean"] == pytest.approx((1 + 2 + 1 + 2 + 1) / 5)
    assert report["generated_tok_s"] == pytest.approx(450 / 20)
    assert report["steps_s"] == pytest.approx(7 / 20)


def test_a_window_with_one_row_or_none(runs):
    a, b = runs
    report = lt.throughput([a, b], [("late", 145.0, 155.0)])["late"]
    assert report["runs"][a]["steps"] == 1 and report["runs"][a]["seconds_per_step"] is None
    assert report["runs"][b]["steps"] == 0 and report["runs"][b]["turns_mean"] is None
    text = lt.markdown({"late": report})
    assert "| late | a | 6-6 | 10 | - | 3.0 |" in text and "| late | b |" not in text


@pytest.mark.parametrize("bad", ["w=1:1", "w=2:1", "w=1-2", "=1:2", "w=a:2", "1:2"])
def test_bad_windows_are_refused_with_the_expected_form(bad):
    with pytest.raises(ValueError, match="window"):
        lt.parse_window(bad)
    assert lt.parse_window("calm=1.5:3") == ("calm", 1.5, 3.0)
