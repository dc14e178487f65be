"""benchmarks/analysis/results_table.py: the table stage on hand-made runs (no training: the runs'
evaluation files are written here), the job plan, and the marked block of a document."""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks", "analysis"))
import results_table  # noqa: E402
from test_seed_stats import write_run  # noqa: E402


def test_table_from_runs_with_seeds_and_missing_families(tmp_path):
    res = tmp_path / "results"
    write_run(res / "babyai_base", {0: {"1": [0, 0], "2": [0, 1]}})                  # 25
    write_run(res / "babyai_sft_grpo", {0: {"1": [1, 1], "2": [0, 1]},           # 75 -> 100
                                        9: {"1": [1, 1], "2": [1, 1]}})
    write_run(res / "babyai_sft_grpo_s1", {0: {"1": [1, 0], "2": [0, 1]},        # 50 -> 50
                                           8: {"1": [1, 1], "2": [0, 0]}})
    (res / "babyai_sft").mkdir()  # no evaluation episodes: not a run of the table
    doc = tmp_path / "RESULTS.md"
    doc.write_text(f"# Results\n\n{results_table.BEGIN}\nold\n{results_table.END}\n\n## History\n")
    results_table.main(["--stage", "table", "--results", str(res), "--doc", str(doc),
                        "--draws", "2000"])
    t = json.load(open(res / "table.json"))
    sft, sft_rl = t["cells"]["BabyAI"]["SFT"], t["cells"]["BabyAI"]["SFT+RL"]
    assert sft["n_seeds"] == 2 and sft["mean"] == pytest.approx((0.75 + 0.5) / 2)
    assert sft_rl["mean"] == pytest.approx((1.0 + 0.5) / 2) and sft_rl["std"] == pytest.approx(
        0.5 ** 0.5 / 2)
    assert t["cells"]["BabyAI"]["base"]["single_seed"]
    assert t["cells"]["BabyAI"]["RL only"] == {"missing": "no runs yet"}
    d = t["comparisons"]["BabyAI"]["SFT+GRPO - SFT"]
    assert d["per_pair"] == {"0:0": 0.25, "1:1": 0.0}
    assert t["comparisons"]["BabyAI"]["SFT - base"]["pairs"] == [[0, 0], [1, 0]]
    text = doc.read_text()
    assert "old" not in text and text.endswith("## History\n")
    assert "| ScienceWorld | no runs yet | no runs yet | no runs yet | no runs yet |" in text
    assert "| BabyAI | 25.0 [" in text and "(1 seed†)" in text and "(2 seeds)" in text


def test_partial_scores_give_three_tables_that_say_their_metric(tmp_path):
    """ScienceWorld-like partial scores: Avg@k is the mean score, Pass@k counts a task with any
    positive score, the success rate only completions (score 1); each table is titled."""
    res = tmp_path / "results"
    write_run(res / "sciworld_sft_grpo", {0: {"1": [0.2, 0.0], "2": [1, 0.4]},
                                          9: {"1": [0.5, 0.3], "2": [0.0, 0.0]}})
    results_table.main(["--stage", "table", "--results", str(res), "--draws", "200"])
    t = json.load(open(res / "table.json"))
    assert t["metric"] == "avg" and t["k"] == 2
    sft = t["cells"]["ScienceWorld"]["SFT"]  # step 0: task means 0.1 and 0.7
    assert sft["mean"] == pytest.approx(0.4)
    assert t["cells"]["ScienceWorld"]["SFT+RL"]["mean"] == pytest.approx((0.4 + 0.0) / 2)
    assert t["other_metrics"]["pass"]["ScienceWorld"]["SFT"]["mean"] == 1.0
    assert t["other_metrics"]["pass"]["ScienceWorld"]["SFT+RL"]["mean"] == 0.5
    assert t["other_metrics"]["success"]["ScienceWorld"]["SFT"]["mean"] == pytest.approx(0.25)
    assert t["other_metrics"]["success"]["ScienceWorld"]["SFT+RL"]["mean"] == 0.0
    text = (res / "table.md").read_text()
    assert "**Avg@2 (mean task score)**, held-out, in points:" in text
    assert "**Pass@2 (a task passes when any of its 2 episodes scores > 0)**" in text
    assert "**success rate (the environment's completion flag)**" in text
    assert "| ScienceWorld | no runs yet | 40.0 [" in text  # the Avg@2 row comes first


