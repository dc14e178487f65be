"""benchmarks/speed/prompt_intake.py: the old and new paths take the same prompts to the same
ids and the same sharing decisions, and the report's medians are its runs' medians."""

import statistics

import numpy as np

from benchmarks.speed import prompt_intake


def test_old_and_new_paths_agree_on_ids_and_on_which_prompts_share():
    # HEAD exists in any clone (a shallow one too); before 2026-12-06 it returned a list
    old_check = prompt_intake.load_old_check("HEAD")
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, prompt_intake.VOCAB, size=n).tolist() for n in (1, 7, 300)]
    prompts.append(list(prompts[2]))  # an equal prompt: both keys must match it
    for ids in prompts:
        old = old_check(ids, prompt_intake.VOCAB, None)
        new = prompt_intake.check_input_ids(ids, prompt_intake.VOCAB, None)
        assert new.dtype == np.int32 and new.tolist() == [int(t) for t in old] == ids
    old_keys = [prompt_intake.old_intake(old_check, ids) for ids in prompts]
    new_keys = [prompt_intake.new_intake(ids) for ids in prompts]
    same = [[a == b for b in old_keys] for a in old_keys]
    assert same == [[a == b for b in new_keys] for a in new_keys]
    assert new_keys[2] == new_keys[3] and new_keys[1] != new_keys[2]


def test_the_report_holds_each_lengths_medians(tmp_path):
    out = prompt_intake.main(["--old-rev", "HEAD", "--lengths", "4,64", "--calls", "3",
                              "--repeats", "3", "--json", str(tmp_path / "p.json")])
    assert [r["tokens"] for r in out["rows"]] == [4, 64]
    for r in out["rows"]:
        assert r["old_us"] == statistics.median(r["old_runs_us"]) > 0
        assert r["new_us"] == statistics.median(r["new_runs_us"]) > 0
        assert r["ratio"] == r["old_us"] / r["new_us"]
    assert (tmp_path / "p.json").exists()
