"""Run folders that stay small: the training log keeps ``train.trajectory_share`` of each step's
groups (whole groups, chosen without looking at the episodes), as gzip members that a killed
run leaves readable and a resumed run appends to; the viewer and the readers take ``.jsonl.gz``.

References: Python's ``gzip`` module (``gzip.decompress`` / ``gzip.open``) for what a file
holds, and hand counts for the share.
"""

from __future__ import annotations

import collections
import gzip
import json
import os
import random
import sys

import pytest

from agentrl_common.jsonl_files import (append_lines, is_whole, iter_records, read_records,
                                        trajectory_files)
from agentrl_jax.agent.trajectory import Trajectory
from agentrl_jax.training.outputs.trajectory_log import TrajectoryLog, kept_groups


def _rows(step: int, n: int) -> list[bytes]:
    return [json.dumps({"step": step, "i": i, "pad": "x" * 300}).encode() for i in range(n)]


# --------------------------------------------------------------------------- the share
@pytest.mark.parametrize("share,groups,kept", [(0.25, 40, 10), (0.25, 16, 4), (0.5, 7, 4),
                                               (0.25, 2, 1), (0.01, 3, 1), (1.0, 5, 5),
                                               (0.0, 5, 0)])
def test_kept_group_count_matches_the_share(share, groups, kept):
    ids = [g for g in range(groups) for _ in range(3)]  # 3 samples a group
    chosen = kept_groups(7, ids, share)
    assert len(chosen) == kept and chosen <= set(ids)
    assert kept_groups(7, reversed(ids), share) == chosen  # a function of (step, ids) only


def test_the_choice_is_unbiased_over_steps():
    """Each of 8 groups is kept in ~25% of 2000 steps (binomial sd 1%), and the kept groups
    differ from step to step."""
    counts = collections.Counter()
    chosen = set()
    for step in range(2000):
        kept = kept_groups(step, range(8), 0.25)
        counts.update(kept)
        chosen.add(tuple(sorted(kept)))
    assert all(abs(counts[g] / 2000 - 0.25) < 0.05 for g in range(8)), counts
    assert len(chosen) > 20


def _episodes(step: int, groups: int, samples: int) -> list[Trajectory]:
    return [Trajectory(env="babyai", task_id=f"t{g}", group_id=g, sample_index=i,
                       token_ids=[step, g, i], reward=float(i))
            for g in range(groups) for i in range(samples)]


def test_log_keeps_whole_groups_of_training_and_every_evaluation_episode(tmp_path):
    log = TrajectoryLog(str(tmp_path), train_share=0.25, compress=True)
    for step in (1, 2, 3):
        assert log.write(step, _episodes(step, 8, 4), "train") == 8  # 2 groups x 4 samples
    assert log.write(3, _episodes(3, 8, 4), "eval") == 32
    train = tmp_path / "trajectories_train.jsonl.gz"
    with gzip.open(train, "rt") as f:  # the standard library reads the whole file
        rows = [json.loads(line) for line in f]
    assert [r["step"] for r in rows] == [1] * 8 + [2] * 8 + [3] * 8
    for step in (1, 2, 3):
        groups = collections.Counter(r["group_id"] for r in rows if r["step"] == step)
        assert set(groups) == kept_groups(step, range(8), 0.25)
        assert set(groups.values()) == {4}  # whole groups
    with gzip.open(tmp_path / "trajectories_eval.jsonl.gz", "rt") as f:
        assert sum(1 for _ in f) == 32
    plain = TrajectoryLog(str(tmp_path / "plain"), train_share=1.0, compress=False)
    os.makedirs(plain.workdir)
    plain.write(1, _episodes(1, 2, 2), "train")
    assert [json.loads(line)["group_id"] for line in
            open(tmp_path / "plain" / "trajectories_train.jsonl")] == [0, 0, 1, 1]
    assert [os.path.basename(p) for p in trajectory_files(str(tmp_path))] == [
        "trajectories_eval.jsonl.gz", "trajectories_train.jsonl.gz"]


