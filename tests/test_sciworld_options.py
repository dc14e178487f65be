"""``benchmarks/analysis/sciworld_options.py``'s bookkeeping, on hand-made steps: which gold
actions count as listed, the spaced sample, and the shares over steps, scoring steps, task
types and commands."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks" / "analysis"))

from sciworld_options import (listed_forms, shares, spaced_sample, summarise,  # noqa: E402
                              walks_path, write_report)


def test_a_gold_action_is_itself_or_its_located_spelling():
    valid = ["focus on thermometer", "look around", "move pot to stove"]
    assert listed_forms("look around", valid) == ["look around"]
    assert listed_forms("focus on thermometer in inventory", valid) == ["focus on thermometer"]
    assert listed_forms("focus on thermometer bag", valid) == []   # another object, not a location
    assert listed_forms("examine pot", valid) == []


def test_spaced_sample_takes_evenly_spaced_ids_of_each_type():
    ids = [f"boil/var={i}" for i in range(10)] + ["melt/var=3", "melt/var=4"]
    assert spaced_sample(ids, 2) == ["boil/var=0", "boil/var=5", "melt/var=3", "melt/var=4"]
    assert spaced_sample(ids, 5) == ["boil/var=0", "boil/var=2", "boil/var=4", "boil/var=6",
                                     "boil/var=8", "melt/var=3", "melt/var=4"]


def _step(command, form, scoring=False):
    return {"action": command, "command": command, "form": form, "rank": None,
            "scoring": scoring, "listed_count": 30}


def test_shares_leave_out_actions_the_simulator_does_not_list():
    steps = [_step("go to", "listed"), _step("move", "valid"), _step("use", "not_valid")]
    assert shares(steps) == {"steps": 3, "comparable": 2, "listed": 1, "share": 0.5}
    assert shares([_step("use", "not_valid")])["share"] is None


def test_summary_weights_steps_and_task_types_apart():
    walks = {
        "boil/var=1": [_step("go to", "listed", True), _step("move", "valid", True),
                       _step("look", "listed"), _step("look", "listed")],
        "melt/var=1": [_step("move", "valid", True), _step("use", "not_valid", True)],
    }
    summary = summarise(walks)
    assert summary["all"] == {"steps": 6, "comparable": 5, "listed": 3, "share": 0.6}
    assert summary["mean_over_task_types"] == round((3 / 4 + 0 / 1) / 2, 4)
    assert summary["scoring_steps"] == {"steps": 4, "comparable": 3, "listed": 1, "share": 0.3333}
    assert summary["scoring_mean_over_task_types"] == round((1 / 2 + 0) / 2, 4)
    assert summary["per_command"]["move"]["share"] == 0.0
    assert summary["per_command"]["look"]["listed"] == 2
    assert list(summary["per_command"]) == ["move", "look", "go to", "use"]  # most steps first


def test_report_and_walks_are_written_apart(tmp_path):
    import gzip
    import json

    walks = {"boil/var=1": [_step("go to", "listed", True)], "melt/var=2": []}
    path = tmp_path / "out" / "test_after.json"
    write_report(str(path), {"all": shares(walks["boil/var=1"])}, walks)
    assert json.loads(path.read_text()) == {"all": {"steps": 1, "comparable": 1, "listed": 1,
                                                     "share": 1.0}}
    assert walks_path(str(path)) == str(tmp_path / "out" / "test_after_walks.jsonl.gz")
    with gzip.open(walks_path(str(path)), "rt") as f:
        lines = [json.loads(line) for line in f]
    assert lines == [{"task_id": t, "steps": s} for t, s in walks.items()]
