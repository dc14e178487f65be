"""benchmarks/speed/turn_intake.py: both modes take every turn's context to the same ids (the
trajectory's whole chunk), and the report's numbers are its runs' medians."""

import json
import statistics

from benchmarks.speed import turn_intake


def test_the_report_holds_each_lengths_medians(tmp_path):
    out = turn_intake.main(["--lengths", "200,400", "--prompt", "50", "--turn-tokens", "30",
                            "--window", "2", "--repeats", "3", "--json",
                            str(tmp_path / "t.json")])
    assert json.loads((tmp_path / "t.json").read_text()) == out
    for row in out["rows"]:
        samples = row["samples_us"]
        assert len(samples["list"]) == len(samples["array"]) == 3
        assert row["list_us"] == statistics.median(samples["list"])
        assert row["array_us"] == statistics.median(samples["array"])
        assert row["ratio"] == row["list_us"] / row["array_us"]
