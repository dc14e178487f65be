"""benchmarks/analysis/textcraft_depth.py against hand counts: the recipe expert's lengths of two
goals counted from their crafting commands, and the bins of hand-made evaluation files."""

from __future__ import annotations

import gzip
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks", "analysis"))
import textcraft_depth  # noqa: E402


def test_expert_lengths_by_hand():
    # paper: "craft 3 paper using 3 sugar cane" -> get 3 sugar cane, craft: 2 actions.
    # birch boat: "craft 1 birch boat using 5 birch planks", "craft 4 birch planks using 1 birch
    # logs" -> get 2 birch logs, craft planks twice (8), craft the boat: 4 actions.
    assert textcraft_depth.expert_length("paper") == 2
    assert textcraft_depth.expert_length("birch_boat") == 4


def _run(path, episodes: list[tuple[str, int, float]]) -> str:
    os.makedirs(path)
    with gzip.open(os.path.join(path, "eval_episodes.jsonl.gz"), "wt") as f:
        f.writelines(json.dumps({"env": "textcraft", "task_id": t, "step": s, "reward": r,
                                 "status": "done" if r else "max_turns"}) + "\n"
                     for t, s, r in episodes)
    return str(path)


def test_bins_of_two_runs_and_a_chance_file(tmp_path, capsys):
    a = _run(tmp_path / "a", [("paper", 0, 0.0), ("paper", 0, 1.0), ("paper", 45, 1.0),
                              ("paper", 45, 1.0), ("birch_boat", 0, 0.0), ("birch_boat", 45, 0.0),
                              ("birch_boat", 20, 1.0)])  # a middle step: neither first nor last
    b = _run(tmp_path / "b", [("paper", 0, 1.0), ("paper", 45, 0.0), ("birch_boat", 0, 0.0),
                              ("birch_boat", 45, 1.0)])
    chance = tmp_path / "chance.json"
    chance.write_text(json.dumps({"policies": [{"policy": "uniform",
                                                "task_ids": ["paper", "paper", "birch_boat"],
                                                "scores": [1.0, 0.0, 0.0]}]}))
    report = textcraft_depth.main(["--runs", a, b, "--bins", "3,6", "--turns", "3",
                                   "--chance", str(chance), "--json", str(tmp_path / "d.json")])
    goals = {g["goal"]: g for g in report["goals"]}
    assert goals["paper"]["before"] == 2 / 3 and goals["paper"]["after"] == 2 / 3
    assert goals["birch_boat"]["before"] == 0.0 and goals["birch_boat"]["after"] == 0.5
    assert report["bins"] == [
        {"lengths": [1, 3], "goals": 1, "before": 2 / 3, "after": 2 / 3,
         "never_solved_after": 0, "chance": 0.5},
        {"lengths": [4, 6], "goals": 1, "before": 0.0, "after": 0.5, "never_solved_after": 0,
         "chance": 0.0}]
    out = capsys.readouterr().out
    assert "| 1-3 | 1 | 0.667 | 0.667 | 0 | 0.500 | yes |" in out
    assert "| 4-6 | 1 | 0.000 | 0.500 | 0 | 0.000 | no |" in out
    assert "uniform (no model)" in out
    assert json.loads((tmp_path / "d.json").read_text())["chance_policy"] == "uniform"
