"""benchmarks/analysis/scaling_comparison.py on hand-made run folders (config.json,
metrics.jsonl.gz, eval_episodes.jsonl.gz, summary.json as a committed run folder has them):
the final scores, the paired differences and their t-interval, the per-phase and per-window
numbers, the endings and the levels, each against numbers worked out by hand here; and on the
committed equal-wall-time runs of results/table against docs/RESULTS.md's per-seed figures."""

from __future__ import annotations

import gzip
import json
import math
import os

import numpy as np
import pytest

from benchmarks.analysis import scaling_comparison as sc

T_975_2 = 4.302652729911275  # Student t, 0.975 quantile, 2 degrees of freedom (tables: 4.303)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Final evaluations, 2 tasks x 2 samples: {(arm, seed): (L1 rewards, L2 rewards)}; a reward of
# 1 is a success, 0 a failure.
FINAL = {
    ("scaling", 0): ((1, 1), (1, 0)), ("scaling", 1): ((1, 0), (1, 0)),
    ("scaling", 2): ((1, 1), (1, 1)),
    ("fixed6", 0): ((1, 1), (0, 0)), ("fixed6", 1): ((1, 0), (0, 0)),
    ("fixed6", 2): ((1, 0), (0, 0)),
    ("fixed20", 0): ((0, 0), (1, 0)), ("fixed20", 1): ((0, 0), (0, 0)),
    ("fixed20", 2): ((1, 0), (0, 0)),
}
#: how a failure ended, by arm, cycled over the arm's failed episodes in order
FAILED_STATUS = {"scaling": ("max_turns",), "fixed6": ("max_turns", "context_limit"),
                 "fixed20": ("context_limit", "done")}
#: turns of a successful episode, by arm
SUCCESS_TURNS = {"scaling": 3, "fixed6": 2, "fixed20": 5}
#: per run, per training step 1..4: flat groups (of 2 groups: 4 episodes, 2 samples a task)
FLAT = {
    ("scaling", 0): (2, 1, 1, 0), ("scaling", 1): (1, 1, 0, 0), ("scaling", 2): (2, 2, 1, 1),
    ("fixed6", 0): (1, 1, 2, 2), ("fixed6", 1): (0, 1, 2, 1), ("fixed6", 2): (1, 1, 1, 2),
    ("fixed20", 0): (0, 0, 1, 0), ("fixed20", 1): (1, 0, 0, 0), ("fixed20", 2): (0, 1, 0, 0),
}
HORIZONS = {"scaling": (2, 2, 4, 4), "fixed6": (2, 2, 2, 2), "fixed20": (4, 4, 4, 4)}


def _gz(path, rows):
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def _metrics(arm: str, seed: int) -> list[dict]:
    """Step 0 and the final step 4: evaluation rows; steps 1-4 training rows: 4 episodes,
    success rate = reward = step / 10 + seed / 100, mean turns = horizon - 0.5; entropy only
    where a group was trained (fixed20 logs none at all); status counts: scaling and fixed20
    1 context limit and 3 turn limits a step at horizon 4, else 4 turn limits; fixed6 none."""
    rows = [{"step": 0, "eval/avg@4": 0.0}]
    for step, (h, flat) in enumerate(zip(HORIZONS[arm], FLAT[arm, seed]), start=1):
        row = {"step": step, "train/horizon": float(h), "train/phase": 0.0,
               "rollout/episodes": 4.0, "rollout/flat_groups_skipped": float(flat),
               "rollout/mean_reward": step / 10 + seed / 100,
               "rollout/success_rate": step / 10 + seed / 100, "rollout/mean_turns": h - 0.5}
        if flat < 2 and arm != "fixed20":
            row["actor/entropy"] = 1.0 + step / 10 + seed
        if arm != "fixed6":
            row.update({"rollout/status/max_turns": 3.0, "rollout/status/context_limit": 1.0}
                       if h == 4 else {"rollout/status/max_turns": 4.0})
        rows.append(row)
    rows.append({"step": 4, "eval/avg@4": 0.0})
    return rows


def _episodes(arm: str, seed: int) -> list[dict]:
    """Step 0: every episode fails at the turn limit; step 4: :data:`FINAL`."""
    out, failed = [], 0
    for step in (0, 4):
        for level, rewards in zip(("L1", "L2"), FINAL[arm, seed]):
            for i, r in enumerate(rewards):
                r = r if step else 0
                if r:
                    status, turns = "done", SUCCESS_TURNS[arm]
                elif step:
                    status, turns = FAILED_STATUS[arm][failed % len(FAILED_STATUS[arm])], 4
                    failed += 1
                else:
                    status, turns = "max_turns", 4
                out.append({"env": "babyai", "task_id": f"BabyAI-{level}-v0/seed={seed}",
                            "group_id": 0, "sample_index": i, "step": step, "status": status,
                            "reward": float(r), "success": bool(r), "num_turns": turns,
                            "invalid_actions": 0})
    return out


