"""The viewer's page in a real headless Chromium (selenium): the runs view draws its curves and
evaluation tables, the filters and the text search narrow the list to what the files say, an
episode shows its invalid actions highlighted, the token view colours the loss mask (and the
trained tokens are exactly the replies), before / after shows two columns, the list grows while
a run writes new episodes (live view), and an exported file works from disk.

The run is synthetic but its token ids come from the real SmolLM2 tokenizer, so the page decodes
them through the run's tokenizer as it does for a real run."""

from __future__ import annotations

import json
import os

import pytest

from agentrl_jax.agent.parsing import INVALID_FORMAT_FEEDBACK
from agentrl_jax.viewer import Viewer
from agentrl_jax.viewer.__main__ import main as viewer_main
from agentrl_jax.viewer.server import BackgroundServer
from agentrl_jax.viewer.synthetic import write_synthetic_run

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

REJECTION = ("is not a valid action here", "Could not execute")
CONFIG = {"model": {"name": "smollm2"}, "env": {"names": "babyai,textcraft"},
          "learner": {"advantage_estimator": "grpo"},
          "train": {"total_steps": 19, "samples_per_task": 4, "max_staleness": 0},
          "rollout": {"parser": "react"}, "agent": {"response_prefix": "Action:"}}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from agentrl_jax.models.pretrained import resolve_model_path
    from agentrl_jax.models.tokenizer import load_tokenizer

    try:
        tok = load_tokenizer(resolve_model_path("smollm2"))
    except Exception as e:  # pragma: no cover - setup.sh installs the model
        pytest.skip(f"SmolLM2 tokenizer not available: {e}")
    d = str(tmp_path_factory.mktemp("viewer_browser") / "run")
    write_synthetic_run(d, 300, eval_steps=(0, 19), eval_tasks=6, eval_samples=2, seed=5,
                        horizon=5, config=CONFIG,
                        encode=lambda s: tok.encode(s, add_special_tokens=False),
                        episode_kwargs=dict(prompt_words=12, obs_words=6))
    return d


@pytest.fixture(scope="module")
def browser():
    from selenium.webdriver.chrome.service import Service

    from environments.miniwob.browser import CHROME_FLAGS, BrowserUnavailableError, chrome_paths

    try:
        binary, driver_path = chrome_paths()
    except BrowserUnavailableError as e:  # pragma: no cover - setup.sh installs Chromium
        pytest.skip(str(e))
    options = webdriver.ChromeOptions()
    for flag in CHROME_FLAGS + ("--window-size=1400,1000",):
        options.add_argument(flag)
    options.binary_location = binary
    service = Service(executable_path=driver_path, log_output=os.devnull)
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()
    try:
        service.process.wait(timeout=5)
    except Exception:
        pass


@pytest.fixture(scope="module")
def server(run_dir, tmp_path_factory):
    viewer = Viewer([run_dir], cache_dir=str(tmp_path_factory.mktemp("cache")))
    viewer.update()
    viewer.runs[0].tokenizer()  # loaded before the page asks (the server also preloads it)
    with BackgroundServer(viewer, poll_s=0.3) as url:
        yield url, viewer
    viewer.close()


def episodes(run_dir: str, kind: str = "train") -> list[dict]:
    with open(os.path.join(run_dir, f"trajectories_{kind}.jsonl")) as f:
        return [json.loads(line) for line in f]


def wait(driver, fn, timeout=20.0):
    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(lambda d: fn(d))


def open_view(driver, url: str, hash_: str) -> None:
    driver.get("about:blank")  # a new page load (same URL, new #hash would not reload)
    driver.get(url + hash_)
    wait(driver, lambda d: d.execute_script("return document.body.dataset.rendered"))


def range_total(driver) -> int | None:
    text = driver.execute_script(  # (re-rendered elements go stale: read it in the page)
        "const e = document.getElementById('range'); return e ? e.textContent : null")
    if text is None:
        return None
    # "1–50 of 360 episodes" or "0 episodes"
    return int(text.split(" of ")[1].split()[0]) if " of " in text else 0


