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
import time

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
    t0 = time.monotonic()
    wait(browser, lambda d: range_total(d) == n + 7, timeout=30)
    assert time.monotonic() - t0 < 30
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