def test_the_trainer_logs_the_share_and_its_metrics_count_every_episode(tmp_path):
    """The trainer's loop (fakes for the learner, backend and pool: 8 tasks x 2 samples a
    step): a quarter of the groups in the file, every episode in the update and metrics."""
    from test_trainer_failed_step import (FailingPool, RecordingBackend, RecordingLearner,
                                          fake_loop_config, run_fake_loop)

    learner = RecordingLearner()
    c = fake_loop_config(2, tasks_per_step=8, samples_per_task=2, trajectory_share=0.25)
    run_fake_loop(c, tmp_path, learner, RecordingBackend(), FailingPool(failing=set()))
    rows = read_records(str(tmp_path / "trajectories_train.jsonl.gz"))
    assert collections.Counter(r["step"] for r in rows) == {1: 4, 2: 4}  # 2 groups x 2
    assert not (tmp_path / "trajectories_train.jsonl").exists()
    episodes = [m for _, m in learner.writer.rows]
    assert [m["rollout/episodes"] for m in episodes] == [16, 16], episodes[0].keys()


# --------------------------------------------------------------------------- kill and resume
def test_a_cut_off_gzip_file_yields_its_complete_records(tmp_path):
    path = str(tmp_path / "t.jsonl.gz")
    sizes = []
    for step in (1, 2, 3):
        append_lines(path, _rows(step, 20))
        sizes.append(os.path.getsize(path))  # each step: one member, flushed
    whole = open(path, "rb").read()
    first_two = sizes[1]
    assert gzip.decompress(whole[:sizes[0]]) == b"".join(r + b"\n" for r in _rows(1, 20))
    reference = [json.loads(r) for r in _rows(1, 20) + _rows(2, 20)]
    for cut in (first_two, first_two + 10, first_two + (len(whole) - first_two) // 2,
                len(whole) - 3):
        with open(path, "wb") as f:
            f.write(whole[:cut])
        got = list(iter_records(path))
        assert got[:40] == reference, cut  # the whole members, in order
        assert got[40:] == [json.loads(r) for r in _rows(3, 20)][:len(got) - 40]  # a prefix
        assert is_whole(path) == (cut == first_two)
    with open(path, "wb") as f:  # garbage after whole members is not read as records
        f.write(whole[:first_two] + b"not gzip at all\n")
    assert list(iter_records(path)) == reference


def test_resume_rewinds_a_cut_off_member_then_appends(tmp_path):
    """Killed while writing step 3 after checkpoint 2: the rewind leaves steps 1-2 as whole
    members, and the resumed run's step 3 and 4 follow them (gzip.open reads every row)."""
    from agentrl_jax.training.outputs.runlog import rewind_run_logs

    log = TrajectoryLog(str(tmp_path), train_share=1.0)
    for step in (1, 2, 3):
        log.write(step, _episodes(step, 2, 2), "train")
    path = log.path("train")
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[:-7])  # step 3's member cut short
    dropped = rewind_run_logs(str(tmp_path), 2, metrics=False)
    assert dropped == {"trajectories_train.jsonl.gz": 4}  # step 3's rows (only its trailer cut)
    assert is_whole(path)
    for step in (3, 4):
        log.write(step, _episodes(step, 2, 2), "train")
    with gzip.open(path, "rt") as f:
        steps = [json.loads(line)["step"] for line in f]
    assert steps == [1] * 4 + [2] * 4 + [3] * 4 + [4] * 4
    assert rewind_run_logs(str(tmp_path), 4, metrics=False) == {}  # nothing to drop
    assert open(path, "rb").read()[:len(data) - 200] == data[:len(data) - 200]


# --------------------------------------------------------------------------- the viewer
def _gzip_run(src: str, dst: str) -> None:
    """``dst``: ``src``'s run with its training log as gzip members of one step each."""
    os.makedirs(dst)
    rows = [line.rstrip(b"\n") for line in open(os.path.join(src, "trajectories_train.jsonl"),
                                                "rb")]
    by_step: dict[int, list[bytes]] = collections.defaultdict(list)
    for r in rows:
        by_step[json.loads(r)["step"]].append(r)
    for step in sorted(by_step):
        append_lines(os.path.join(dst, "trajectories_train.jsonl.gz"), by_step[step])
    for name in ("trajectories_eval.jsonl", "metrics.jsonl", "config.json", "summary.json"):
        with open(os.path.join(src, name), "rb") as f, open(os.path.join(dst, name), "wb") as g:
            g.write(f.read())