def test_runs_view_draws_curves_and_eval_tables(browser, server, run_dir):
    url, _ = server
    open_view(browser, url, "#runs")
    wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".chart svg")) >= 5)
    titles = [e.get_attribute("aria-label") for e in
              browser.find_elements(By.CSS_SELECTOR, ".chart svg")]
    assert titles[:5] == ["train reward", "held-out Avg@k", "entropy", "KL", "step time"]
    reward = browser.find_elements(By.CSS_SELECTOR, ".chart svg")[0]
    n_steps = sum(1 for line in open(os.path.join(run_dir, "metrics.jsonl"))
                  if "rollout/mean_reward" in line)
    assert len(reward.find_elements(By.TAG_NAME, "circle")) == n_steps == 19
    rows = browser.find_elements(By.CSS_SELECTOR, "table.evals tr")
    assert [r.find_elements(By.TAG_NAME, "td")[0].text for r in rows[1:]] == ["0", "19"]
    assert "run" in browser.find_element(By.CSS_SELECTOR, "table.runs-table").text


def test_filters_and_search_narrow_the_list(browser, server, run_dir):
    url, _ = server
    train, evals = episodes(run_dir), episodes(run_dir, "eval")
    everything = train + evals
    open_view(browser, url, "#episodes?run=0")
    wait(browser, lambda d: range_total(d) == len(everything))
    browser.find_element(By.CSS_SELECTOR, "input[name=status][value=done]").click()
    done = [e for e in everything if e["status"] == "done"]
    wait(browser, lambda d: range_total(d) == len(done))
    box = browser.find_element(By.CSS_SELECTOR, "input[name=q]")
    box.send_keys("not a valid action")
    want = [e for e in done if any("not a valid action" in m["content"].lower()
                                   for m in e["messages"] if m["role"] != "system")]
    assert 0 < len(want) < len(done)
    wait(browser, lambda d: range_total(d) == len(want))
    statuses = {td.text for td in browser.find_elements(By.CSS_SELECTOR,
                                                         "table.list tbody td:nth-child(5)")}
    assert statuses == {"done"}
    assert "status=done" in browser.current_url and "q=not" in browser.current_url
    # a row opens its episode
    browser.find_element(By.CSS_SELECTOR, "table.list tbody tr").click()
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, ".turn"))
    assert "#episode?" in browser.current_url


def expected_invalid_turns(ep: dict) -> list[int]:
    msgs, out = ep["messages"], []
    replies = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
    for k, i in enumerate(replies):
        after = msgs[i + 1]["content"] if i + 1 < len(msgs) else ""
        if msgs[i]["content"].strip() == "Action:" or any(r in after for r in REJECTION):
            out.append(k)
    return out


def test_episode_turns_and_token_view(browser, server, run_dir):
    url, _ = server
    train = episodes(run_dir)
    row = next(i for i, e in enumerate(train) if e["status"] in ("done", "max_turns")
               and INVALID_FORMAT_FEEDBACK in [m["content"] for m in e["messages"]]
               and any(r in m["content"] for m in e["messages"] for r in REJECTION))
    ep = train[row]
    open_view(browser, url, f"#episode?run=0&file=0&row={row}")
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, ".turn[data-turn]"))
    turns = browser.find_elements(By.CSS_SELECTOR, ".turn[data-turn]")
    assert len(turns) == ep["num_turns"]
    invalid = [int(t.get_attribute("data-turn")) for t in turns
               if "invalid" in t.get_attribute("class").split()]
    assert invalid == expected_invalid_turns(ep) and len(invalid) >= 2
    labels = " ".join(e.text for e in browser.find_elements(By.CSS_SELECTOR, ".invalid-action"))
    assert "invalid action: empty action" in labels
    assert "rejected by the environment" in browser.find_element(By.ID, "view").text
    # token view: loss-mask colouring, trained tokens == the replies
    browser.find_element(By.CSS_SELECTOR, ".tabs button[data-tab=tokens]").click()
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#tokens .tok"))
    m1 = browser.find_elements(By.CSS_SELECTOR, "#tokens .tok.m1")
    m0 = browser.find_elements(By.CSS_SELECTOR, "#tokens .tok.m0")
    assert len(m1) == sum(ep["loss_mask"]) and len(m0) == len(ep["token_ids"]) - len(m1)
    bg = browser.execute_script(
        "return [...document.querySelectorAll('#tokens .tok.m1, #tokens .tok.m0')].map("
        "e => e.className + '|' + getComputedStyle(e).backgroundColor)")
    colours = {c.split("|")[0]: c.split("|")[1] for c in bg}
    assert colours["tok m1"] != colours["tok m0"]
    trained = browser.execute_script(
        "return [...document.querySelectorAll('#tokens .tok.m1')].map(e => e.textContent)"
        ".join('')")
    replies = "".join(m["content"][len("Action:"):] for m in ep["messages"]
                      if m["role"] == "assistant")
    assert trained == replies.replace("\n", "↵\n")
    checks = browser.find_elements(By.CSS_SELECTOR, ".checks li")
    assert [c.get_attribute("class") for c in checks] == ["ok", "ok", "ok"]
    assert "grpo advantage" in browser.find_element(By.ID, "view").text


