"""MiniWoB++ family: action parsing, DOM text, seeds, the page as the reference, the rule-based
expert through HTTP, and no leaked Chromium / chromedriver processes."""

from __future__ import annotations

import os

import pytest
from waiting import wait_until

from environments.core.base import InvalidTaskError
from environments.miniwob.actions import parse_action
from environments.miniwob.catalog import SUPPORTED_TASKS, TEST_SEED_BASE, MiniWoBCatalog, parse_task_id
from environments.miniwob.dom_text import render
from environments.miniwob.expert import MiniWoBExpert, parse_observation

# ------------------------------------------------------------------------ no browser needed


def test_parse_action_forms():
    assert parse_action("click [12]").kind == "click" and parse_action("click [12]").ref == 12
    assert parse_action("  Click 7 ").ref == 7
    typed = parse_action('type [5] "Hello \\"you\\""')
    assert (typed.kind, typed.ref, typed.text) == ("type", 5, 'Hello "you"')
    assert parse_action("type [5] plain words").text == "plain words"
    assert parse_action('type [5] "half quoted').text == "half quoted"  # a ReAct parser ate one quote
    assert parse_action("type [5] [in brackets]").text == "in brackets"
    assert parse_action('select [4] "Bobine"').text == "Bobine"
    assert parse_action("press [Enter]").text == "<Enter>"
    assert parse_action("press ctrl+a").text == "C-a"
    assert parse_action("press <Tab>").text == "<Tab>"
    assert parse_action("press C-S-<End>").text == "C-S-<End>"
    for bad in ("", "clik [3]", "click", "press [NoSuchKey]", "hover [3]", "click [x]"):
        assert parse_action(bad).kind == "invalid", bad


def _node(tag, ref, children=(), **extra):
    return {"tag": tag, "ref": ref, "children": list(children), **extra}


def test_render_shows_refs_text_and_state():
    dom = _node(
        "BODY", 1,
        [
            _node("DIV", 2, [
                _node("LABEL", 3, [_node("INPUT_checkbox", 4, value=True, text=""), _node("t", -1, text="apple")]),
                _node("INPUT_text", 5, id="tt", value='say "hi"', focused=True, text=""),
                _node("DIV", 6, text=""),  # empty container: hidden
                _node("SELECT", 7, id="options"),
                _node("BUTTON", 8, text="Submit", id="subbtn"),
            ]),
        ],
        selects={"7": {"options": ["a", "b"], "selected": "b"}},
    )  # fmt: skip
    text, elements = render(dom)
    assert text.splitlines() == [
        '[3] label "apple"',
        "  [4] input_checkbox checked=true",
        '[5] input_text id=tt value="say \\"hi\\"" focused',
        '[7] select id=options options=["a", "b"] selected="b"',
        '[8] button "Submit" id=subbtn',
    ]
    assert set(elements) == {1, 2, 3, 4, 5, 6, 7, 8} and not elements[6].shown
    utterance, parsed = parse_observation("Task: Do it.\n\nPage:\n" + text)
    assert utterance == "Do it." and [e.ref for e in parsed] == [3, 4, 5, 7, 8]
    assert parsed[2].attrs["value"] == 'say "hi"' and parsed[0].text == "apple"


def test_catalog_seeds_are_disjoint_and_interleaved():
    catalog = MiniWoBCatalog()
    train, dev, test = catalog.task_ids("train"), catalog.task_ids("dev"), catalog.task_ids("test")
    assert not set(train) & set(test) and not set(dev) & (set(train) | set(test))
    assert len(train) == 950 * len(SUPPORTED_TASKS) and len(test) == 50 * len(SUPPORTED_TASKS)
    assert len(dev) == 50 * len(SUPPORTED_TASKS)
    assert [parse_task_id(t)[0] for t in test[: len(SUPPORTED_TASKS)]] == list(SUPPORTED_TASKS)
    assert parse_task_id(test[0]) == (SUPPORTED_TASKS[0], TEST_SEED_BASE)
    assert parse_task_id("click-button", seed=5) == ("click-button", 5)
    assert parse_task_id("miniwob/click-button-v1/seed=3") == ("click-button", 3)
    for bad in ("draw-circle/seed=1", "click-button/seed=x", "nope", ""):
        with pytest.raises(InvalidTaskError):
            parse_task_id(bad)
    with pytest.raises(InvalidTaskError):
        catalog.task_ids("validation")


# ---------------------------------------------------------------------------- with Chromium


def _browser_or_skip():
    from environments.miniwob.browser import BrowserUnavailableError, chrome_paths, miniwob_html_dir

    try:
        chrome_paths()
        miniwob_html_dir()
    except BrowserUnavailableError as error:
        pytest.skip(f"MiniWoB++ needs Chromium, chromedriver and the miniwob package: {error}")


