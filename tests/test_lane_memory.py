"""benchmarks/gpu/lane_memory.py: job lines parsed as jobs.sh reads them, and a TextCraft lane's
KV cache against the hand count that the 2026-12-05 four-lane H100 failure showed
(``2 x 30 layers x 256 slots x 3 KV heads x 4,096 tokens x 64 x 2 bytes``)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks", "gpu"))
import lane_memory  # noqa: E402

RUN = ("python3 launch/run.py --config experiments/textcraft.py:choice_shuffled_gpu "
       "--workdir {out}/x --config.seed=3 --config.train.total_steps=45")
TEXTCRAFT_KV = 2 * 30 * 256 * 3 * 4096 * 64 * 2


def test_job_lines_as_jobs_sh_reads_them():
    assert lane_memory.parse_job("# a comment") is None
    assert lane_memory.parse_job("   ") is None
    assert lane_memory.parse_job("sft 300 0 python3 launch/sft.py --config x.py") is None
    job = lane_memory.parse_job(f"tc_s3 800 2 after=a,b mem=0.3 resume {RUN}")
    assert job == {"name": "tc_s3", "mem": 0.3,
                   "spec": "experiments/textcraft.py:choice_shuffled_gpu",
                   "overrides": {"seed": "3", "train.total_steps": "45"}}
    assert lane_memory.parse_job(f"tc 800 0 {RUN}")["mem"] is None


def test_overrides_reach_the_config_at_any_depth():
    config = lane_memory.job_config("experiments/textcraft.py:choice_shuffled_gpu",
                                    {"seed": "3", "rollout.max_context": "2048",
                                     "rollout.engine_dtype": "float32"})
    assert (config.seed, config.rollout.max_context, config.rollout.engine_dtype) == (
        3, 2048, "float32")


def test_a_textcraft_lane_by_hand():
    need = lane_memory.kv_need(lane_memory.job_config(
        "experiments/textcraft.py:choice_shuffled_gpu", {}))
    assert need == {"slots": 256, "context": 4096, "dtype": "bfloat16", "kv_bytes": TEXTCRAFT_KV}
    half = lane_memory.kv_need(lane_memory.job_config(
        "experiments/textcraft.py:choice_shuffled_gpu", {"rollout.max_batch": "128"}))
    assert (half["slots"], half["kv_bytes"]) == (128, TEXTCRAFT_KV // 2)


def test_four_lanes_of_an_h100_do_not_fit_two_do(tmp_path, capsys):
    jobs = tmp_path / "jobs.txt"
    jobs.write_text(f"# header\ntc_a 800 0 {RUN}\ntc_b 800 1 mem=0.45 {RUN}\n")
    assert lane_memory.main(["--jobs", str(jobs), "--gpu-gib", "79.6", "--per-gpu", "4"]) == 1
    out = capsys.readouterr().out
    assert "| tc_a | 256 x 4096 (bfloat16) | 22.5 GiB | 17.9 GiB | -4.6 GiB (does not fit) |" in out
    assert "| tc_b | 256 x 4096 (bfloat16) | 22.5 GiB | 35.8 GiB | +13.3 GiB |" in out
    assert lane_memory.main(["--jobs", str(jobs), "--gpu-gib", "79.6", "--per-gpu", "2",
                             "--only", "tc_a"]) == 0
    assert "tc_b" not in capsys.readouterr().out