def test_before_after_side_by_side(browser, server, run_dir):
    url, _ = server
    open_view(browser, url, "#compare?run=0")
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "table.compare tbody tr"))
    rows = browser.find_elements(By.CSS_SELECTOR, "table.compare tbody tr")
    assert len(rows) == 6
    rows[0].click()
    wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#side-by-side .col")) == 2)
    cols = browser.find_elements(By.CSS_SELECTOR, "#side-by-side .col")
    assert [c.get_attribute("data-side") for c in cols] == ["before", "after"]
    assert all(c.find_elements(By.CSS_SELECTOR, ".turn") for c in cols)
    assert "step 0" in cols[0].text and "step 19" in cols[1].text


def test_live_view_shows_new_episodes(browser, server, run_dir):
    url, _ = server
    path = os.path.join(run_dir, "trajectories_train.jsonl")
    n = len(episodes(run_dir)) + len(episodes(run_dir, "eval"))
    open_view(browser, url, "#episodes?run=0")
    wait(browser, lambda d: range_total(d) == n)
    new = episodes(run_dir)[:7]
    with open(path, "a") as f:
        for ep in new:
            f.write(json.dumps({**ep, "step": 20}) + "\n")
    with open(os.path.join(run_dir, "metrics.jsonl"), "a") as f:
        f.write(json.dumps({"step": 20, "rollout/mean_reward": 0.9}) + "\n")
    wait(browser, lambda d: range_total(d) == n + 7, timeout=30)  # the page follows the run
    wait(browser, lambda d: "step 20" in d.find_element(By.ID, "live-status").text)
    errors = [e for e in browser.get_log("browser") if e.get("level") == "SEVERE"]
    assert not errors, errors  # no script error or failed request on any page so far


def test_export_file_opens_without_a_server(browser, run_dir, tmp_path):
    browser.get_log("browser")  # drop what earlier pages logged
    out = str(tmp_path / "export.html")
    assert viewer_main([run_dir, "--export", out, "--invalid", "yes", "--limit", "5",
                        "--no-cache"]) == 0
    browser.get("file://" + out)
    wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "table.list tbody tr")) == 5)
    browser.find_elements(By.CSS_SELECTOR, "table.list tbody tr")[0].click()
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, ".turn[data-turn]"))
    browser.find_element(By.CSS_SELECTOR, ".tabs button[data-tab=tokens]").click()
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#tokens .tok.m1"))
    errors = [e for e in browser.get_log("browser") if e.get("level") == "SEVERE"]
    assert not errors, errors  # no failed request, no script error


# ------------------------------------------------------------------ the evaluation counts
COUNT_CELLS = ("return [...document.querySelectorAll('table.list tbody tr')].map(tr => "
               "[...tr.querySelectorAll('td[data-col]')].map(td => td.textContent))")
FIELDS = ("return Object.fromEntries([...document.querySelectorAll('.fields > div')].map(d => "
          "[d.querySelector('b').textContent, d.textContent.slice("
          "d.querySelector('b').textContent.length)]))")


def check_count_views(driver, url: str, live: bool) -> None:
    """The list and both episodes of the counts run (tests/viewer_eval_counts.py): the values
    of the record that has them, ``unknown`` for the one that does not."""
    open_view(driver, url, "#episodes?run=0" if live else "#episodes")
    wait(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "table.list tbody tr")) == 2)
    assert driver.execute_script(COUNT_CELLS) == [["3", "1187"], ["unknown", "unknown"]]
    heads = [th.text for th in driver.find_elements(By.CSS_SELECTOR, "table.list th")]
    assert heads[8:11] == ["tokens", "parse failures", "context"]
    for row, want in ((0, ("3", "1187")), (1, ("unknown", "unknown"))):
        open_view(driver, url, f"#episode?run=0&file=0&row={row}")
        fields = driver.execute_script(FIELDS)
        assert (fields["parse failures"], fields["context tokens"]) == want, fields
        assert fields["turns"] == ("6", "2")[row]


