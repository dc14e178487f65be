"""benchmarks/analysis/step_by_horizon.py: a run's step time per horizon phase from its own
metrics rows, against a hand-computed case."""

from __future__ import annotations

import json

import pytest

from benchmarks.analysis.step_by_horizon import by_horizon, main, markdown


def write_run(path, rows):
    path.mkdir()
    with open(path / "metrics.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return str(path)


def train_row(step, time, horizon, rollout, update, tokens):
    return {"step": step, "time": time, "train/horizon": horizon, "rollout/wall_s": rollout,
            "perf/update_time_s": update, "rollout/generated_tokens": tokens,
            "batch/generated_tokens": tokens // 2}


def test_steps_are_timed_by_the_gap_to_the_previous_row(tmp_path):
    run = write_run(tmp_path / "run", [
        {"step": 0, "time": 90.0, "eval/avg_at_k": 0.1},  # an evaluation row: not a step
        train_row(1, 100.0, 6, 5.0, 1.0, 1000),  # the first step: no wall time (compiles)
        train_row(2, 102.0, 6, 1.5, 0.4, 900),   # 2 s
        train_row(3, 105.0, 6, 2.5, 0.4, 1100),  # 3 s
        train_row(4, 109.0, 13, 3.0, 0.8, 2000),  # 4 s
        train_row(5, 500.0, 13, 3.0, 0.8, 2000),  # after a 391-s gap (a resumed session)
        train_row(6, 505.0, 13, 4.0, 0.6, 2400),  # 5 s
    ])
    rep = by_horizon(run, max_gap=60.0)
    six, thirteen = rep["horizons"][6], rep["horizons"][13]
    assert six == pytest.approx({"steps": 2, "mean_step_s": 2.5, "rollout_s": 2.0,
                                 "update_s": 0.4, "rollout_tok_s": 2000 / 4.0})
    assert thirteen == pytest.approx({"steps": 2, "mean_step_s": 4.5, "rollout_s": 3.5,
                                      "update_s": 0.7, "rollout_tok_s": 4400 / 7.0})
    assert rep["all"] == pytest.approx({"steps": 4, "mean_step_s": 14 / 4, "rollout_s": 11 / 4,
                                        "update_s": 2.2 / 4, "rollout_tok_s": 6400 / 11.0})
    # a larger allowed gap times the step after it too
    assert by_horizon(run, max_gap=1000.0)["horizons"][13]["steps"] == 3


def test_a_missing_step_leaves_the_next_untimed_and_markdown_lists_each_phase(tmp_path, capsys):
    run = write_run(tmp_path / "gappy", [
        train_row(1, 10.0, 6, 1.0, 0.5, 100),
        train_row(3, 14.0, 6, 1.0, 0.5, 100),  # step 2 missing: 4 s is two steps, not one
        train_row(4, 15.0, 6, 0.5, 0.25, 100),
    ])
    rep = by_horizon(run, max_gap=60.0)
    assert rep["horizons"][6]["steps"] == 1 and rep["all"]["mean_step_s"] == pytest.approx(1.0)
    table = markdown([rep])
    assert "| gappy | 6 | 1 | 1.00 s | 0.50 s | 0.25 s | 200 |" in table
    assert "| gappy | all | 1 | 1.00 s |" in table
    out = tmp_path / "out.json"
    main(["--run", run, "--json", str(out)])
    assert json.loads(out.read_text())[0]["all"]["steps"] == 1
    assert "| gappy | all |" in capsys.readouterr().out