def chrome_processes(drivers_only: bool = False) -> set[int]:
    """Live (non-zombie) chromium / chromedriver / crashpad processes on the machine (only the
    chromedrivers, one per browser, with ``drivers_only``)."""
    pids = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read().decode(errors="replace")
        except OSError:
            continue
        name = stat[stat.find("(") + 1 : stat.rfind(")")]
        state = stat[stat.rfind(")") + 2]
        wanted = name == "chromedriver" if drivers_only else ("chrom" in name or "crashpad" in name)
        if state != "Z" and wanted:
            pids.add(int(entry))
    return pids


class TestInProcess:
    @pytest.fixture(scope="class")
    def env(self):
        _browser_or_skip()
        from environments.miniwob.env import MiniWoBEnvironment

        env = MiniWoBEnvironment(max_steps=4)
        yield env
        env.close()

    def test_same_seed_same_episode_other_seed_other_episode(self, env):
        a = env.reset("click-button/seed=11")
        b = env.reset("click-button/seed=11")
        c = env.reset("click-button/seed=12")
        assert a.observation == b.observation and a.observation != c.observation
        assert a.info["task_id"] == "click-button/seed=11" and a.info["split"] == "train"
        assert a.info["max_steps"] == 4 and "click [ref]" in a.info["instructions"]
        dev = env.reset("click-button/seed=950")  # a dev seed: MiniWoB's training data mode
        assert dev.info["split"] == "dev" and dev.info["utterance"] and dev.observation != a.observation

    def test_observation_matches_the_page(self, env):
        from selenium.webdriver.common.by import By

        result = env.reset("login-user/seed=3")
        driver = env.browser._driver
        utterance, elements = parse_observation(result.observation)
        assert utterance == driver.find_element(By.ID, "query").text
        buttons = [e.text for e in elements if e.tag == "button"]
        assert buttons == [b.text for b in driver.find_elements(By.CSS_SELECTOR, "#area button") if b.is_displayed()]
        username = next(e for e in elements if e.attrs.get("id") == "username")
        env.step(f'type [{username.ref}] "ada"')
        assert driver.find_element(By.ID, "username").get_attribute("value") == "ada"
        again = env.step(f'type [{username.ref}] "lovelace"')  # replaces, does not append
        assert driver.find_element(By.ID, "username").get_attribute("value") == "lovelace"
        assert 'value="lovelace"' in again.observation

    def test_invalid_actions_are_normal_steps_and_the_limit_truncates(self, env):
        env.reset("click-test/seed=1")
        bad = env.step("dance")
        assert bad.info["invalid_action"] and not bad.done and bad.reward == 0.0
        assert bad.observation.startswith("Invalid action:") and "Page:" in bad.observation
        missing = env.step("click [999]")
        assert missing.info["invalid_action"] and "no element [999]" in missing.observation
        env.step("press Tab")
        last = env.step("press Tab")
        assert last.truncated and not last.done and not last.info["success"]

    def test_wrong_click_fails_right_click_succeeds(self, env):
        result = env.reset("click-test-2/seed=5")
        utterance, elements = parse_observation(result.observation)
        wanted = utterance.split("button ")[1].rstrip(".")
        wrong = next(e for e in elements if e.tag == "button" and e.text != wanted)
        failed = env.step(f"click [{wrong.ref}]")
        assert failed.done and failed.reward == 0.0 and not failed.info["success"] and failed.info["score"] < 0
        result = env.reset("click-test-2/seed=5")
        right = next(e for e in parse_observation(result.observation)[1] if e.text == wanted)
        passed = env.step(f"click [{right.ref}]")
        assert passed.done and passed.reward == 1.0 and passed.info["success"] and passed.info["score"] > 0

    def test_close_kills_the_browser(self):
        _browser_or_skip()
        from environments.miniwob.browser import pid_alive
        from environments.miniwob.env import MiniWoBEnvironment

        env = MiniWoBEnvironment()
        env.reset("focus-text/seed=0")
        pids = env.browser.pids
        assert len(pids) >= 2 and all(pid_alive(p) for p in pids)
        env.close()
        env.close()  # idempotent
        assert not [p for p in pids if pid_alive(p)]
        with pytest.raises(RuntimeError):
            env.reset("focus-text/seed=0")