def test_eval_counts_shown_and_unknown_when_missing(browser, tmp_path):
    from viewer_eval_counts import write_eval_counts_run

    run = write_eval_counts_run(str(tmp_path))
    viewer = Viewer([run], cache_dir=str(tmp_path / "cache"), load_tokenizer=False)
    viewer.update()
    browser.get_log("browser")  # drop what earlier pages logged
    with BackgroundServer(viewer) as url:
        check_count_views(browser, url, live=True)
    viewer.close()
    out = str(tmp_path / "counts.html")
    assert viewer_main([run, "--export", out, "--no-cache", "--no-tokenizer"]) == 0
    check_count_views(browser, "file://" + out, live=False)
    errors = [e for e in browser.get_log("browser") if e.get("level") == "SEVERE"]
    assert not errors, errors


# ------------------------------------------------------------------ a hostile run folder
# Every field of the run folder holds script payloads (tests/viewer_hostile.py); each view of
# the live page and of an export must show them as text, run none of them, and mark the
# malformed episodes' bad fields.
from viewer_hostile import (EVAL_COUNT_FIELDS, PAGE_TITLE, PAYLOADS,  # noqa: E402
                            PROBE_FIELDS, RUN_NAME, write_hostile_run)

PAYLOAD_MARKUP = ("#view img, #view iframe, #view script, #view object, #view embed, "
                  "[onerror], [onload], [ontoggle], [onclick], [onmouseover]")


@pytest.fixture(scope="module")
def hostile_server(tmp_path_factory):
    run = write_hostile_run(str(tmp_path_factory.mktemp("hostile")))
    viewer = Viewer([run], cache_dir=str(tmp_path_factory.mktemp("hostile_cache")),
                    load_tokenizer=False)
    viewer.update()
    with BackgroundServer(viewer, poll_s=0.3) as url:
        yield url, run
    viewer.close()


def settle(driver) -> None:
    """Let pending image loads (and any handler they would trigger) finish."""
    driver.execute_async_script(
        "const done = arguments[0]; requestAnimationFrame(() => setTimeout(done, 200));")


def assert_no_script_ran(driver, title: str, where: str) -> None:
    settle(driver)
    state = driver.execute_script(
        "return {title: document.title, pwned: window.__pwned === undefined ? null : "
        f"String(window.__pwned), markup: document.querySelectorAll({PAYLOAD_MARKUP!r}).length}}")
    assert state == {"title": title, "pwned": None, "markup": 0}, where


def view_text(driver) -> str:
    return driver.execute_script("return document.getElementById('view').textContent")


HOSTILE_VIEWS = ["#runs", "#episodes?run=0", "#compare?run=0", "#compare?run=0&task=0",
                 "#compare?run=0&task=1&sample=1"] + [
    f"#episode?run=0&file={f}&row={r}&tab={tab}" for f, n in ((0, 5), (1, 2), (2, 4))
    for r in range(n) for tab in ("turns", "tokens")]


def test_a_hostile_run_runs_no_script_in_the_page(browser, hostile_server):
    url, _ = hostile_server
    browser.get_log("browser")  # drop what earlier pages logged
    for view in HOSTILE_VIEWS:
        open_view(browser, url, view)
        assert not browser.find_elements(By.CSS_SELECTOR, "#view > .errorbox:only-child"), view
        assert_no_script_ran(browser, PAGE_TITLE, view)
    # the payloads are shown, as text
    open_view(browser, url, "#episode?run=0&file=0&row=0")
    text = view_text(browser)
    assert all(p in text for p in PAYLOADS)
    open_view(browser, url, "#runs")
    assert RUN_NAME in view_text(browser) and PAYLOADS[4] in view_text(browser)
    # the probe's episode: its six fields hold payloads, each marked, the rest shown
    open_view(browser, url, "#episode?run=0&file=0&row=1")
    marked = browser.execute_script(
        "return [...document.querySelectorAll('.fields .malformed')].map(e => e.dataset.field)")
    assert sorted(marked) == sorted(PROBE_FIELDS)
    assert len(browser.find_elements(By.CSS_SELECTOR, ".malformed-record li")) == 6
    assert browser.find_elements(By.CSS_SELECTOR, ".turn[data-turn]")
    # wrong containers: the episode still opens, says why there are no turns / tokens
    open_view(browser, url, "#episode?run=0&file=0&row=2&tab=tokens")
    text = view_text(browser)
    assert "invalid_actions: expected an integer, got str '<x>'" in text
    assert "No token view for this episode: malformed token record (token_ids[0]" in text
    # the small evaluation records: their counts hold payloads, marked and shown as text
    open_view(browser, url, "#episode?run=0&file=1&row=0")
    marked = browser.execute_script(
        "return [...document.querySelectorAll('.fields .malformed')].map(e => e.dataset.field)")
    assert sorted(marked) == sorted(EVAL_COUNT_FIELDS)
    assert PAYLOADS[0] in view_text(browser) and PAYLOADS[1] in view_text(browser)
    open_view(browser, url, "#episodes?run=0&kind=eval&limit=100")
    cells = browser.execute_script(
        "return [...document.querySelectorAll('table.list tbody tr[data-file=\"1\"] "
        "td[data-col]')].map(td => td.textContent)")
    assert cells == ["unknown"] * 4
    errors = [e for e in browser.get_log("browser") if e.get("level") == "SEVERE"]
    assert not errors, errors  # no blocked script, no failed image load, no script error


