"""The viewer's episode index (agentrl_jax/viewer/index.py) against a brute-force Python reference:
byte offsets, every filter, text search, sort and paging over 20,000 synthetic episodes;
incremental growth (half-written lines, appended rows), replaced files, the on-disk cache."""

from __future__ import annotations

import json
import os
import random
import shutil

import numpy as np
import pytest

from agentrl_jax.viewer.file_index import ERROR_STATUSES, FileIndex
from agentrl_jax.viewer.index import Query, RunIndex, trajectory_files
from agentrl_jax.viewer.synthetic import write_synthetic_run

SMALL = dict(prompt_words=3, obs_words=2)  # small lines: 20k episodes are quick to write


def reference_text(ep: dict) -> str:
    """What the search covers, written out independently of file_index.episode_text."""
    fields = [ep.get("env"), ep.get("task_id"), ep.get("episode_id"), ep.get("status"),
              ep.get("error")]
    msgs = [m["content"] for m in ep.get("messages", []) if m["role"] != "system"]
    return "\n".join([str(x or "") for x in fields] + msgs).lower()


def brute_force(episodes: list[dict], kinds: list[str], q: Query,
                texts: list[str] | None = None) -> list[int]:
    """Every position (in file order over all files) that ``q``'s filters select, in ``q``'s
    sort order, by plain Python (the page is a slice of it). ``texts``: reference_text of each
    episode, precomputed."""
    keep = []
    for i, ep in enumerate(episodes):
        status = ep.get("status") or "unknown"
        checks = [
            q.kinds is None or kinds[i] in q.kinds,
            q.envs is None or ep["env"] in q.envs,
            q.statuses is None or status in q.statuses,
            not q.task or q.task.lower() in ep["task_id"].lower(),
            q.step_min is None or ep["step"] >= q.step_min,
            q.step_max is None or ep["step"] <= q.step_max,
            q.reward_min is None or ep["reward"] >= q.reward_min,
            q.reward_max is None or ep["reward"] <= q.reward_max,
            q.turns_min is None or ep["num_turns"] >= q.turns_min,
            q.turns_max is None or ep["num_turns"] <= q.turns_max,
            q.success is None or bool(ep["success"]) == q.success,
            q.invalid is None or (ep["invalid_actions"] > 0) == q.invalid,
            q.error is None or (status in ERROR_STATUSES) == q.error,
            not q.search or q.search.lower() in (texts[i] if texts else reference_text(ep)),
        ]
        if all(checks):
            keep.append(i)
    if q.sort != "order":
        def key(i):
            ep = episodes[i]
            return {"step": ep["step"], "reward": ep["reward"], "num_turns": ep["num_turns"],
                    "invalid": ep["invalid_actions"], "n_tokens": len(ep["token_ids"]),
                    "n_trained": sum(ep["loss_mask"]), "task": ep["task_id"],
                    "env": ep["env"], "status": ep["status"], "success": int(ep["success"]),
                    "group_id": ep["group_id"]}[q.sort]
        # ties keep file order in both directions
        keep.sort(key=lambda i: (key(i), i))
        if q.descending:
            groups: dict = {}
            for i in keep:
                groups.setdefault(key(i), []).append(i)
            keep = [i for k in sorted(groups, reverse=True) for i in groups[k]]
    elif q.descending:
        keep.reverse()
    return keep


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("run"))
    write_synthetic_run(d, 20_000, eval_steps=(0, 40), eval_tasks=10, eval_samples=3, seed=3,
                        horizon=4, episode_kwargs=SMALL)
    files = trajectory_files(d)
    episodes, kinds, lines = [], [], []
    for path, kind, _ in files:
        with open(path, "rb") as f:
            offset = 0
            for raw in f:
                lines.append((path, offset, len(raw) - 1))
                episodes.append(json.loads(raw))
                kinds.append(kind)
                offset += len(raw)
    index = RunIndex(d, cache_dir=os.path.join(d, "cache"))
    index.update()
    texts = [reference_text(ep) for ep in episodes]
    return d, index, episodes, kinds, lines, texts