def test_dry_run_plans_every_seed_and_writes_nothing(tmp_path, capfd):
    out = tmp_path / "runs"
    assert results_table.main(["--stage", "jobs", "--dry-run", "--seeds", "0,2",
                               "--out", str(out), "--results", str(tmp_path / "res")]) == 0
    plan = capfd.readouterr().out
    for job in ("babyai_sft_grpo", "textcraft_sft_gigpo_s2", "babyai_fixed6_s2",
                "babyai_fixed20", "babyai_gigpo_s2", "babyai_base"):
        assert f"plan: {job} " in plan
    assert "--config.seed=2" in plan
    # then the ScienceWorld and deep-search rows (benchmarks/jobs/families_table.txt, seeds 0-2)
    for job in ("record_deepsearch", "record_scienceworld", "deepsearch_sft_grpo",
                "deepsearch_grpo_s2", "sciworld_sft_s1", "sciworld_sft_grpo_s2", "sciworld_grpo"):
        assert f"plan: {job} " in plan
    assert "--config.sft.data=" + str(out / "experts") in plan
    # then the web-navigation row (benchmarks/jobs/webnav_table.txt: one command per seed
    # through launch/sft_rl.py, and RL only)
    for job in ("webnav_sft_grpo", "webnav_sft_grpo_s2", "webnav_grpo", "webnav_grpo_s1"):
        assert f"plan: {job} " in plan
    assert "launch/sft_rl.py --sft_config experiments/webnav.py:sft_gpu" in plan
    assert not out.exists() and not (tmp_path / "res").exists()
    assert results_table.main(["--stage", "jobs", "--dry-run", "--seeds", "0", "--family-jobs",
                               "", "--web-jobs", "", "--out", str(out),
                               "--results", str(tmp_path / "res")]) == 0
    plan = capfd.readouterr().out
    assert "plan: sciworld_grpo " not in plan and "plan: webnav_grpo " not in plan
    with pytest.raises(SystemExit):
        results_table.main(["--stage", "table", "--alias", "nodir"])


def test_a_run_cut_before_its_final_evaluation_is_not_counted_as_trained(tmp_path):
    """A training run with only its step-0 evaluation (cut off by its time cap) fills the
    columns that read step 0 (SFT), and leaves SFT+RL and the RL comparison missing instead of
    reporting the untrained policy as the trained one (a ScienceWorld cell once did)."""
    res = tmp_path / "results"
    write_run(res / "sciworld_sft_grpo", {0: {"1": [1, 0], "2": [0, 1]}})          # 50, no final
    write_run(res / "babyai_sft_grpo", {0: {"1": [0, 0], "2": [0, 1]},             # 25 -> 75
                                        5: {"1": [1, 1], "2": [0, 1]}})
    results_table.main(["--stage", "table", "--results", str(res), "--draws", "500"])
    t = json.load(open(res / "table.json"))
    assert t["cells"]["ScienceWorld"]["SFT"]["mean"] == pytest.approx(0.5)
    assert t["cells"]["ScienceWorld"]["SFT+RL"] == {
        "missing": "`sciworld_sft_grpo` has no evaluation after training"}
    assert "SFT+GRPO - SFT" not in t["comparisons"]["ScienceWorld"]
    assert t["cells"]["BabyAI"]["SFT+RL"]["mean"] == pytest.approx(0.75)
    assert t["comparisons"]["BabyAI"]["SFT+GRPO - SFT"]["per_pair"] == {"0:0": 0.5}


def _started_from(run_dir, model_name: str) -> None:
    (run_dir / "config.json").write_text(json.dumps({"model": {"name": model_name}}))


