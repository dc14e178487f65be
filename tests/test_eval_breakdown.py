"""benchmarks/analysis/eval_breakdown.py against hand-computed numbers on hand-made evaluation files."""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks", "analysis"))
import eval_breakdown  # noqa: E402


def _episode(task: str, step: int, status: str, success: bool, turns: int, invalid: int) -> dict:
    return {"env": "babyai", "task_id": task, "step": step, "status": status,
            "reward": float(success), "success": success, "num_turns": turns,
            "invalid_actions": invalid}


def _run(path, episodes: list[dict]) -> str:
    os.makedirs(path)
    with open(os.path.join(path, "eval_episodes.jsonl"), "w") as f:
        f.writelines(json.dumps(e) + "\n" for e in episodes)
    return str(path)


def test_breakdown_of_two_runs_by_hand(tmp_path, capsys):
    a = _run(tmp_path / "a", [
        _episode("L1/seed=1", 0, "max_turns", False, 20, 10),
        _episode("L2/seed=2", 0, "context_limit", False, 12, 6),
        _episode("L1/seed=1", 9, "done", True, 3, 0),       # final: 2 of 4 succeed
        _episode("L1/seed=1", 9, "done", True, 5, 1),
        _episode("L2/seed=2", 9, "context_limit", False, 14, 2),
        _episode("L3/seed=3", 9, "max_turns", False, 20, 5),
    ])
    b = _run(tmp_path / "b", [
        _episode("L1/seed=1", 0, "max_turns", False, 20, 4),
        _episode("L2/seed=2", 4, "done", False, 7, 0),      # the env ended it, no success
        _episode("L3/seed=3", 4, "done", True, 2, 0),
    ])
    assert eval_breakdown.main([a, b, "--labels", "A,B", "--out", str(tmp_path / "o.json")]) == 0
    s = json.load(open(tmp_path / "o.json"))
    fa = s["runs"]["A"]["final"]
    assert fa["step"] == 9 and fa["episodes"] == 4 and fa["success_rate"] == 0.5
    assert fa["status"] == {"done": 0.5, "context_limit": 0.25, "max_turns": 0.25}
    assert fa["failed_status"] == {"context_limit": 0.25, "max_turns": 0.25}
    assert fa["turns_success_mean"] == 4.0 and fa["invalid_per_episode"] == pytest.approx(2.0)
    assert fa["parse_failures_per_episode"] is None  # files without the field: unknown
    assert fa["levels"] == {"L1": [2, 2], "L2": [0, 1], "L3": [0, 1]}
    first = s["runs"]["A"]["first"]
    assert first["success_rate"] == 0.0 and first["turns_success_mean"] is None
    assert s["runs"]["B"]["final"]["failed_status"] == {"done": 0.5}
    # final evaluations together: L1 2/2 (A), L2 0/1 + 0/1, L3 0/1 (A) + 1/1 (B)
    assert s["never_solved"] == ["L2"] and s["never_solved_share"] == pytest.approx(2 / 6)
    out = capsys.readouterr().out
    assert "| A | 9 (final) | 0.500 | done 0.50, context_limit 0.25, max_turns 0.25 |" in out
    assert "Levels no final evaluation solved (1, 33.3% of" in out


def test_a_jsonl_file_of_episodes_is_one_evaluation(tmp_path):
    path = tmp_path / "experts.jsonl"
    path.write_text("".join(json.dumps({**_episode("L1/seed=5", 0, "done", ok, 4, 0),
                                        "token_ids": [1, 2]}) + "\n" for ok in (True, False)))
    s = eval_breakdown.summarize({"x": eval_breakdown.eval_episodes(str(path))})
    assert s["runs"]["x"]["first"]["success_rate"] == 0.5 and "final" not in s["runs"]["x"]
    with pytest.raises(SystemExit):
        eval_breakdown.main([str(tmp_path / "missing")])


def test_styles_split_one_file_of_answer_styles(tmp_path):
    """An action_format.py --episodes_out file (one set of episodes per style), read once per
    style: web navigation's trivial tasks apart, by hand."""
    rows = [("a", "click-test/seed=0", 1.0), ("a", "login-user/seed=0", 0.0),
            ("a", "enter-text/seed=0", 0.0), ("b", "click-test/seed=0", 0.0),
            ("b", "login-user/seed=0", 1.0), ("b", "enter-text/seed=0", 1.0),
            ("b", "choose-list/seed=0", 0.0)]
    path = tmp_path / "episodes.jsonl"
    path.write_text("".join(json.dumps({"style": s, "task_id": task, "status": "done",
                                        "reward": r, "shaping": 0.0, "num_turns": 2,
                                        "invalid_actions": 0, "parse_failures": 0}) + "\n"
                            for s, task, r in rows))
    out = tmp_path / "out.json"
    assert eval_breakdown.main([str(path), str(path), "--labels", "A,B", "--styles", "a,b",
                                "--out", str(out)]) == 0
    runs = json.loads(out.read_text())["runs"]
    a, b = runs["A"]["first"], runs["B"]["first"]
    assert a["non_trivial"] == {"episodes": 2, "success_rate": 0.0, "mean_score": 0.0}
    assert a["trivial"]["mean_score"] == 1.0
    assert b["non_trivial"]["episodes"] == 3
    assert b["non_trivial"]["mean_score"] == pytest.approx(2 / 3)
    assert b["trivial"]["mean_score"] == 0.0
    with pytest.raises(SystemExit):  # a style the file does not hold
        eval_breakdown.main([str(path), "--styles", "c"])
    with pytest.raises(SystemExit):  # one style for two runs
        eval_breakdown.main([str(path), str(path), "--styles", "a"])