def test_offsets_and_records(run):
    d, index, episodes, kinds, lines, _ = run
    t = index.table()
    assert len(t) == len(episodes) == 20_000 + 2 * 30
    pos = 0
    for fi, f in enumerate(index.files):
        rows = f.rows()
        ref = [x for x in lines if x[0] == f.path]
        assert len(rows) == len(ref)
        assert rows["offset"].tolist() == [x[1] for x in ref]
        assert rows["length"].tolist() == [x[2] for x in ref]
        for row in (0, 1, len(ref) // 2, len(ref) - 1):
            assert f.read(row) == episodes[pos + row]
        pos += len(ref)
    # index fields against the records
    c = t.columns
    sample = random.Random(0).sample(range(len(episodes)), 300)
    for i in sample:
        ep = episodes[i]
        s = index.summary(t, i)
        assert (s["env"], s["task_id"], s["status"], s["step"], s["num_turns"], s["invalid"],
                s["success"], s["group_id"]) == (ep["env"], ep["task_id"], ep["status"],
                                                 ep["step"], ep["num_turns"],
                                                 ep["invalid_actions"], ep["success"],
                                                 ep["group_id"])
        assert s["reward"] == pytest.approx(ep["reward"])
        assert s["n_tokens"] == len(ep["token_ids"]) and s["n_trained"] == sum(ep["loss_mask"])
        assert s["parse_failures"] == ep["parse_failures"]
        assert s["context_tokens"] == len(ep["token_ids"]) - ep["chunk_starts"][-1]
        assert s["kind"] == kinds[i]
    assert int(c["file"][-1]) == 1 and int(c["row"][-1]) == 59


def random_queries(episodes: list[dict], n: int, seed: int) -> list[Query]:
    rng = random.Random(seed)
    tasks = [ep["task_id"] for ep in episodes]
    words = ["locked", "door", "not a valid action", "synthetic failure", "craft 4",
             "invalid response", "ep-0", "xyz-nothing", "GoToObj", "textcraft/1"]
    statuses = ["done", "max_turns", "context_limit", "env_error", "engine_error"]
    out = []
    for _ in range(n):
        kw: dict = {}
        if rng.random() < 0.3:
            kw["kinds"] = tuple(rng.sample(["train", "eval"], rng.randint(1, 2)))
        if rng.random() < 0.3:
            kw["envs"] = (rng.choice(["babyai", "textcraft"]),)
        if rng.random() < 0.25:
            kw["task"] = rng.choice(tasks)[rng.randint(0, 8):][:rng.randint(3, 12)]
        if rng.random() < 0.35:
            kw["statuses"] = tuple(rng.sample(statuses, rng.randint(1, 3)))
        if rng.random() < 0.3:
            lo = rng.randint(-1, 300)
            kw["step_min"], kw["step_max"] = lo, lo + rng.randint(0, 400)
        if rng.random() < 0.25:
            kw["reward_min"] = rng.choice([0.0, 0.1, 0.5])
        if rng.random() < 0.2:
            kw["reward_max"] = rng.choice([0.0, 0.6, 1.0])
        if rng.random() < 0.3:
            kw["turns_min"] = rng.randint(0, 4)
        if rng.random() < 0.2:
            kw["turns_max"] = rng.randint(2, 6)
        for name in ("success", "invalid", "error"):
            if rng.random() < 0.15:
                kw[name] = rng.random() < 0.5
        if rng.random() < 0.3:
            kw["search"] = rng.choice(words)
        kw["sort"] = rng.choice(["order", "step", "reward", "num_turns", "invalid", "n_tokens",
                                 "n_trained", "task", "env", "status", "success", "group_id"])
        kw["descending"] = rng.random() < 0.5
        kw["limit"] = rng.choice([1, 10, 50, 500])
        kw["offset"] = rng.choice([0, 0, 7, 100, 5000, 19_990, 30_000])
        out.append(Query(**kw))
    return out


def test_queries_match_brute_force(run):
    d, index, episodes, kinds, _, texts = run
    t = index.table()
    queries = random_queries(episodes, 60, seed=1) + [
        Query(), Query(sort="reward", descending=True, limit=500),
        Query(search="NOT A VALID ACTION", statuses=("max_turns",), offset=3),
        Query(task="seed=1", sort="task", offset=20), Query(descending=True, offset=19_999),
        Query(error=True, sort="status"), Query(search="xyz-nothing")]
    matched = pages = 0
    for q in queries:
        page = index.query(q)
        every = brute_force(episodes, kinds, q, texts)
        want = every[q.offset:q.offset + q.limit]
        assert page.positions.tolist() == want, q
        assert page.total == len(every)
        assert [(int(f), int(r)) for f, r in zip(page.files, page.rows)] == [
            (int(t.columns["file"][i]), int(t.columns["row"][i])) for i in want]
        matched += bool(every)
        pages += bool(want)
    # the queries are not trivially empty
    assert matched >= 0.75 * len(queries) and pages >= 0.4 * len(queries)


def test_page_rows_read_by_offset(run):
    d, index, episodes, _, _, _ = run
    page = index.query(Query(statuses=("done",), sort="reward", descending=True, limit=20))
    for pos, f, r in zip(page.positions, page.files, page.rows):
        assert index.read(int(f), int(r)) == episodes[int(pos)]


def _append(path: str, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def test_incremental_growth_partial_lines_and_replacement(tmp_path):
    src = tmp_path / "src"
    write_synthetic_run(str(src), 300, eval_steps=(), seed=5, episode_kwargs=SMALL)
    raw = (src / "trajectories_train.jsonl").read_bytes().splitlines(keepends=True)
    path = str(tmp_path / "trajectories_train.jsonl")
    open(path, "wb").close()
    f = FileIndex(path, "train", cache_dir=str(tmp_path / "cache"))
    assert f.update() == 0 and f.n == 0
    _append(path, b"".join(raw[:100]) + raw[100][:50])  # 100 lines + half of one
    assert f.update() == 100 and f.indexed_bytes == sum(len(x) for x in raw[:100])
    _append(path, raw[100][50:] + b"not json\n" + b"".join(raw[101:200]))
    assert f.update() == 100 and f.bad_lines == 1
    assert f.read(100) == json.loads(raw[100]) and f.read(199) == json.loads(raw[199])
    # a restart reads only the new tail from the cache
    g = FileIndex(path, "train", cache_dir=str(tmp_path / "cache"))
    assert g.n == 200 and g.update() == 0
    _append(path, b"".join(raw[200:]))
    assert g.update() == 100 and g.n == 300
    assert np.array_equal(g.rows()["offset"][:200], f.rows()["offset"][:200])
    # a crash after appending rows but before meta.json: the extra rows are dropped on load
    with open(os.path.join(g.dir, "rows.bin"), "ab") as fh:
        fh.write(b"\x01" * 1000)
    h = FileIndex(path, "train", cache_dir=str(tmp_path / "cache"))
    assert h.n == 300 and h.read(299) == json.loads(raw[299])
    # the file is replaced by a different one (same size or not): rebuilt
    tmp = path + ".new"
    with open(tmp, "wb") as fh:
        fh.write(b"".join(raw[150:]))
    os.replace(tmp, path)
    assert h.update() == 150 and h.n == 150 and h.read(0) == json.loads(raw[150])
    # truncated: rebuilt
    with open(path, "wb") as fh:
        fh.write(b"".join(raw[:10]))
    assert h.update() == 10 and h.n == 10
    for x in (f, g, h):
        x.close()


def test_run_index_picks_up_new_files_and_search_follows_growth(tmp_path):
    d = str(tmp_path / "run")
    write_synthetic_run(d, 200, eval_steps=(0,), seed=7, episode_kwargs=SMALL)
    evals = os.path.join(d, "trajectories_eval.jsonl")
    shutil.move(evals, evals + ".later")
    ri = RunIndex(d, cache_dir=None)
    ri.update()
    assert [f.kind for f in ri.files] == ["train"] and len(ri.table()) == 200
    before = ri.query(Query(search="textcraft", limit=500)).total
    shutil.move(evals + ".later", evals)
    assert ri.rescan() and ri.update() == 16
    assert [f.kind for f in ri.files] == ["train", "eval"] and len(ri.table()) == 216
    after = ri.query(Query(search="textcraft", limit=500)).total
    assert after == before + 8  # the 8 textcraft evaluation episodes
    ri.close()


def test_launch_eval_output_files_get_their_step(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / "final.json").write_text(json.dumps({"step": 40, "avg_at_k": 0.5}))
    (d / "final_trajectories.jsonl").write_text(json.dumps(
        {"env": "babyai", "task_id": "t", "status": "done", "reward": 1.0}) + "\n")
    (d / "notes.jsonl").write_text("{}\n")
    files = trajectory_files(str(d))
    assert files == [(str(d / "final_trajectories.jsonl"), "eval", 40)]
    ri = RunIndex(str(d))
    ri.update()
    assert ri.summary(ri.table(), 0)["step"] == 40