def _run(root, arm: str, seed: int) -> str:
    path = os.path.join(root, f"babyai_eq_{arm}_s{seed}")
    os.makedirs(path)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"seed": seed, "train": {"samples_per_task": 2, "total_steps": 4},
                   "horizon": {"type": "scaling_inter" if arm == "scaling" else "fixed"}}, f)
    with open(os.path.join(path, "summary.json"), "w") as f:
        json.dump({"final_step": 4, "evals": {"4": {"k": 2}}}, f)
    _gz(os.path.join(path, "metrics.jsonl.gz"), _metrics(arm, seed))
    _gz(os.path.join(path, "eval_episodes.jsonl.gz"), _episodes(arm, seed))
    return path


@pytest.fixture
def arms(tmp_path):
    """Three seeds of each arm; the scaling arm names a fourth folder that does not exist."""
    out = {arm: [_run(tmp_path, arm, s) for s in range(3)]
           for arm in ("scaling", "fixed6", "fixed20")}
    out["scaling"].append(str(tmp_path / "babyai_eq_scaling_s3"))
    return out


def test_final_scores_and_paired_t_intervals(arms):
    report = sc.compare(arms, k=2)
    assert report["seeds_kept"] == [0, 1, 2] and list(report["left_out"]) == ["3"]
    assert report["equal_steps"] and report["trained_steps"]["fixed20"] == [4, 4, 4]
    # Avg@2 = mean over the two tasks of the mean of their two samples
    avg = {key: (np.mean(l1) + np.mean(l2)) / 2 for key, (l1, l2) in FINAL.items()}
    assert [f["after"]["avg_at_k"] for f in report["arms"]["scaling"]["final"]] == [
        0.75, 0.5, 1.0]
    for other, by_hand in (("fixed6", [0.25, 0.25, 0.75]), ("fixed20", [0.5, 0.5, 0.75])):
        d = report["differences"][f"scaling - {other}"]["avg_at_k"]
        assert d["per_seed"] == pytest.approx(by_hand)
        assert d["per_seed"] == pytest.approx([avg["scaling", s] - avg[other, s]
                                               for s in range(3)])
        half = T_975_2 * np.std(by_hand, ddof=1) / math.sqrt(3)
        assert d["mean"] == pytest.approx(np.mean(by_hand))
        assert (d["ci95_low"], d["ci95_high"]) == pytest.approx(
            (np.mean(by_hand) - half, np.mean(by_hand) + half))
    # scaling - fixed6: half = 4.3027 * sqrt(1/12) / sqrt(3) = 4.3027 / 6
    d = report["differences"]["scaling - fixed6"]["avg_at_k"]
    assert d["ci95_high"] == pytest.approx(5 / 12 + T_975_2 / 6)
    # Pass@2: a task passes when one of its samples scores; fixed20 seed 1 passes none
    assert report["differences"]["scaling - fixed20"]["pass_at_k"]["per_seed"] == [0.5, 1.0, 0.5]
    assert report["arms"]["fixed20"]["final"][0]["before"]["avg_at_k"] == 0.0


def test_one_seed_has_no_interval(arms):
    report = sc.compare({arm: runs[:1] for arm, runs in arms.items()}, k=2)
    d = report["differences"]["scaling - fixed20"]["avg_at_k"]
    assert d == {"per_seed": [0.5], "n_seeds": 1, "mean": 0.5, "interval": sc.NO_INTERVAL}
    assert "1 seed, no interval" in sc.markdown(report)


