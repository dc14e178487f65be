"""benchmarks/speed/worker_first_collect.py: its arguments are checked, and a tiny run on a real
BabyAI server plays its collects in a worker spawned ahead and reports the first against the
others."""

from __future__ import annotations

import json

import pytest

from benchmarks.speed.worker_first_collect import main


@pytest.mark.parametrize("argv", [["--workers", "0"], ["--collects", "1"]])
def test_bad_arguments_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert "--workers >= 1 and --collects >= 2" in capsys.readouterr().err


@pytest.mark.slow
def test_a_tiny_run_reports_each_collect(tmp_path):
    out = tmp_path / "first.json"
    report = main(["--workers", "1", "--wait", "0", "--collects", "2", "--tasks", "2",
                   "--samples", "2", "--turns", "2", "--json", str(out)])
    assert len(report["collect_s"]) == 2 and all(s > 0 for s in report["collect_s"])
    assert report["first_use_s"] == pytest.approx(report["collect_s"][0] - report["collect_s"][1])
    assert json.loads(out.read_text())["collect_s"] == report["collect_s"]