def test_the_viewer_indexes_a_compressed_run(tmp_path):
    from agentrl_jax.viewer.index import Query, RunIndex
    from agentrl_jax.viewer.synthetic import write_synthetic_run

    src = write_synthetic_run(str(tmp_path / "plain"), train_episodes=160, group_size=4)
    dst = str(tmp_path / "gz")
    _gzip_run(src, dst)
    plain, packed = RunIndex(src), RunIndex(dst, cache_dir=str(tmp_path / "cache"))
    plain.update()
    packed.update()
    q = Query(sort="reward", descending=True, limit=1000)
    a, b = plain.query(q), packed.query(q)
    assert a.total == b.total == 160 + 16
    random.seed(0)
    for i in random.sample(range(a.total), 25):
        assert packed.read(int(b.files[i]), int(b.rows[i])) == plain.read(int(a.files[i]),
                                                                          int(a.rows[i]))
    # a member being written waits; once whole it is indexed; a restart reads the cache
    gz = os.path.join(dst, "trajectories_train.jsonl.gz")
    extra = [json.dumps({"env": "babyai", "task_id": "new", "step": 99, "reward": 5.0}).encode()]
    member = gzip.compress(extra[0] + b"\n", mtime=0)
    with open(gz, "ab") as f:
        f.write(member[:10])
    assert packed.update() == 0
    with open(gz, "ab") as f:
        f.write(member[10:])
    assert packed.update() == 1
    top = packed.query(Query(sort="reward", descending=True, limit=1))
    assert packed.read(int(top.files[0]), int(top.rows[0]))["task_id"] == "new"
    packed.close()
    again = RunIndex(dst, cache_dir=str(tmp_path / "cache"))
    again.update()
    assert again.query(Query()).total == 160 + 16 + 1
    again.close()
    plain.close()


def _scored_eval_episodes(step: int) -> list[Trajectory]:
    """Two tasks x 3 episodes whose three metrics differ: scores 0 / 0.5 / 1.5 (clipped to 1),
    the completion flag only on t1's last, and an ``env_error`` episode (left out)."""
    eps = _episodes(step, 2, 3)
    for t in eps:
        t.reward = [0.0, 0.5, 1.5][t.sample_index]
        t.success = t.task_id == "t1" and t.sample_index == 2
    eps[0].status = "env_error"  # t0's first: not an outcome of the policy
    return eps


#: what eval_metrics.task_values gives for ``_scored_eval_episodes`` (worked by hand)
_BY_METRIC = {"avg": {"babyai/t0": [0.5, 1.0], "babyai/t1": [0.0, 0.5, 1.0]},
              "success": {"babyai/t0": [0.0, 0.0], "babyai/t1": [0.0, 0.0, 1.0]},
              "pass": {"babyai/t0": [1.0], "babyai/t1": [1.0]}}


@pytest.mark.parametrize("metric", sorted(_BY_METRIC))
def test_report_reads_compressed_evaluations(tmp_path, metric):
    """The run report's per-task values (``training/outputs/report.py``, through ``eval_metrics``) from
    a ``.jsonl.gz`` evaluation log, every metric, error episodes left out."""
    from agentrl_jax.training.outputs.report import eval_success_by_task

    log = TrajectoryLog(str(tmp_path), compress=True)
    log.write(5, _scored_eval_episodes(5), "eval")
    assert trajectory_files(str(tmp_path)) == [str(tmp_path / "trajectories_eval.jsonl.gz")]
    assert eval_success_by_task(str(tmp_path), metric) == {5: _BY_METRIC[metric]}


def test_learning_report_and_results_table_read_compressed_evaluations(tmp_path):
    """``benchmarks/analysis/learning_report.py`` (which ``results_table.py`` calls for its runs) finds a
    run's ``.jsonl.gz`` evaluation log, scores it like a plain one, and ``--collect`` writes its
    small ``eval_episodes.jsonl`` from it."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks", "analysis"))
    import learning_report

    gz_run, plain_run = tmp_path / "gz", tmp_path / "plain"
    gz_run.mkdir()
    plain_run.mkdir()
    TrajectoryLog(str(gz_run), compress=True).write(5, _scored_eval_episodes(5), "eval")
    TrajectoryLog(str(plain_run), compress=False).write(5, _scored_eval_episodes(5), "eval")
    assert learning_report.eval_episode_files(str(gz_run)) == [
        str(gz_run / "trajectories_eval.jsonl.gz")]
    for metric, expected in _BY_METRIC.items():
        assert learning_report.eval_success_by_task(str(gz_run), metric) == {5: expected}
        assert learning_report.eval_success_by_task(str(plain_run), metric) == {5: expected}
    assert learning_report.collect_run(str(gz_run), str(tmp_path / "small")) == 6
    small = read_records(str(tmp_path / "small" / "eval_episodes.jsonl"))
    assert [(e["task_id"], e["reward"], e["status"]) for e in small] == [
        (t.task_id, t.reward, t.status) for t in _scored_eval_episodes(5)]
