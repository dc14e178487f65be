"""The viewer's HTTP API (agentrl_jax/viewer/server.py): answers checked against the index and
the files, every bad parameter a 4xx with a message (never a 5xx, also under random garbage),
the episode view (turns, invalid actions, token view, the GRPO advantage against the learner's
own estimator), before / after, the live status, the self-contained export and its CLI."""

from __future__ import annotations

import json
import os
import random
import re
from urllib.parse import quote

import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer

from agentrl_jax.agent.parsing import INVALID_FORMAT_FEEDBACK
from agentrl_jax.viewer import Query, Viewer
from agentrl_jax.viewer.__main__ import main as viewer_main
from agentrl_jax.viewer.export import export_data_rows
from agentrl_jax.viewer.server import make_app
from agentrl_jax.viewer.record import context_tokens, count_field
from agentrl_jax.viewer.synthetic import write_synthetic_run
from viewer_eval_counts import WITH_COUNTS, WITHOUT_COUNTS, write_eval_counts_run


@pytest.fixture
def run_dir(tmp_path):
    return write_synthetic_run(str(tmp_path / "run"), 400, eval_steps=(0, 10), eval_tasks=6,
                               eval_samples=2, seed=11, horizon=5)


@pytest.fixture
async def client(run_dir, tmp_path):
    viewer = Viewer([run_dir], cache_dir=str(tmp_path / "cache"), load_tokenizer=False)
    viewer.update()
    async with TestClient(TestServer(make_app(viewer, index_in_background=False))) as c:
        yield c, viewer
    viewer.close()


def read_episodes(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


async def get(c: TestClient, url: str) -> tuple[int, dict]:
    r = await c.get(url)
    return r.status, await r.json()


async def test_pages_match_the_index_and_the_files(client, run_dir):
    c, viewer = client
    status, body = await get(c, "/api/episodes?run=0&status=done,max_turns&sort=reward&order=desc"
                                "&limit=7&offset=3&kind=train&q=Action")
    assert status == 200
    want = viewer.runs[0].index.query(Query(
        kinds=("train",), statuses=("done", "max_turns"), sort="reward", descending=True,
        limit=7, offset=3, search="Action"))
    assert [(r["file"], r["row"]) for r in body["rows"]] == list(zip(want.files.tolist(),
                                                                     want.rows.tolist()))
    assert body["total"] == want.total > 10
    train = read_episodes(os.path.join(run_dir, "trajectories_train.jsonl"))
    for r in body["rows"]:  # each row's fields and preview come from its own line
        ep = train[r["row"]]
        assert (r["task_id"], r["status"], r["num_turns"]) == (ep["task_id"], ep["status"],
                                                               ep["num_turns"])
        replies = [m["content"] for m in ep["messages"] if m["role"] == "assistant"]
        assert r["last_reply"] == (replies[-1][:79] + "\u2026" if len(replies[-1]) > 80
                                   else replies[-1])
    status, runs = await get(c, "/api/runs")
    assert status == 200 and runs["runs"][0]["config"]["learner"]["advantage_estimator"] == "grpo"
    assert [e["step"] for e in runs["runs"][0]["evals"]] == [0, 10]
    status, facets = await get(c, "/api/facets?run=0")
    assert facets["episodes"] == 400 + 24 and facets["kinds"] == ["eval", "train"]
    status, metrics = await get(c, "/api/metrics?run=0")
    reward = next(p for p in metrics["curves"] if p["title"] == "train reward")
    rows = read_episodes(os.path.join(run_dir, "metrics.jsonl"))
    assert reward["values"] == [r["rollout/mean_reward"] for r in rows
                                if "rollout/mean_reward" in r]


BAD = [  # (url, status, words the message must contain)
    ("/api/episodes", 400, "run is required"),
    ("/api/episodes?run=abc", 400, "run='abc'"),
    ("/api/episodes?run=-1", 400, "run=-1"),
    ("/api/episodes?run=7", 404, "unknown run 7"),
    ("/api/episodes?run=99999999999999999999999", 400, "not an integer"),
    ("/api/episodes?run=" + "9" * 5000, 400, "not an integer"),
    ("/api/episodes?run=0&limit=0", 400, "limit=0"),
    ("/api/episodes?run=0&limit=501", 400, "limit=501"),
    ("/api/episodes?run=0&limit=1e3", 400, "limit='1e3'"),
    ("/api/episodes?run=0&offset=-5", 400, "offset=-5"),
    ("/api/episodes?run=0&offset=" + "1" * 30, 400, "offset"),
    ("/api/episodes?run=0&offset=1000000000", 400, "past the 424 matching"),
    ("/api/episodes?run=0&offset=425", 400, "past the 424"),
    ("/api/episodes?run=0&step_min=abc", 400, "step_min"),
    ("/api/episodes?run=0&step_min=5&step_max=2", 400, "larger than step_max"),
    ("/api/episodes?run=0&reward_min=inf", 400, "finite"),
    ("/api/episodes?run=0&reward_max=1e400", 400, "finite"),
    ("/api/episodes?run=0&reward_min=2&reward_max=1", 400, "larger than reward_max"),
    ("/api/episodes?run=0&success=maybe", 400, "boolean"),
    ("/api/episodes?run=0&status=done,bogus", 400, "bogus"),
    ("/api/episodes?run=0&kind=test", 400, "kind"),
    ("/api/episodes?run=0&sort=random", 400, "sort"),
    ("/api/episodes?run=0&order=up", 400, "order"),
    ("/api/episodes?run=0&q=%00x", 400, "NUL"),
    ("/api/episodes?run=0&q=" + "x" * 501, 400, "longer than"),
    ("/api/episodes?run=0&colour=red", 400, "unknown parameter(s) colour"),
    ("/api/episodes?run=0&limit=1&limit=2", 400, "more than once"),
    ("/api/episode?run=0&file=0", 400, "row is required"),
    ("/api/episode?run=0&file=5&row=0", 404, "no file 5"),
    ("/api/episode?run=0&file=0&row=400", 404, "no row 400"),
    ("/api/episode?run=0&file=0&row=4294967296", 400, "out of range"),
    ("/api/episode?run=0&file=x&row=0", 400, "file='x'"),
    ("/api/episode?run=0&file=0&row=0&tokens=perhaps", 400, "boolean"),
    ("/api/compare?run=3", 404, "unknown run"),
    ("/api/metrics?run=0&x=1", 400, "unknown parameter"),
    ("/api/status?verbose=1", 400, "unknown parameter"),
    ("/api/export?run=0&limit=2000", 400, "limit=2000"),
    ("/api/nothing", 404, "Not Found"),
    ("/static/../server.py", 404, ""),
    ("/?debug=1", 400, "unknown parameter"),
]


async def test_bad_requests_are_4xx_with_a_message(client):
    c, _ = client
    wrong = []
    for url, status, words in BAD:
        r = await c.get(url)
        body = await r.json()
        if r.status != status or words not in body.get("error", ""):
            wrong.append((url[:80], r.status, body))
    assert not wrong


async def test_non_finite_numbers_in_run_files_are_null(client, run_dir):
    c, _ = client
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    summary["first_reward"] = float("nan")
    summary["evals"]["0"]["mean_reward"] = float("inf")
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
        json.dump(summary, f)  # Python writes NaN / Infinity literals
    r = await c.get("/api/runs")
    assert r.status == 200
    text = await r.text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text)["runs"][0]["summary"]["first_reward"] is None


