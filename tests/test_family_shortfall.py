"""benchmarks/analysis/family_shortfall.py against numbers computed by hand on hand-made run
folders (evaluation episodes, metrics, config, a diagnosis file and a CPU step-0 file)."""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks", "analysis"))
import family_shortfall as fs


def _ep(
    env: str,
    task: str,
    step: int,
    status: str,
    reward: float,
    success: bool,
    turns: int,
    invalid: int,
) -> dict:
    return {
        "env": env,
        "task_id": task,
        "step": step,
        "status": status,
        "reward": reward,
        "success": success,
        "num_turns": turns,
        "invalid_actions": invalid,
    }


def _run(root, rel: str, episodes: list[dict], metrics: list[dict] = (), samples: int = 2) -> str:
    path = os.path.join(root, rel)
    os.makedirs(path)
    with open(os.path.join(path, "eval_episodes.jsonl"), "w") as f:
        f.writelines(json.dumps(e) + "\n" for e in episodes)
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(m) + "\n" for m in metrics)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"train": {"samples_per_task": samples}}, f)
    return rel


@pytest.fixture
def root(tmp_path, monkeypatch):
    """A BabyAI arm of one seed (with a diagnosis of its final evaluation), a web-navigation arm
    of two seeds (the second cut before its final evaluation), a ScienceWorld arm with only
    step 0, and one CPU step-0 file per family."""
    b = [  # step 0: L1 scores 0, 0; L2 0.5, 0
        _ep("babyai", "L1/seed=1", 0, "max_turns", 0.0, False, 10, 5),
        _ep("babyai", "L1/seed=1", 0, "context_limit", 0.0, False, 8, 8),
        _ep("babyai", "L2/seed=2", 0, "done", 0.5, True, 4, 0),
        _ep("babyai", "L2/seed=2", 0, "max_turns", 0.0, False, 10, 2),
        # step 5: L1 0.9, 0.7; L2 0 (the env ended it), 0 (turn limit)
        _ep("babyai", "L1/seed=1", 5, "done", 0.9, True, 2, 0),
        _ep("babyai", "L1/seed=1", 5, "done", 0.7, True, 4, 1),
        _ep("babyai", "L2/seed=2", 5, "done", 0.0, False, 3, 0),
        _ep("babyai", "L2/seed=2", 5, "max_turns", 0.0, False, 10, 3),
    ]
    metrics = [
        {"step": 0, "eval/avg@4": 0.125},
        {
            "step": 1,
            "train/horizon": 6,
            "rollout/episodes": 4,
            "rollout/flat_groups_skipped": 1,
            "rollout/success_rate": 0.25,
            "sequence_length/mean": 100,
            "sequence_length/max": 150,
        },
        {
            "step": 2,
            "train/horizon": 10,
            "rollout/episodes": 4,
            "rollout/flat_groups_skipped": 2,
            "rollout/success_rate": 0.5,
            "rollout/status/context_limit": 1,
        },
        {
            "step": 3,
            "train/horizon": 10,
            "rollout/episodes": 4,
            "rollout/flat_groups_skipped": 1,
            "rollout/success_rate": 0.0,
            "rollout/status/context_limit": 1,
            "sequence_length/mean": 300,
            "sequence_length/max": 400,
        },
    ]
    babyai = _run(tmp_path, "results/x/babyai_a", b, metrics)
    os.makedirs(tmp_path / "results" / "d")
    diag = {
        "/elsewhere/babyai_a/trajectories_eval.jsonl": {
            "5": {
                "episodes": 4,
                "parse_failures_per_turn": 0.1,
                "tokens_mean": 500.0,
                "tokens_max": 900,
            }
        }
    }
    (tmp_path / "results" / "x" / "diag.json").write_text(json.dumps(diag))
    w = [
        _ep("webnav", "click-test/seed=1", 0, "done", 0.0, False, 1, 1),
        _ep("webnav", "enter-text/seed=1", 0, "max_turns", 0.0, False, 15, 15),
        _ep("webnav", "click-test/seed=1", 3, "done", 1.0, True, 1, 0),  # trivial
        _ep("webnav", "enter-text/seed=1", 3, "done", 1.0, True, 2, 0),
        _ep("webnav", "enter-text/seed=1", 3, "done", 0.0, False, 1, 1),
        _ep("webnav", "click-button/seed=2", 3, "max_turns", 0.0, False, 3, 3),
    ]
    web = _run(tmp_path, "results/w/web", w)
    web_s1 = _run(tmp_path, "results/w/web_s1", w[:2])
    sw = _run(
        tmp_path,
        "results/s/sw",
        [_ep("scienceworld", "boil/var=1", 0, "max_turns", 0.03, False, 30, 29)],
    )
    cpu = {
        "args": {"split": "train", "turns": 5},
        "styles": [
            {
                "style": "choice_option_limits",
                "episodes": 3,
                "turns": 8,
                "parsable": 7,
                "accepted": 6,
                "scored": 2,
                "score_sum": 2.0,
                "context_tokens": 1500,
                "max_context_tokens": 700,
                "context_limit": 0,
                "episode_scores": [
                    ["click-test/seed=0", 1.0, 1],
                    ["enter-text/seed=0", 0.0, 5],
                    ["click-button/seed=0", 1.0, 2],
                ],
            }
        ],
    }
    os.makedirs(tmp_path / "results" / "cpu")
    for name in ("webnav_x.json", "other.json"):
        (tmp_path / "results" / "cpu" / name).write_text(json.dumps(cpu))
    monkeypatch.setattr(
        fs,
        "ARMS",
        (
            fs.Arm("babyai", "a", (babyai,), "dev"),
            fs.Arm("webnav", "w", (web, web_s1), "test"),
            fs.Arm("scienceworld", "s", (sw,), "test"),
        ),
    )
    monkeypatch.setattr(
        fs, "TARGETS", {k: fs.TARGETS[k] for k in ("babyai", "webnav", "scienceworld")}
    )
    monkeypatch.setattr(
        fs,
        "CPU_STEP0",
        {
            "babyai": (("results/cpu/other.json", "choice_option_limits"),),
            "webnav": (
                ("results/cpu/other.json", "choice_option_limits"),
                ("results/cpu/webnav_x.json", "choice_option_limits"),
            ),
            "scienceworld": (("results/cpu/other.json", "choice_option_limits"),),
        },
    )
    monkeypatch.setattr(fs, "DIAGNOSIS_FILES", ("results/x/diag.json",))
    return str(tmp_path)