def test_the_options_chosen_by_position(tmp_path, capsys):
    picks = [([0, 0, 4], [2, 2, 0]), ([1, -1], [0, -1])]  # (environment order, as shown)
    eps = [{**_episode("L1/seed=1", 5, "done", True, len(o), 0), "option_picks": o,
            "letter_picks": s} for o, s in picks]
    run = _run(tmp_path / "c", [_episode("L1/seed=1", 0, "max_turns", False, 3, 0)] + eps)
    assert eval_breakdown.main([run, "--labels", "C", "--out", str(tmp_path / "o.json")]) == 0
    s = json.load(open(tmp_path / "o.json"))["runs"]["C"]
    assert "picks" not in s["first"]  # an episode without picks (a file from before them)
    p = s["final"]["picks"]
    # five turns: listed 0, 0, 4, 1, none; shown 2, 2, 0, 0, none
    assert p["turns"] == 5
    assert p["listed"] == {"0": 0.4, "1": 0.2, "2": 0.0, "3+": 0.2, "none": 0.2}
    assert p["shown"] == {"0": 0.4, "1": 0.0, "2": 0.4, "3+": 0.0, "none": 0.2}
    # consecutive pairs where both chose an option: (0, 0) / (2, 2) and (0, 4) / (2, 0); the
    # second episode's (1, none) is no pair
    assert p["repeats"] == {"pairs": 2, "listed": 0.5, "shown": 0.5}
    row = ("| C | 5 (final) | 5 | 0.40 / 0.40 | 0.20 / 0.00 | 0.00 / 0.40 | 0.20 / 0.00 | "
           "0.20 / 0.20 | 0.50 / 0.50 |")
    assert row in capsys.readouterr().out


def test_repeats_of_the_previous_pick_by_hand():
    # a shuffled list: the letter repeats where the listed position does not, and back
    eps = [{"option_picks": [3, 1, 1, 2], "letter_picks": [0, 0, 2, 2]},
           {"option_picks": [5], "letter_picks": [1]},  # one turn: no pair
           {}]  # an episode from before the picks were recorded
    r = eval_breakdown.repeat_shares(eps)
    assert r["pairs"] == 3
    assert r["listed"] == pytest.approx(1 / 3)  # (1, 1)
    assert r["shown"] == pytest.approx(2 / 3)  # (0, 0) and (2, 2)
    assert eval_breakdown.repeat_shares([{}]) is None


def test_mean_score_per_level_by_hand(tmp_path, capsys):
    """Partial scores (ScienceWorld): no episode succeeds, yet each level's mean score moves;
    the mean over runs leaves out a run whose evaluation lacks the level."""
    def ep(task, step, reward, shaping=0.0):
        return {"env": "scienceworld", "task_id": task, "step": step, "status": "max_turns",
                "reward": reward, "shaping": shaping, "success": False, "num_turns": 30,
                "invalid_actions": 0}

    a = _run(tmp_path / "a", [
        ep("boil/var=1", 0, 0.0), ep("boil/var=2", 0, 0.1), ep("melt/var=1", 0, -0.2),
        ep("boil/var=1", 5, 0.3), ep("boil/var=2", 5, 0.5, shaping=0.2),  # task score 0.3
        ep("melt/var=1", 5, 0.4),
    ])
    b = _run(tmp_path / "b", [
        ep("boil/var=3", 0, 0.2), ep("boil/var=3", 7, 0.6),  # no melt in b
        ep("freeze/var=1", 7, 0.1),  # a level of the final evaluation only
    ])
    assert eval_breakdown.main([a, b, "--labels", "a,b", "--level-scores",
                                "--out", str(tmp_path / "s.json")]) == 0
    s = json.loads((tmp_path / "s.json").read_text())
    first, final = s["runs"]["a"]["first"], s["runs"]["a"]["final"]
    assert first["level_scores"] == pytest.approx({"boil": 0.05, "melt": -0.2})
    assert final["level_scores"] == pytest.approx({"boil": 0.3, "melt": 0.4})
    assert final["levels"] == {"boil": [0, 2], "melt": [0, 1]}
    assert s["level_scores"]["boil"] == pytest.approx({"first": (0.05 + 0.2) / 2,
                                                       "final": (0.3 + 0.6) / 2})
    assert s["level_scores"]["melt"] == pytest.approx({"first": -0.2, "final": 0.4})
    assert s["level_scores"]["freeze"] == pytest.approx({"first": None, "final": 0.1})
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines()
            if line.startswith(("| boil", "| melt", "| freeze"))]
    assert rows == ["| boil | 0.050 -> 0.300 | 0.200 -> 0.600 | 0.125 -> 0.450 |",
                    "| melt | -0.200 -> 0.400 | - | -0.200 -> 0.400 |",
                    "| freeze | - | - | - |"]
    assert eval_breakdown.main([a]) == 0
    assert "Mean score per level" not in capsys.readouterr().out