async def test_random_garbage_never_gives_a_5xx(client):
    c, _ = client
    rng = random.Random(0)
    names = ["run", "file", "row", "tokens", "kind", "env", "task", "status", "step_min",
             "step_max", "reward_min", "reward_max", "turns_min", "turns_max", "success",
             "invalid", "error", "q", "sort", "order", "offset", "limit", "zzz"]
    values = ["", "0", "1", "-1", "abc", "1e9", "nan", "-inf", "9" * 40, "0x10", " 3", "\u00e9",
              "%00", "true", "done", "eval", "desc", "reward", "2147483648", "1.5", ",", ";"]
    seen = set()
    for _ in range(250):
        path = rng.choice(["/api/episodes", "/api/episode", "/api/facets", "/api/compare",
                           "/api/metrics", "/api/export"])
        params = {n: rng.choice(values) for n in rng.sample(names, rng.randint(0, 5))}
        if rng.random() < 0.7:
            params["run"] = "0"
        qs = "&".join(f"{quote(k)}={v if v == '%00' else quote(v)}" for k, v in params.items())
        r = await c.get(f"{path}?{qs}")
        seen.add(r.status)
        assert r.status < 500, (path, params, await r.text())
        if r.status >= 400:
            assert (await r.json())["error"]
    assert 200 in seen and 400 in seen


def grpo_reference(rewards: list[float], eps: float = 1e-6) -> np.ndarray:
    r = np.asarray(rewards, np.float64)
    if len(r) < 2:
        return np.zeros(len(r))
    return (r - r.mean()) / (r.std(ddof=1) + eps)


