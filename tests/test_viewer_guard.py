"""The viewer against a hostile run folder and hostile requests (agentrl_jax/viewer/server.py,
record.py, export.py): malformed episodes are answered 200 with their bad fields marked (never a
5xx), ``--export`` / ``--print`` of them exit 0, the export file holds no payload as markup,
a foreign ``Host`` / ``Origin`` is refused as on the other servers, a non-loopback bind needs
an API key (which then guards every ``/api/`` route), and every answer carries its
Content-Security-Policy. The page itself is driven in Chromium in test_viewer_browser.py."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from aiohttp.test_utils import TestClient, TestServer

from agentrl_jax.viewer import Viewer
from agentrl_jax.viewer.__main__ import main as viewer_main
from agentrl_jax.viewer.export import ExportSummary, export_data_rows, file_name, script_hash
from agentrl_jax.viewer.record import check_value, describe_bad, episode_fields, token_problem
from agentrl_jax.viewer.server import DATA_CSP, PAGE_CSP, BackgroundServer, make_app
from viewer_hostile import (EVAL_COUNT_FIELDS, OTHER_BAD_FIELDS, PAYLOADS, PROBE_FIELDS,
                            hostile_episodes, write_hostile_run)


@pytest.fixture
def hostile_dir(tmp_path):
    return write_hostile_run(str(tmp_path))


@pytest.fixture
async def hostile_client(hostile_dir, tmp_path):
    viewer = Viewer([hostile_dir], cache_dir=str(tmp_path / "cache"), load_tokenizer=False)
    viewer.update()
    async with TestClient(TestServer(make_app(viewer, index_in_background=False))) as c:
        yield c
    viewer.close()


# ------------------------------------------------------------------------- record checks
def test_record_checks_against_hand_written_cases():
    assert check_value(3, "integer") == (True, 3)
    assert check_value(3.0, "integer") == (True, 3)
    assert check_value("3", "integer") == (False, None)
    assert check_value(True, "integer") == (False, None)
    assert check_value(2**60, "integer") == (False, None)
    assert check_value(0.5, "number") == (True, 0.5)
    assert check_value(1, "boolean") == (True, True)
    assert check_value(2, "boolean") == (False, None)
    assert check_value(None, "string") == (True, None)
    assert check_value(["a"], "string") == (False, None)
    assert describe_bad("<x>", "integer") == "expected an integer, got str '<x>'"
    assert describe_bad(7, "list") == "expected a list, got int 7"
    assert (describe_bad("y" * 100, "integer")
            == "expected an integer, got str '" + "y" * 58 + "\u2026")
    fields, bad = episode_fields({"step": "<x>", "env": "babyai", "reward": 1, "other": 1})
    assert fields == {"step": None, "env": "babyai", "reward": 1}
    assert bad == {"step": "expected an integer, got str '<x>'"}
    assert token_problem({"token_ids": [1, 2], "loss_mask": [0, True],
                          "logprobs": [None, -1.0]}) is None
    assert (token_problem({"token_ids": [1, "2"]})
            == "token_ids[1]: expected an integer, got str '2'")
    assert (token_problem({"token_ids": [1], "loss_mask": "1"})
            == "loss_mask: expected a list, got str '1'")
    assert file_name('run"<img>\n/x') == "run_img_x"


def test_script_hash_is_the_csp_source_of_the_text():
    # hand-computed: printf 'alert(1)' | openssl dgst -sha256 -binary | base64
    assert script_hash("alert(1)") == "'sha256-bhHHL3z2vDgxUt0W3dWQOrprscmda2Y5pLsLg4GF+pI='"


# ------------------------------------------------------------------------- the API
async def test_malformed_episodes_are_200_with_their_bad_fields_marked(hostile_client):
    c = hostile_client
    episodes = hostile_episodes()
    r = await c.get("/api/episode?run=0&file=0&row=1")  # the probe's fields hold payloads
    assert r.status == 200
    ep = await r.json()
    assert set(ep["malformed"]) == set(PROBE_FIELDS)
    assert ep["malformed"]["step"] == ("expected an integer, got str '<img src=x onerror=\"window"
                                       ".__pwned=1;document.title=1337\">'")
    assert all(ep["fields"][k] is None for k in PROBE_FIELDS)
    assert ep["fields"]["env"] == episodes[1]["env"]  # the good fields are shown
    assert len(ep["turns"]) == sum(m["role"] == "assistant" for m in episodes[1]["messages"])
    assert [t["reward"] for t in ep["turns"][:2]] == [None, None]
    assert ep["tokens"]["n_tokens"] == len(episodes[1]["token_ids"])
    assert ep["fields"]["context_tokens"] is None  # its chunk_starts hold a payload
    r = await c.get("/api/episode?run=0&file=0&row=2")  # wrong containers and numbers
    assert r.status == 200
    ep = await r.json()
    assert set(ep["malformed"]) == {*OTHER_BAD_FIELDS, "messages", "turn_rewards", "tokens"}
    assert ep["malformed"]["invalid_actions"] == "expected an integer, got str '<x>'"
    assert ep["malformed"]["tokens"].startswith("token_ids[0]: expected an integer, got str")
    assert ep["turns"] == [] and "tokens" not in ep and ep["fields"]["task_id"] == "GoToObj-0"
    r = await c.get("/api/episode?run=0&file=0&row=0")  # every string hostile: shown as data
    ep = await r.json()
    assert r.status == 200 and ep["malformed"] == {} and ep["fields"]["env"] == PAYLOADS[0]
    assert ep["tokens"]["n_tokens"] == len(episodes[0]["token_ids"])
    for row in (0, 1):  # eval_episodes.jsonl: the counts hold payloads (file 1)
        r = await c.get(f"/api/episode?run=0&file=1&row={row}")
        ep = await r.json()
        assert r.status == 200 and set(ep["malformed"]) == set(EVAL_COUNT_FIELDS)
        assert ep["malformed"]["parse_failures"].startswith("expected an integer, got ")
        assert all(ep["fields"][k] is None for k in EVAL_COUNT_FIELDS)
        assert ep["fields"]["num_turns"] == 4 and ep["turns"] == []
    for path in ("/api/runs", "/api/metrics?run=0", "/api/status", "/api/facets?run=0",
                 "/api/episodes?run=0&limit=100", "/api/compare?run=0",
                 "/api/export?run=0&limit=100"):
        r = await c.get(path)
        assert r.status == 200, (path, await r.text())
    rows = (await (await c.get("/api/episodes?run=0&limit=100")).json())["rows"]
    assert len(rows) == 11  # 5 train (the non-object line skipped) + 2 + 4 eval
    assert [(r["parse_failures"], r["context_tokens"]) for r in rows if r["file"] == 1] == [
        (None, None), (None, None)]  # the list shows them unknown, not the payloads
    for row in rows:
        r = await c.get(f"/api/episode?run=0&file={row['file']}&row={row['row']}")
        assert r.status == 200


async def test_foreign_host_and_origin_are_refused(hostile_client):
    c = hostile_client
    r = await c.get("/api/runs", headers={"Host": "evil.example"})
    assert r.status == 421 and "not a name of this server" in (await r.json())["error"]
    r = await c.get("/api/runs", headers={"Origin": "http://evil.example"})
    assert r.status == 403 and "cross-origin" in (await r.json())["error"]
    r = await c.get("/", headers={"Sec-Fetch-Site": "cross-site"})
    assert r.status == 403
    host = f"127.0.0.1:{c.port}"
    r = await c.get("/api/runs", headers={"Host": host, "Origin": f"http://{host}",
                                          "Sec-Fetch-Site": "same-origin"})
    assert r.status == 200


async def test_every_answer_carries_its_content_security_policy(hostile_client):
    c = hostile_client
    r = await c.get("/")
    assert r.status == 200 and r.headers["Content-Security-Policy"] == PAGE_CSP
    script_src = next(d for d in PAGE_CSP.split(";") if d.strip().startswith("script-src"))
    assert script_src.split() == ["script-src", "'self'"]  # no inline script or handler
    for path in ("/api/runs", "/api/episode?run=0&file=0&row=2", "/static/app.js",
                 "/api/nothing", "/api/export?run=0"):
        r = await c.get(path)
        assert r.headers["Content-Security-Policy"] == DATA_CSP, path
        assert r.headers["X-Content-Type-Options"] == "nosniff", path
    r = await c.get("/api/export?run=0&limit=100")
    assert r.headers["Content-Disposition"] == (
        'attachment; filename="run_img_src_x_onerror_window.__pwned_7-episodes.html"')


async def test_an_api_key_guards_the_api_but_not_the_page(hostile_dir, tmp_path):
    viewer = Viewer([hostile_dir], cache_dir=str(tmp_path / "cache"), load_tokenizer=False)
    viewer.update()
    app = make_app(viewer, index_in_background=False, api_key="s3cret")
    async with TestClient(TestServer(app)) as c:
        r = await c.get("/api/runs")
        assert r.status == 401 and "API key" in (await r.json())["error"]
        r = await c.get("/api/runs", headers={"Authorization": "Bearer wrong"})
        assert r.status == 401
        r = await c.get("/api/runs", headers={"Authorization": "Bearer s3cret"})
        assert r.status == 200
        for path in ("/", "/static/dom.js", "/static/app.js", "/static/style.css"):  # no run data
            assert (await c.get(path)).status == 200, path
    viewer.close()


def test_a_non_loopback_bind_needs_a_key(hostile_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("AGENTRL_VIEWER_API_KEY", raising=False)
    assert viewer_main([hostile_dir, "--host", "0.0.0.0", "--no-cache"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "refusing to serve on '0.0.0.0' without an API key" in err
    viewer = Viewer([hostile_dir], cache_dir=str(tmp_path / "cache"), load_tokenizer=False)
    with pytest.raises(ValueError, match="without an API key"):
        BackgroundServer(viewer, host="0.0.0.0")
    with BackgroundServer(viewer, host="0.0.0.0", api_key="k") as url:
        local = url.replace("0.0.0.0", "127.0.0.1") + "api/status"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(local, timeout=30)
        assert refused.value.code == 401
        request = urllib.request.Request(local, headers={"Authorization": "Bearer k"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert answer.status == 200 and "runs" in json.load(answer)
    viewer.close()


# ------------------------------------------------------------------------- export / print
def test_export_and_print_of_a_hostile_run_exit_0(hostile_dir, tmp_path, capsys):
    out = tmp_path / "export.html"
    assert viewer_main([hostile_dir, "--export", str(out), "--limit", "100", "--no-cache",
                        "--no-tokenizer"]) == 0
    printed = capsys.readouterr()
    assert printed.out == ExportSummary(11, malformed=5).line(str(out)) + "\n"
    assert "5 malformed (bad fields marked)" in printed.out and printed.err == ""
    text = out.read_text()
    assert len(export_data_rows(text)) == 11
    for p in PAYLOADS:  # in the file only as escaped JSON text, never as markup
        assert p not in text
    assert viewer_main([hostile_dir, "--print", "--limit", "100", "--no-cache",
                        "--no-tokenizer"]) == 0
    printed = capsys.readouterr().out
    assert "[malformed] invalid_actions: expected an integer, got str '<x>'" in printed
    assert "[malformed] context_tokens: expected an integer, got dict {'" in printed
    # the two small records' counts hold payloads; train row 1's chunk_starts hold one
    assert printed.count("parse failures unknown  context tokens unknown") == 2
    assert printed.count("context tokens unknown") == 3