class TestHTTP:
    @pytest.fixture(scope="class")
    def server(self):
        _browser_or_skip()
        from agentrl_common.processes import start_env_server

        before = chrome_processes()
        server = start_env_server("miniwob")
        yield server, before
        server.stop()

    async def test_expert_solves_held_out_episodes(self, server):
        """The rule-based expert, reading only observations, on 2 test seeds of every task."""
        import asyncio

        from environments.core.client import EnvClient

        srv, _ = server
        async with EnvClient(srv.url, timeout=120) as client:
            test_ids = await client.tasks("test")
            sample = test_ids[: 2 * len(SUPPORTED_TASKS)]  # 2 held-out seeds per task

            async def play(task_ids: list[str]) -> list[bool]:
                env_id, observation, info = await client.create(task_id=task_ids[0])
                outcomes = []
                try:
                    for n, task_id in enumerate(task_ids):
                        if n:
                            observation = (await client.reset(env_id, task_id=task_id)).observation
                        expert = MiniWoBExpert()
                        task = parse_task_id(task_id)[0]
                        for _ in range(15):
                            result = await client.step(env_id, expert.act(task, observation))
                            observation = result.observation
                            if result.done or result.truncated:
                                break
                        outcomes.append(bool(result.info.get("success")))
                finally:
                    await client.close(env_id)
                return outcomes

            # two sessions (two browsers) in parallel
            halves = await asyncio.gather(play(sample[0::2]), play(sample[1::2]))
        outcomes = [o for half in halves for o in half]
        rate = sum(outcomes) / len(outcomes)
        print(f"MiniWoB expert success on {len(outcomes)} held-out episodes: {rate:.1%}")
        assert rate >= 0.9

    async def test_bad_inputs_and_close_keeps_the_browser_for_the_next_session(self, server):
        from environments.core.client import EnvClient, EnvServerError

        srv, before = server
        async with EnvClient(srv.url, timeout=60) as client:
            with pytest.raises(EnvServerError) as error:
                await client.create(task_id="draw-circle/seed=0")
            assert error.value.status == 404
            env_id, observation, _ = await client.create(task_id="click-test/seed=0")
            drivers = chrome_processes(drivers_only=True) - before
            assert drivers  # this session's browser (and any kept from earlier sessions)
            step = await client.step(env_id, "fly away")
            assert step.info["invalid_action"] and not step.done
            await client.close(env_id)
            reused = (await client.stats())["sessions_reused"]
            env_id, observation, _ = await client.create(task_id="click-test/seed=1")
            assert "Click" in observation or "click" in observation
            # the closed session's browser served the new one: no browser was started for it
            assert (await client.stats())["sessions_reused"] == reused + 1
            assert chrome_processes(drivers_only=True) - before == drivers
            await client.close(env_id)

    async def test_without_reuse_close_releases_the_browser(self):
        from agentrl_common.processes import start_env_server
        from environments.core.client import EnvClient

        before = chrome_processes()
        with start_env_server("miniwob", extra_args=["--no-reuse"]) as srv:
            async with EnvClient(srv.url, timeout=60) as client:
                env_id, _, _ = await client.create(task_id="click-test/seed=0")
                assert chrome_processes() - before  # this session's browser
                await client.close(env_id)
                assert wait_until(lambda: not (chrome_processes() - before)), chrome_processes() - before

    async def test_a_kept_browser_that_died_is_replaced_by_the_next_create(self):
        """A closed session's browser is kept; its chromedriver is killed while it waits (as a
        crash would); the next /create gets a new browser and succeeds."""
        import signal

        from agentrl_common.processes import start_env_server
        from environments.core.client import EnvClient
        from environments.miniwob.browser import descendants

        with start_env_server("miniwob") as srv:
            async with EnvClient(srv.url, timeout=60, retries=0) as client:
                await client.close((await client.create(task_id="click-test/seed=0")).env_id)
                drivers = [pid for pid in descendants(srv.pid) if pid in chrome_processes(drivers_only=True)]
                assert len(drivers) == 1
                os.kill(drivers[0], signal.SIGKILL)
                env_id, observation, _ = await client.create(task_id="click-test/seed=1")
                assert "Page:" in observation
                step = await client.step(env_id, "fly away")
                assert step.info["invalid_action"] and not step.done
                stats = await client.stats()
                assert stats["spares_replaced"] == 1 and stats["errors_total"] == 0
                await client.close(env_id)

    def test_no_browser_survives_the_server(self, server):
        import asyncio

        from environments.core.client import EnvClient

        srv, before = server

        async def open_two() -> None:
            async with EnvClient(srv.url) as client:
                for seed in (0, 1):
                    await client.create(task_id=f"click-test/seed={seed}")  # never closed

        asyncio.run(open_two())
        assert len(chrome_processes() - before) >= 4
        srv.stop()  # SIGTERM: the server closes both sessions
        assert wait_until(lambda: not (chrome_processes() - before)), chrome_processes() - before