def test_babyai_by_hand(root):
    s = fs.shortfall(root)["families"]["babyai"]
    arm = s["arms"][0]
    run = arm["runs"][0]
    first, final = run["first"], run["final"]
    assert first["step"] == 0 and final["step"] == 5
    # Avg@k: mean over tasks of the mean episode score
    assert first["avg"] == pytest.approx((0.0 + 0.25) / 2)
    assert final["avg"] == pytest.approx((0.8 + 0.0) / 2)
    assert first["valid_action_share"] == pytest.approx(1 - 15 / 32)
    assert final["valid_action_share"] == pytest.approx(1 - 4 / 19)
    assert first["reward_rate"] == 0.25 and final["reward_rate"] == 0.5
    assert first["endings"] == {
        "success": 0.25,
        "turn_limit": 0.5,
        "context_limit": 0.25,
        "other": 0.0,
    }
    assert final["endings"] == {
        "success": 0.5,
        "turn_limit": 0.25,
        "context_limit": 0.0,
        "other": 0.25,
    }
    # the diagnosis file covers step 5 only
    assert (final["parse_failures_per_turn"], final["tokens_mean"], final["tokens_max"]) == (
        0.1,
        500.0,
        900,
    )
    assert first["tokens_mean"] is None and first["parse_failures_per_turn"] is None
    # training: the last horizon phase (steps 2-3): 3 flat of 8 / 2 groups, 2 of 8 at the limit
    t = run["training"]
    assert t["steps"] == [2, 3] and t["horizon"] == 10
    assert t["success_rate"] == pytest.approx(0.25)
    assert t["flat_group_share"] == pytest.approx(3 / 4)
    assert t["context_limit_share"] == pytest.approx(2 / 8)
    assert (t["row_tokens_mean"], t["row_tokens_max"]) == (300, 400)
    assert s["best"] == "a" and s["best_value"] == pytest.approx(0.4)
    assert s["gap"] == pytest.approx(0.8 - 0.4) and s["reached"] is False