async def test_episode_view_turns_tokens_and_advantage(client, run_dir):
    c, _ = client
    train = read_episodes(os.path.join(run_dir, "trajectories_train.jsonl"))
    # an episode with both kinds of invalid turn, from a group with different rewards
    row = next(i for i, ep in enumerate(train)
               if ep["status"] in ("done", "max_turns")
               and INVALID_FORMAT_FEEDBACK in [m["content"] for m in ep["messages"]]
               and any("is not a valid action here" in m["content"] or
                       m["content"].startswith("Could not execute") for m in ep["messages"])
               and len({e["reward"] for e in train if e["step"] == ep["step"]
                        and e["group_id"] == ep["group_id"]}) > 1)
    ep = train[row]
    status, view = await get(c, f"/api/episode?run=0&file=0&row={row}")
    assert status == 200
    msgs = ep["messages"]
    assert view["system"] == msgs[0]["content"] and view["first_observation"] == msgs[1]["content"]
    assert [t["reply"] for t in view["turns"]] == [m["content"] for m in msgs
                                                   if m["role"] == "assistant"]
    for t in view["turns"]:
        after = msgs[2 + 2 * t["index"] + 1]["content"] if 2 + 2 * t["index"] + 1 < len(msgs) \
            else None
        assert t["observation"] == after
        assert t["invalid"] == (t["reply"].strip() == "Action:")  # empty action: unparsable
        assert t["invalid"] == (after == INVALID_FORMAT_FEEDBACK) or after is None
        assert t["rejected"] == (after is not None and ("is not a valid action here" in after
                                                         or after.startswith("Could not execute")))
        assert t["reward"] == ep["turn_rewards"][t["index"]]
    assert view["format_invalid"] + view["env_rejected"] + view["unlocated_invalid"] == \
        ep["invalid_actions"]
    tk = view["tokens"]
    assert tk["ids"] == ep["token_ids"] and tk["mask"] == ep["loss_mask"]
    assert tk["strings"] is None and "off" in tk["tokenizer_error"]
    assert all((lp is None) == (m == 0) for lp, m in zip(tk["logprob"], tk["mask"]))
    assert [lp for lp in tk["logprob"] if lp is not None] == pytest.approx(
        [lp for lp, m in zip(ep["logprobs"], ep["loss_mask"]) if m])
    # the advantage: GRPO over the group's non-error members, as the learner computes it
    members = [e for e in train if e["step"] == ep["step"] and e["group_id"] == ep["group_id"]
               and e["status"] not in ("env_error", "engine_error")]
    want = grpo_reference([e["reward"] for e in members])[
        [e["episode_id"] for e in members].index(ep["episode_id"])]
    from agentrl_jax.algorithms import compute_advantages  # the learner's estimator
    out = compute_advantages("grpo", rewards=np.array([e["reward"] for e in members], np.float32),
                             loss_mask=np.ones((len(members), 1), np.float32),
                             group_ids=np.zeros(len(members), np.int32))
    learner_adv = float(np.asarray(out.advantages)[[e["episode_id"] for e in members].index(
        ep["episode_id"]), 0])
    got = {a for a in tk["advantage"] if a is not None}
    assert len(got) == 1 and got.pop() == pytest.approx(want, abs=1e-9) == \
        pytest.approx(learner_adv, abs=1e-5)
    assert all((a is None) == (m == 0) for a, m in zip(tk["advantage"], tk["mask"]))
    names = {ch["name"]: ch["ok"] for ch in view["checks"]}
    assert names == {"prompt untrained": True, "one trained span per turn": True,
                     "trained spans are the replies": None}


async def test_mask_check_catches_a_trained_observation(client, run_dir, tmp_path):
    c, viewer = client
    path = os.path.join(run_dir, "trajectories_train.jsonl")
    train = read_episodes(path)
    row = next(i for i, ep in enumerate(train) if ep["num_turns"] >= 2
               and ep["status"] == "max_turns")
    bad = dict(train[row])
    mask = list(bad["loss_mask"])
    turn = bad["turn_ids"]
    obs = [i for i in range(len(mask)) if turn[i] == 0 and not mask[i]]
    mask[obs[-1]] = 1  # an observation token of turn 0 marked as trained
    bad["loss_mask"] = mask
    with open(path, "a") as f:
        f.write(json.dumps(bad) + "\n")
    viewer.update()
    status, view = await get(c, f"/api/episode?run=0&file=0&row={len(train)}")
    checks = {ch["name"]: ch for ch in view["checks"]}
    assert checks["prompt untrained"]["ok"] is True
    assert checks["one trained span per turn"]["ok"] is False
    assert "turns [0]" in checks["one trained span per turn"]["detail"]