def test_a_hostile_run_exported_runs_no_script(browser, hostile_server, tmp_path):
    _, run = hostile_server
    out = str(tmp_path / "hostile.html")
    assert viewer_main([run, "--export", out, "--limit", "100", "--no-cache",
                        "--no-tokenizer"]) == 0
    title = f"{RUN_NAME}: 11 of 11 matching episodes"
    browser.get_log("browser")
    browser.get("file://" + out)
    wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "table.list tbody tr")) == 11)
    assert_no_script_ran(browser, title, "export list")
    rows = browser.execute_script("return [...document.querySelectorAll('table.list tbody tr')]"
                                  ".map(tr => [tr.dataset.file, tr.dataset.row])")
    for file, row in rows:
        for tab in ("turns", "tokens"):
            open_view(browser, "file://" + out, f"#episode?file={file}&row={row}&tab={tab}")
            assert browser.find_elements(By.CSS_SELECTOR, ".tabs"), (file, row)
            assert_no_script_ran(browser, title, f"export file {file} row {row} {tab}")
    errors = [e for e in browser.get_log("browser") if e.get("level") == "SEVERE"]
    assert not errors, errors


INJECT = ("const i = document.createElement('div'); i.innerHTML = "
          "'<img id=probe src=nothing-here onerror=\"window.__csp = 1\">'; "
          "document.body.appendChild(i);")


def injected_handler_ran(driver) -> bool:
    driver.execute_script(INJECT)
    wait(driver, lambda d: d.execute_script("return document.getElementById('probe').complete"))
    settle(driver)
    return driver.execute_script("return window.__csp === 1")


def test_the_content_security_policy_blocks_an_inline_handler(browser, server, run_dir,
                                                               tmp_path):
    """Defence in depth: were markup ever inserted, its inline event handler would not run,
    in the live page (CSP header) nor in an export (CSP meta). Control: the same injection
    runs on a page without the policy."""
    url, _ = server
    browser.get("data:text/html,<title>no policy</title>")
    assert injected_handler_ran(browser)  # the probe works
    open_view(browser, url, "#runs")
    assert not injected_handler_ran(browser)
    out = str(tmp_path / "export.html")
    assert viewer_main([run_dir, "--export", out, "--limit", "2", "--no-cache",
                        "--no-tokenizer"]) == 0
    browser.get("file://" + out)
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "table.list tbody tr"))
    assert not injected_handler_ran(browser)
    browser.get_log("browser")  # the blocked handlers logged their violations


def test_a_keyed_viewer_asks_for_its_key(browser, run_dir, tmp_path):
    viewer = Viewer([run_dir], cache_dir=str(tmp_path / "cache"), load_tokenizer=False)
    viewer.update()
    with BackgroundServer(viewer, api_key="k3y") as url:
        open_view(browser, url, "#runs")
        assert "needs its API key" in view_text(browser)
        assert not browser.find_elements(By.CSS_SELECTOR, ".chart svg")  # no run data shown
        rendered = lambda d: d.execute_script("return document.body.dataset.rendered")  # noqa
        before = rendered(browser)
        browser.find_element(By.ID, "api-key").send_keys("wrong\n")
        wait(browser, lambda d: rendered(d) != before)  # asked the server again: refused
        assert "needs its API key" in view_text(browser)
        assert not browser.find_elements(By.CSS_SELECTOR, ".chart svg")
        browser.find_element(By.ID, "api-key").send_keys("k3y\n")
        wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".chart svg")) >= 5)
        browser.execute_script("sessionStorage.clear()")
        browser.get_log("browser")  # the refused requests logged their 401s
    viewer.close()