def test_gigpo_vs_grpo_pairs_a_seed_only_when_both_runs_started_from_one_policy(tmp_path):
    """Seed 1's GiGPO run started from a re-made SFT policy (``babyai_sft_s1b``), its GRPO run
    from ``babyai_sft_s1``: GiGPO - GRPO and the twice-evaluated control keep seed 0 alone and
    name seed 1; GiGPO - SFT (each run against its own start) keeps both seeds. Where the
    folders were (``/root/x`` vs ``runs/t``) does not matter, the SFT run's name does."""
    res = tmp_path / "results"
    runs = {  # name: (started from, {step: {task: successes}})
        "babyai_sft_grpo": ("/root/x/babyai_sft/model",  # 25 -> 50
                            {0: {"1": [1, 0], "2": [0, 0]}, 9: {"1": [1, 1], "2": [0, 0]}}),
        "babyai_sft_gigpo": ("runs/t/babyai_sft/model",  # 50 -> 100
                             {0: {"1": [1, 0], "2": [0, 1]}, 9: {"1": [1, 1], "2": [1, 1]}}),
        "babyai_sft_grpo_s1": ("runs/t/babyai_sft_s1/model", {0: {"1": [1, 1], "2": [1, 1]},
                                                              9: {"1": [1, 1], "2": [1, 1]}}),
        "babyai_sft_gigpo_s1": ("runs/t/babyai_sft_s1b/model", {0: {"1": [0, 0], "2": [0, 0]},
                                                                9: {"1": [1, 0], "2": [0, 0]}}),
    }
    for name, (start, steps) in runs.items():
        write_run(res / name, steps)
        _started_from(res / name, start)
    results_table.main(["--stage", "table", "--results", str(res), "--draws", "500"])
    t = json.load(open(res / "table.json"))["comparisons"]["BabyAI"]
    why = ("seed 1 left out: its runs started from different policies "
           "(babyai_sft_s1b/model vs babyai_sft_s1/model)")
    vs = t["SFT+GiGPO - SFT+GRPO"]
    assert vs["per_pair"] == {"0:0": pytest.approx(1.0 - 0.5)} and vs["unpaired"] == [why]
    control = t["control: the SFT policy evaluated twice"]  # step 0 of GiGPO - step 0 of GRPO
    assert control["per_pair"] == {"0:0": pytest.approx(0.5 - 0.25)}
    assert control["unpaired"] == [why]
    own = t["SFT+GiGPO - SFT"]
    assert own["per_pair"] == {"0:0": pytest.approx(0.5), "1:1": pytest.approx(0.25)}
    assert "unpaired" not in own
    text = (res / "table.md").read_text()
    assert why in text
    # t over seeds of GiGPO - SFT, per seed +50 and +25 points: mean 37.5, std 25 / sqrt(2),
    # half width t_{0.975, 1} (12.7062) x std / sqrt(2) = 158.83 points
    row = next(line for line in text.splitlines() if line.startswith("| SFT+GiGPO - SFT |"))
    assert row.endswith("| +37.5 [-121.3, +196.3] | +50.0, +25.0 |")


def test_web_jobs_need_a_browser(monkeypatch, tmp_path):
    """``no_browser`` names what is missing (the web jobs are then not started), and is empty
    where ``MINIWOB_CHROME_BINARY`` / ``MINIWOB_CHROMEDRIVER`` name existing files."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("MINIWOB_CHROME_BINARY", str(tmp_path / "nothing"))
    monkeypatch.delenv("MINIWOB_CHROMEDRIVER", raising=False)
    assert results_table.no_browser().startswith("Chromium not found")
    for name in ("chromium", "chromedriver"):
        (tmp_path / name).write_text("")
    monkeypatch.setenv("MINIWOB_CHROME_BINARY", str(tmp_path / "chromium"))
    assert results_table.no_browser().startswith("chromedriver not found")
    monkeypatch.setenv("MINIWOB_CHROMEDRIVER", str(tmp_path / "chromedriver"))
    assert results_table.no_browser() == ""
