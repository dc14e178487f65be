"""Committed run folders keep their large JSON-lines files gzip-compressed (``X.jsonl.gz``) and
every reader takes either form: ``agentrl_common.jsonl_files.find_run_file`` / ``read_run_file``,
``store_compact`` (what ``learning_report.py --out`` and so ``jobs.sh --results`` write), the
viewer, the run report and the analysis scripts.

References: hand-made records, Python's ``gzip`` module (``gzip.open`` to write the compressed
copies the readers are given, ``gzip.decompress`` to check what a compressed file holds).
"""

from __future__ import annotations

import gzip
import json
import os
import sys

import pytest

from agentrl_common.jsonl_files import (COMPRESS_ABOVE_BYTES, find_run_file, read_run_file,
                                        run_file, store_compact)

ANALYSIS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "benchmarks", "analysis")
sys.path.insert(0, ANALYSIS)

RECORDS = [{"step": 0, "env": "babyai", "task_id": "t0", "reward": 0.0, "success": False},
           {"step": 0, "env": "babyai", "task_id": "t1", "reward": 0.75, "success": True},
           {"step": 3, "env": "babyai", "task_id": "t0", "reward": 0.5, "success": True},
           {"step": 3, "env": "babyai", "task_id": "t1", "reward": 1.0, "success": True}]


def _text(records: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def _plain(folder, name: str, records: list[dict]) -> str:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        f.write(_text(records))
    return path


def _gz(folder, name: str, records: list[dict]) -> str:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name + ".gz")
    with gzip.open(path, "wt") as f:
        f.write(_text(records))
    return path


# --------------------------------------------------------------------------- the helper
def test_plain_and_gzip_copies_read_the_same_records(tmp_path):
    _plain(tmp_path / "plain", "eval_episodes.jsonl", RECORDS)
    packed = _gz(tmp_path / "packed", "eval_episodes.jsonl", RECORDS)
    assert read_run_file(str(tmp_path / "plain"), "eval_episodes.jsonl") == RECORDS
    assert read_run_file(str(tmp_path / "packed"), "eval_episodes.jsonl") == RECORDS
    assert find_run_file(str(tmp_path / "packed"), "eval_episodes.jsonl") == packed
    assert run_file(str(tmp_path / "packed"), "eval_episodes.jsonl") == packed


def test_the_plain_file_wins_when_both_exist(tmp_path):
    plain = _plain(tmp_path, "metrics.jsonl", RECORDS[:1])
    _gz(tmp_path, "metrics.jsonl", RECORDS)
    assert find_run_file(str(tmp_path), "metrics.jsonl") == plain
    assert read_run_file(str(tmp_path), "metrics.jsonl") == RECORDS[:1]


def test_neither_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError) as error:
        read_run_file(str(tmp_path), "metrics.jsonl")
    message = str(error.value)
    assert os.path.join(str(tmp_path), "metrics.jsonl") in message
    assert os.path.join(str(tmp_path), "metrics.jsonl.gz") in message
    assert find_run_file(str(tmp_path), "metrics.jsonl") is None
    assert read_run_file(str(tmp_path), "metrics.jsonl", missing_ok=True) == []


# --------------------------------------------------------------------------- storing
def _big_records(n: int = 2000) -> list[dict]:
    return [{"step": i // 100, "env": "babyai", "task_id": f"t{i % 100}", "reward": (i % 7) / 7,
             "success": bool(i % 3)} for i in range(n)]


def test_store_compact_compresses_a_large_file_losslessly_and_deterministically(tmp_path):
    records = _big_records()
    path = _plain(tmp_path / "a", "eval_episodes.jsonl", records)
    original = open(path, "rb").read()
    assert len(original) > COMPRESS_ABOVE_BYTES
    kept = store_compact(path)
    assert kept == path + ".gz" and not os.path.exists(path)
    packed = open(kept, "rb").read()
    assert gzip.decompress(packed) == original and len(packed) < len(original) / 3
    again = store_compact(_plain(tmp_path / "b", "eval_episodes.jsonl", records))
    assert open(again, "rb").read() == packed  # no time stamp, no name: the same bytes


def test_store_compact_keeps_a_small_file_plain_and_drops_a_stale_copy(tmp_path):
    _gz(tmp_path, "metrics.jsonl", _big_records())  # an earlier, larger run's file
    path = _plain(tmp_path, "metrics.jsonl", RECORDS)
    assert store_compact(path) == path
    assert sorted(os.listdir(tmp_path)) == ["metrics.jsonl"]
    assert read_run_file(str(tmp_path), "metrics.jsonl") == RECORDS


def test_collect_stores_large_files_compressed_and_reads_back_the_same(tmp_path):
    import learning_report

    run = tmp_path / "run"
    episodes = [{**{k: e.get(k) for k in learning_report.EPISODE_FIELDS},
                 "parse_failures": i % 3, "context_tokens": 50 + i}
                for i, e in enumerate(_big_records())]
    _plain(run, "trajectories_eval.jsonl", episodes)
    metrics = [{"step": s, "rollout/mean_reward": s / 10, "pad": "x" * 400} for s in range(300)]
    _plain(run, "metrics.jsonl", metrics)
    (run / "summary.json").write_text("{}")
    dest = tmp_path / "results" / "run"
    assert learning_report.collect_run(str(run), str(dest)) == len(episodes)
    assert sorted(os.listdir(dest)) == ["eval_episodes.jsonl.gz", "metrics.jsonl.gz",
                                        "summary.json"]
    assert read_run_file(str(dest), "metrics.jsonl") == metrics
    assert read_run_file(str(dest), "eval_episodes.jsonl") == episodes
    assert (learning_report.eval_success_by_task(str(dest))
            == learning_report.eval_success_by_task(str(run)))
    # collected again from the committed copy (e.g. --out of learning_report on results/)
    again = tmp_path / "again"
    learning_report.collect_run(str(dest), str(again))
    for name in ("metrics.jsonl.gz", "eval_episodes.jsonl.gz"):
        assert (again / name).read_bytes() == (dest / name).read_bytes()


# --------------------------------------------------------------------------- the readers
def test_the_readers_take_a_compressed_run_folder(tmp_path):
    import arm_comparison
    import compare_runs
    from agentrl_jax.training.outputs import report
    from agentrl_jax.viewer.index import trajectory_files
    from agentrl_jax.viewer.runs import MetricsLog

    metrics = [{"step": 1, "rollout/mean_reward": 0.25}, {"step": 2, "rollout/mean_reward": 0.5}]
    plain, packed = tmp_path / "plain", tmp_path / "packed"
    for folder, write in ((plain, _plain), (packed, _gz)):
        write(folder, "metrics.jsonl", metrics)
        write(folder, "eval_episodes.jsonl", RECORDS)
    assert compare_runs.read_rows(str(packed)) == metrics
    assert arm_comparison.evaluations(str(packed), 2) == arm_comparison.evaluations(str(plain), 2)
    assert report.eval_success_by_task(str(packed)) == report.eval_success_by_task(str(plain))
    assert report.eval_success_by_task(str(packed))  # two evaluations, not nothing
    assert MetricsLog(str(packed / "metrics.jsonl")).rows() == metrics
    assert trajectory_files(str(packed)) == [(str(packed / "eval_episodes.jsonl.gz"), "eval", -1)]
    _plain(packed, "eval_episodes.jsonl", RECORDS)  # both forms: the plain file, listed once
    assert trajectory_files(str(packed)) == [(str(packed / "eval_episodes.jsonl"), "eval", -1)]