async def test_eval_episode_has_no_advantage_and_compare_matches_files(client, run_dir):
    c, _ = client
    status, view = await get(c, "/api/episode?run=0&file=1&row=0")
    assert view["kind"] == "eval" and set(view["tokens"]["advantage"]) == {None}
    assert "not trained" in view["tokens"]["advantage_note"]
    status, cmp = await get(c, "/api/compare?run=0")
    assert status == 200 and (cmp["before"], cmp["after"]) == (0, 10)
    evals = read_episodes(os.path.join(run_dir, "trajectories_eval.jsonl"))
    assert len(cmp["tasks"]) == 6
    for t in cmp["tasks"]:
        for side, step in (("before", 0), ("after", 10)):
            eps = [e for e in evals if e["step"] == step and e["task_id"] == t["task_id"]]
            ok = [e for e in eps if e["status"] not in ("env_error", "engine_error")]
            want = np.mean([e["success"] for e in ok]) if ok else None  # completion flag
            assert t[side]["success_rate"] == pytest.approx(want)
            assert [e["sample"] for e in t[side]["episodes"]] == [0, 1]


async def test_status_follows_a_growing_run(client, run_dir):
    c, viewer = client
    _, before = await get(c, "/api/status")
    src = read_episodes(os.path.join(run_dir, "trajectories_train.jsonl"))[:5]
    with open(os.path.join(run_dir, "trajectories_train.jsonl"), "a") as f:
        for ep in src:
            f.write(json.dumps({**ep, "step": 99}) + "\n")
        f.write(json.dumps(src[0])[:40])  # a half-written line is not counted yet
    with open(os.path.join(run_dir, "metrics.jsonl"), "a") as f:
        f.write(json.dumps({"step": 99, "rollout/mean_reward": 0.5}) + "\n")
    viewer.update()
    _, after = await get(c, "/api/status")
    b, a = before["runs"][0], after["runs"][0]
    assert a["episodes"] == b["episodes"] + 5 and a["last_step"] == 99
    assert a["metrics_rows"] == b["metrics_rows"] + 1
    assert a["files"]["trajectories_train.jsonl"] > b["files"]["trajectories_train.jsonl"]
    _, page = await get(c, "/api/episodes?run=0&step_min=99")
    assert page["total"] == 5


def _no_external_references(html: str) -> None:
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html), "external resource"
    links = re.findall(r"<link[^>]*>", html)
    assert all('href="data:' in x for x in links), links  # only the inline (empty) icon
    assert "@import" not in html and "url(" not in html


async def test_export_endpoint_and_cli(client, run_dir, tmp_path):
    c, viewer = client
    r = await c.get("/api/export?run=0&status=done&sort=reward&order=desc&limit=5")
    assert r.status == 200 and "attachment" in r.headers["Content-Disposition"]
    html = await r.text()
    page = viewer.runs[0].index.query(Query(statuses=("done",), sort="reward", descending=True,
                                            limit=5))
    assert [(x["file"], x["row"]) for x in export_data_rows(html)] == list(
        zip(page.files.tolist(), page.rows.tolist()))
    _no_external_references(html)
    assert 'id="viewer-export"' in html and "function tokensHtml" in html
    # the command line, with filters
    out = tmp_path / "x" / "export.html"
    assert viewer_main([run_dir, "--export", str(out), "--kind", "train", "--invalid", "yes",
                        "--turns-min", "3", "--limit", "4", "--no-tokenizer", "--no-cache",
                        "--sort", "num_turns", "--desc"]) == 0
    rows = export_data_rows(out.read_text())
    train = read_episodes(os.path.join(run_dir, "trajectories_train.jsonl"))
    want = sorted((i for i, e in enumerate(train) if e["invalid_actions"] > 0
                   and e["num_turns"] >= 3), key=lambda i: (-train[i]["num_turns"], i))[:4]
    assert [x["row"] for x in rows] == want
    _no_external_references(out.read_text())
    assert viewer_main([run_dir, "--export", str(out), "--limit", "5000", "--no-cache"]) == 2