def test_webnav_trivial_apart_and_cut_seed(root):
    s = fs.shortfall(root)["families"]["webnav"]
    arm = s["arms"][0]
    assert arm["seeds_with_final"] == 1 and "final" not in arm["runs"][1]
    final = arm["runs"][0]["final"]
    # non-trivial: enter-text 0.5, click-button 0 -> 0.25; all tasks with click-test 1 -> 0.5
    assert final["headline"] == pytest.approx(0.25)
    assert final["avg_all_tasks"] == pytest.approx(0.5)
    assert final["episodes"] == 3
    assert final["valid_action_share"] == pytest.approx(1 - 4 / 6)
    assert final["reward_rate"] == pytest.approx(1 / 3)
    assert final["endings"] == pytest.approx(
        {"success": 1 / 3, "turn_limit": 1 / 3, "context_limit": 0.0, "other": 1 / 3}
    )
    assert final["trivial"]["avg"] == 1.0 and final["trivial"]["episodes"] == 1
    assert s["best_value"] == pytest.approx(0.25) and s["gap"] == pytest.approx(0.15)
    # pooled over seeds: the cut seed's step 0 joins the first evaluations (one non-trivial
    # and one trivial episode each); both scored 0, the enter-text ones 15 of 15 turns invalid
    assert arm["first"]["episodes"] == 2 and arm["first"]["seeds"] == 2
    assert arm["first"]["trivial"]["episodes"] == 2
    assert arm["first"]["valid_action_share"] == 0.0
    assert arm["first"]["endings"]["turn_limit"] == 1.0
    assert arm["first"]["trivial"]["endings"]["other"] == 1.0
    web_cpu = s["cpu_step0"][1]
    assert web_cpu["valid_action_share"] == pytest.approx(6 / 8)
    assert web_cpu["parse_failures_per_turn"] == pytest.approx(1 / 8)
    assert web_cpu["avg"] == pytest.approx(2 / 3) and web_cpu["reward_rate"] == pytest.approx(2 / 3)
    assert web_cpu["tokens_mean"] == 500 and web_cpu["tokens_max"] == 700
    assert web_cpu["non_trivial"] == {"episodes": 2, "avg": 0.5, "reward_rate": 0.5}
    assert "non_trivial" not in s["cpu_step0"][0]


def test_no_final_evaluation_keeps_step_0(root, tmp_path, capsys):
    s = fs.shortfall(root)["families"]["scienceworld"]
    assert s["best"] is None and s["gap"] is None and s["reached"] is False
    assert s["gap_from_step0"] == pytest.approx(0.10)  # a gain target: its whole value
    assert s["arms"][0]["first"]["avg"] == pytest.approx(0.03)
    assert fs.main(["--root", root, "--out", str(tmp_path / "out")]) == 0
    text = capsys.readouterr().out
    assert (tmp_path / "out" / "shortfall.md").read_text() == text
    assert (
        json.loads((tmp_path / "out" / "shortfall.json").read_text())["families"]["babyai"]["best"]
        == "a"
    )
    assert "+40.0 pts" in text and "+15.0 pts" in text and "+10.0 pts from step 0" in text


def test_gap_text_says_met_once_reached():
    import family_shortfall_table as table

    assert table._gap_text(0.333) == "+33.3 pts"
    assert table._gap_text(0.40 - 0.888) == "met (48.8 pts above)"
    assert table._gap_text(0.0) == "met (0.0 pts above)"


def test_an_arm_not_counted_is_never_best_and_says_why(root, monkeypatch, capsys):
    babyai = fs.ARMS[0]
    leaky = fs.Arm("babyai", "leaky", babyai.runs, "dev", counts=False, note="its order leaks")
    # first in the list and as good as "a": chosen if it counted (max keeps the first maximum)
    monkeypatch.setattr(fs, "ARMS", (leaky,) + tuple(fs.ARMS))
    s = fs.shortfall(root)["families"]["babyai"]
    assert s["best"] == "a"
    assert [a["arm"] for a in s["arms"]] == ["leaky", "a"]
    assert fs.main(["--root", root]) == 0
    text = capsys.readouterr().out
    assert "| BabyAI | leaky (dev; not counted: its order leaks) |" in text
    assert "| BabyAI | a (dev) |" in text


def test_the_best_arm_is_named_with_its_split(root, monkeypatch, capsys):
    # the same recipe on two splits: the dev arm (the BabyAI run, final 0.4) beats the test
    # arm (final 0.25) and its row, not the first arm of that name, heads the table
    web_test = next(a for a in fs.ARMS if a.family == "webnav")
    web_dev = fs.Arm("webnav", "w", fs.ARMS[0].runs, "dev")
    monkeypatch.setattr(fs, "ARMS", tuple(fs.ARMS) + (web_dev,))
    s = fs.shortfall(root)["families"]["webnav"]
    assert (s["best"], s["best_split"]) == ("w", "dev") and web_test.split == "test"
    assert s["best_value"] == pytest.approx(0.4)
    assert fs.main(["--root", root]) == 0
    text = capsys.readouterr().out
    assert "| web navigation | Avg@4 >= 0.40 on the non-trivial tasks | w (dev), final, 1 seed |" in (
        text
    )