def test_phases_windows_and_missing_metrics(arms):
    report = sc.compare(arms, k=2)
    scaling, fixed6, fixed20 = (report["arms"][a] for a in ("scaling", "fixed6", "fixed20"))
    assert list(scaling["phases"]) == ["2", "4"] and list(fixed20["phases"]) == ["4"]
    p2, p4 = scaling["phases"]["2"], scaling["phases"]["4"]
    # flat groups over 3 seeds x 2 steps x 2 groups: (2+1)+(1+1)+(2+2) and (1+0)+(0+0)+(1+1)
    assert p2["flat_group_share"] == pytest.approx(9 / 12)
    assert p4["flat_group_share"] == pytest.approx(3 / 12)
    # entropy where a group trained: phase 2 = s0 step 2, s1 steps 1 and 2
    assert p2["entropy_steps"] == 3
    assert p2["entropy"] == pytest.approx((1.2 + 2.1 + 2.2) / 3)
    # train success: equal episodes a row, so the plain mean of step/10 + seed/100
    assert p4["train_success"] == pytest.approx(np.mean([s / 10 + d / 100
                                                         for s in (3, 4) for d in range(3)]))
    assert p4["turns_mean"] == pytest.approx(3.5)
    assert p4["turn_limit_share"] == pytest.approx(0.75)
    assert p4["context_limit_share"] == pytest.approx(0.25)
    assert p2["context_limit_share"] == 0.0 and p2["steps"] == [1, 2]
    # windows from scaling's phases: steps 1-2 and 3 on; fixed6 in steps 3-4 only flat groups
    # (2+2)+(2+1)+(1+2) of 12
    assert report["windows"] == ["1-2", "3+"]
    assert fixed6["windows"]["3+"]["flat_group_share"] == pytest.approx(10 / 12)
    assert fixed6["windows"]["1-2"]["flat_group_share"] == pytest.approx(5 / 12)
    assert fixed6["phases"]["2"]["context_limit_share"] is None
    assert fixed6["missing_metrics"] == ["rollout/status/*"]
    assert fixed20["missing_metrics"] == ["actor/entropy"]
    assert fixed20["phases"]["4"]["entropy"] is None
    assert fixed20["windows"]["1-2"]["context_limit_share"] == pytest.approx(0.25)
    assert scaling["curves"]["n_seeds"] == [3, 3, 3, 3]
    assert scaling["curves"]["train_reward"][0] == pytest.approx(0.1 + 0.01)


def test_endings_levels_and_outputs(arms, tmp_path):
    report = sc.compare(arms, k=2)
    scaling, fixed6, fixed20 = (report["arms"][a] for a in ("scaling", "fixed6", "fixed20"))
    # scaling: 9 of 12 final episodes succeed, its 3 failures at the turn limit
    assert scaling["endings"] == pytest.approx({"success": 9 / 12, "turn_limit": 3 / 12,
                                                "context_limit": 0.0, "other": 0.0})
    # fixed6: 4 successes; each run's failures alternate turn limit / context limit, from the
    # turn limit: seed 0 (2 failures) 1 + 1, seeds 1 and 2 (3 each) 2 + 1
    assert fixed6["endings"] == pytest.approx({"success": 4 / 12, "turn_limit": 5 / 12,
                                               "context_limit": 3 / 12, "other": 0.0})
    # fixed20: 2 successes; failures alternate context limit / ended by the environment:
    # seed 0 (3 failures) 2 + 1, seed 1 (4) 2 + 2, seed 2 (3) 2 + 1
    assert fixed20["endings"] == pytest.approx({"success": 2 / 12, "turn_limit": 0.0,
                                                "context_limit": 6 / 12, "other": 4 / 12})
    assert fixed20["turns_success_mean"] == 5.0
    assert scaling["levels"] == {"BabyAI-L1-v0": [5, 6], "BabyAI-L2-v0": [4, 6]}
    assert fixed6["levels"] == {"BabyAI-L1-v0": [4, 6], "BabyAI-L2-v0": [0, 6]}
    assert report["only_solved_by"] == {
        "scaling not fixed6": ["BabyAI-L2-v0"], "scaling not fixed20": [],
        "fixed6 not scaling": [], "fixed6 not fixed20": [],
        "fixed20 not scaling": [], "fixed20 not fixed6": ["BabyAI-L2-v0"]}
    out = tmp_path / "out"
    words = [f"{arm}={','.join(runs)}" for arm, runs in arms.items()]
    sc.main(["--k", "2", "--out", str(out)] + [w for word in words for w in ("--arm", word)])
    saved = json.loads((out / "scaling_comparison.json").read_text())
    assert saved["differences"]["scaling - fixed6"]["avg_at_k"]["per_seed"] == pytest.approx(
        [0.25, 0.25, 0.75])
    csv_rows = (out / "curves.csv").read_text().splitlines()
    assert csv_rows[0] == "arm,step,horizon,n_seeds,train_reward,train_success"
    assert len(csv_rows) == 1 + 3 * 4
    assert "| scaling - fixed6 | avg_at_k | +41.7 |" in (out / "scaling_comparison.md").read_text()


def test_arm_words():
    assert sc.parse_arms([["a=x,y", "b=z"], ["a=w"]]) == {"a": ["x", "y", "w"], "b": ["z"]}
    with pytest.raises(ValueError):
        sc.parse_arms([["a"]])