@pytest.mark.parametrize("env_name,task,actions", [
    ("babyai", "BabyAI-GoToObj-v0/seed=1",
     ["fly away", "turn left", "go to purple door 7", "move forward", "pick up the moon",
      "turn right"]),
    ("textcraft", "dark_oak_sign",
     ["fly away", "inventory", "craft 1 diamond using 3 stick", "get 1 oak log", "dance",
      "inventory"]),
])
def test_rejections_of_the_real_environments_are_located(env_name, task, actions):
    """The viewer flags exactly the turns the real environment servers call invalid."""
    from agentrl_jax.viewer.episode import parser_for, turns

    if env_name == "babyai":
        from environments.babyai.env import BabyAIEnv as Env
    else:
        from environments.textcraft.env import TextCraftEnv as Env
    env = Env()
    first = env.reset(task)
    messages = [{"role": "system", "content": "instructions"},
                {"role": "user", "content": first.observation}]
    flags = []
    for a in actions:
        step = env.step(a)
        messages += [{"role": "assistant", "content": f"Action: {a}"},
                     {"role": "user", "content": step.observation}]
        flags.append(bool(step.info["invalid_action"]))
    assert any(flags) and not all(flags)
    view = turns({"messages": messages, "invalid_actions": sum(flags)}, parser_for("react"))
    assert [t["rejected"] for t in view["turns"]] == flags
    assert view["unlocated_invalid"] == 0 and view["format_invalid"] == 0


# ------------------------------------------------------------------ the evaluation counts
async def test_eval_counts_are_shown_and_unknown_when_missing(tmp_path, capsys):
    """Two small evaluation records, one with ``parse_failures`` / ``context_tokens`` and one
    from before them: the list, the episode view, ``--print`` and the export show the first's
    values and the second's as unknown (``null`` in the API, never 0)."""
    run = write_eval_counts_run(str(tmp_path))
    viewer = Viewer([run], cache_dir=str(tmp_path / "cache"), load_tokenizer=False)
    viewer.update()
    async with TestClient(TestServer(make_app(viewer, index_in_background=False))) as c:
        status, page = await get(c, "/api/episodes?run=0")
        assert status == 200 and page["total"] == 2
        assert [(r["task_id"], r["parse_failures"], r["context_tokens"]) for r in page["rows"]] \
            == [("GoToObj-3", 3, 1187), ("craft-9", None, None)]
        status, ep = await get(c, "/api/episode?run=0&file=0&row=0")
        assert status == 200 and ep["malformed"] == {} and ep["kind"] == "eval"
        assert (ep["fields"]["parse_failures"], ep["fields"]["context_tokens"]) == (3, 1187)
        assert ep["fields"]["invalid_actions"] == 4 and ep["has_messages"] is False
        status, ep = await get(c, "/api/episode?run=0&file=0&row=1")
        assert status == 200 and ep["malformed"] == {}
        assert "parse_failures" not in ep["fields"] and ep["fields"]["context_tokens"] is None
    viewer.close()
    assert viewer_main([run, "--print", "--no-cache", "--no-tokenizer"]) == 0
    printed = capsys.readouterr().out
    assert "parse failures 3  context tokens 1187" in printed
    assert "parse failures unknown  context tokens unknown" in printed
    out = tmp_path / "counts.html"
    assert viewer_main([run, "--export", str(out), "--no-cache", "--no-tokenizer"]) == 0
    rows = export_data_rows(out.read_text())
    assert [(r["parse_failures"], r["context_tokens"]) for r in rows] == [(3, 1187), (None, None)]
    assert "parse_failures" not in WITHOUT_COUNTS and WITH_COUNTS["context_tokens"] == 1187


def test_context_tokens_of_a_record_by_hand():
    """The final context of a record: its field when it has one, else its token ids' last
    chunk (15 ids, chunks starting at 0 and 9: 6 held at the end); unknown (None) when it has
    neither or when they are of the wrong type, never an exception."""
    ids = list(range(15))
    assert context_tokens({"context_tokens": 6, "token_ids": ids}) == 6
    assert context_tokens({"token_ids": ids, "chunk_starts": [0, 9]}) == 6
    assert context_tokens({"token_ids": ids}) == 15  # no chunk_starts: one chunk
    assert context_tokens({"token_ids": ids, "chunk_starts": [0]}) == 15
    assert context_tokens({"num_turns": 3}) is None  # a small record from before the field
    assert context_tokens({"context_tokens": None, "token_ids": ids}) is None
    for bad in ("<img src=x onerror=alert(1)>", "6", True, -1, 2.5, [6], {"6": 6}):
        assert context_tokens({"context_tokens": bad, "token_ids": ids}) is None, bad
    for starts in (["<x>"], [0, 16], [-1], [], "0", 9):
        assert context_tokens({"token_ids": ids, "chunk_starts": starts}) is None, starts
    assert context_tokens({"token_ids": "<b>"}) is None
    assert count_field({"parse_failures": 2}, "parse_failures") == 2
    assert count_field({"parse_failures": 2.0}, "parse_failures") == 2
    assert count_field({}, "parse_failures") is None
    for bad in ("2", -3, False, None, [1]):
        assert count_field({"parse_failures": bad}, "parse_failures") is None, bad