def test_committed_equal_wall_time_runs():
    """results/table's ScalingInter-RL / fixed 6 / fixed 20 runs: 360 s of training each (EQUAL
    WALL TIME, not equal steps); docs/RESULTS.md gives the per-seed success-rate differences
    -6.4, -0.2, -4.9 and +5.3, +15.8, +3.7 points and t-intervals [-11.9, +4.2], [-8.1, +24.6]."""
    t = os.path.join(REPO, "results", "table")
    runs = {arm: [os.path.join(t, f"babyai_{name}{s}") for s in ("", "_s1", "_s2")]
            for arm, name in (("scaling", "grpo"), ("fixed6", "fixed6"),
                              ("fixed20", "fixed20"))}
    report = sc.compare(runs, k=4)
    assert not report["equal_steps"]
    assert report["trained_steps"]["scaling"] == [31, 31, 34]
    for pair, per_seed, ci in (("scaling - fixed6", [-6.4, -0.2, -4.9], (-11.9, 4.2)),
                               ("scaling - fixed20", [5.3, 15.8, 3.7], (-8.1, 24.6))):
        d = report["differences"][pair]["success_rate"]
        assert [round(100 * x, 1) for x in d["per_seed"]] == per_seed
        assert (round(100 * d["ci95_low"], 1), round(100 * d["ci95_high"], 1)) == ci
    assert report["windows"] == ["1-15", "16-30", "31+"]
    assert list(report["arms"]["scaling"]["phases"]) == ["6", "13", "20"]


def test_windows_by_seed_hold_each_seeds_own_numbers(arms):
    report = sc.compare(arms, k=2)
    by_seed = {int(i): w for i, w in report["windows_by_seed"]["scaling"].items()}
    assert list(by_seed) == [0, 1, 2] and list(by_seed[0]) == ["1-2", "3+"]
    # seed 0, steps 1-2: flat (2, 1) of 2 groups a step; entropy only at step 2 (1 + 0.2 + 0)
    assert by_seed[0]["1-2"]["flat_group_share"] == pytest.approx(3 / 4)
    assert (by_seed[0]["1-2"]["entropy"], by_seed[0]["1-2"]["entropy_steps"]) == (
        pytest.approx(1.2), 1)
    # seed 1, steps 1-2: entropy at both (1.1 + 1, 1.2 + 1)
    assert by_seed[1]["1-2"]["entropy"] == pytest.approx(2.15)
    # seed 2, steps 3-4: flat (1, 1) -> entropy 1.3 + 2 and 1.4 + 2
    assert by_seed[2]["3+"]["entropy"] == pytest.approx(3.35)
    assert "| scaling | 0 | 1.200 / 0.750 |" in sc.markdown(report)
    # a seed left out of the table (fixed20's seed 2 unfinished) keeps the others' windows
    import shutil
    shutil.rmtree(arms["fixed20"][2])
    report = sc.compare(arms, k=2)
    assert report["seeds_kept"] == [0, 1]
    assert list(report["windows_by_seed"]["scaling"]) == ["0", "1", "2"]
    assert list(report["windows_by_seed"]["fixed20"]) == ["0", "1"]
    assert "| scaling | 2 | " in sc.markdown(report)


def test_shared_seed_differences_use_every_seed_a_pair_has(arms, tmp_path):
    """fixed20's seed 2 has no evaluation after training: the seeds kept for the whole table
    are 0 and 1, but scaling - fixed6 still pairs all three seeds (the by-hand values of the
    three-seed test) and scaling - fixed20 the two it has."""
    import shutil
    shutil.rmtree(arms["fixed20"][2])
    report = sc.compare(arms, k=2)
    assert report["seeds_kept"] == [0, 1]
    shared = report["differences_shared"]
    assert shared["scaling - fixed6"]["seeds"] == [0, 1, 2]
    by_hand = [0.25, 0.25, 0.75]
    d = shared["scaling - fixed6"]["avg_at_k"]
    assert d["per_seed"] == pytest.approx(by_hand)
    half = T_975_2 * np.std(by_hand, ddof=1) / math.sqrt(3)
    assert (d["ci95_low"], d["ci95_high"]) == pytest.approx(
        (np.mean(by_hand) - half, np.mean(by_hand) + half))
    assert report["differences"]["scaling - fixed6"]["avg_at_k"]["per_seed"] == pytest.approx(
        by_hand[:2])
    assert shared["scaling - fixed20"]["seeds"] == [0, 1]
    assert shared["scaling - fixed20"]["avg_at_k"]["per_seed"] == pytest.approx([0.5, 0.5])
    text = sc.markdown(report)
    assert "| scaling - fixed6 | [0, 1, 2] | avg_at_k | +41.7 |" in text
    assert "| scaling - fixed20 | [0, 1] |" not in text  # the same seeds as the table's


def test_no_shared_table_when_no_seed_is_left_out(arms):
    report = sc.compare({arm: runs[:3] for arm, runs in arms.items()}, k=2)
    assert report["differences_shared"]["scaling - fixed6"]["seeds"] == [0, 1, 2]
    assert "over the seeds both arms have" not in sc.markdown(report)
