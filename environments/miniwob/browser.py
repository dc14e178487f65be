"""One headless Chromium (via chromedriver + Selenium) driving MiniWoB++ task pages.

This is a small replacement for ``miniwob.selenium_instance`` that (a) reuses one browser across
tasks and episodes, (b) passes the flags a root, offline, GPU-less box needs, (c) switches the
10-second episode timer off (an LLM agent thinks for longer than that) and (d) kills every
process it started on ``close()``: chromedriver runs in its own session (process group), and
whatever survives ``driver.quit()`` is SIGKILLed.

It talks to the task page through MiniWoB's own JavaScript API (``core.*``), exactly as
``miniwob.selenium_instance`` does.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("environments.miniwob")

CHROME_FLAGS = (
    "--headless=new",
    "--no-sandbox",  # Chromium refuses to run as root with its sandbox
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--no-first-run",
    "--no-default-browser-check",
    "--mute-audio",
    "--window-size=600,500",
)
EPISODE_MAX_TIME_MS = 1_000_000_000  # ~11.6 days: effectively no time limit (setTimeout caps at 2^31-1)
READY_POLL_S = 0.02
READY_TIMEOUT_S = 5.0


class BrowserUnavailableError(RuntimeError):
    """Chromium or chromedriver (or the miniwob package) is not installed."""


def chrome_paths() -> tuple[str, str]:
    """``(chromium binary, chromedriver)``: ``MINIWOB_CHROME_BINARY`` / ``MINIWOB_CHROMEDRIVER``, else
    Debian's ``/usr/bin/chromium`` and ``/usr/bin/chromedriver`` (or whatever is on ``PATH``)."""
    binary = os.environ.get("MINIWOB_CHROME_BINARY") or shutil.which("chromium") or shutil.which("chromium-browser")
    driver = os.environ.get("MINIWOB_CHROMEDRIVER") or shutil.which("chromedriver")
    if not binary or not Path(binary).exists():
        raise BrowserUnavailableError("Chromium not found: install Debian's 'chromium' or set MINIWOB_CHROME_BINARY")
    if not driver or not Path(driver).exists():
        raise BrowserUnavailableError(
            "chromedriver not found: install Debian's 'chromium-driver' or set MINIWOB_CHROMEDRIVER"
        )
    return binary, driver


def miniwob_html_dir() -> Path:
    """The ``html/miniwob`` folder of the installed ``miniwob`` package (found without importing it)."""
    import importlib.util

    spec = importlib.util.find_spec("miniwob")
    if spec is None or not spec.submodule_search_locations:
        raise BrowserUnavailableError("the 'miniwob' package is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / "html" / "miniwob"


def descendants(pid: int) -> list[int]:
    """Process ids of every live descendant of ``pid`` (read from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read().decode(errors="replace")
        except OSError:
            continue
        ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out: list[int] = []
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            out.append(child)
            stack.append(child)
    return out


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode(errors="replace")
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].split()[0] != "Z"


class MiniWoBBrowser:
    """A Chromium page that runs MiniWoB++ episodes. Not thread-safe (one caller at a time)."""

    def __init__(self, html_dir: Path | None = None) -> None:
        self.html_dir = html_dir or miniwob_html_dir()
        self._driver: Any = None
        self._driver_pid: int | None = None
        self._known_pids: set[int] = set()
        self.task: str | None = None
        self.episodes = 0

    # -- processes

    def start(self) -> None:
        """Start chromedriver + Chromium (1-2 s). Called lazily by ``open_task``."""
        if self._driver is not None:
            return
        try:
            from selenium import webdriver
            from selenium.webdriver.chrome.service import Service
        except ImportError as error:  # pragma: no cover - selenium comes with miniwob
            raise BrowserUnavailableError(f"selenium is not installed: {error}") from error
        binary, driver_path = chrome_paths()
        options = webdriver.ChromeOptions()
        for flag in CHROME_FLAGS:
            options.add_argument(flag)
        options.binary_location = binary
        # its own session: close() can reach every Chromium process through the process group
        service = Service(executable_path=driver_path, popen_kw={"start_new_session": True}, log_output=os.devnull)
        self._driver = webdriver.Chrome(service=service, options=options)
        self._driver_pid = service.process.pid
        self._known_pids = {self._driver_pid, *descendants(self._driver_pid)}
        self._driver.set_script_timeout(30)

    @property
    def pids(self) -> set[int]:
        """chromedriver and every Chromium process seen so far (for leak checks)."""
        if self._driver_pid is not None and pid_alive(self._driver_pid):
            self._known_pids |= set(descendants(self._driver_pid))
        return set(self._known_pids)

    def close(self) -> None:
        """Quit the browser and make sure chromedriver and all Chromium processes are gone. Idempotent."""
        driver, self._driver = self._driver, None
        if driver is None:
            return
        pids = self.pids
        pgid = self._driver_pid
        with contextlib.suppress(Exception):
            driver.quit()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if pgid is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, sig)
            for pid in pids:
                if pid_alive(pid):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, sig)
            deadline = time.monotonic() + 2.0
            while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
                time.sleep(0.02)
            if not any(pid_alive(p) for p in pids):
                break
        # reap chromedriver if it is our child (avoids a zombie)
        with contextlib.suppress(Exception):
            driver.service.process.wait(timeout=1)
        self._driver_pid = None
        self.task = None

    @property
    def running(self) -> bool:
        return self._driver is not None

    # -- pages and episodes

    def open_task(self, task: str) -> None:
        """Load the page of MiniWoB task ``task`` (e.g. "click-button") unless it is loaded already."""
        self.start()
        if self.task == task:
            return
        page = self.html_dir / f"{task}.html"
        if not page.exists():
            raise ValueError(f"no MiniWoB page {page}")
        self.task = None
        self._driver.get(page.as_uri())
        self._wait_for("return typeof core !== 'undefined' && document.getElementById('sync-task-cover') !== null;")
        self.task = task

    def begin_episode(self, seed: int, data_mode: str = "train") -> None:
        """Start a new episode of the loaded task with ``seed`` and no time limit."""
        self.episodes += 1
        self._driver.execute_script(
            f"core.EPISODE_MAX_TIME = {EPISODE_MAX_TIME_MS};"
            "core.endEpisode(0);"  # force-stop a running episode (a no-op otherwise)
            f"Math.seedrandom({int(seed)});"
            f"core.setDataMode({data_mode!r});"
            "core.startEpisodeReal();"
        )
        self._wait_for("return WOB_TASK_READY;")

    def utterance(self) -> str:
        response = self._driver.execute_script("return core.getUtterance();")
        return response["utterance"] if isinstance(response, dict) else str(response)

    def dom(self) -> dict[str, Any]:
        """The page's DOM tree (``core.getDOMInfo()``), with the options of every ``<select>`` added."""
        return self._driver.execute_script(
            "var root = core.getDOMInfo();"
            "var selects = {};"
            "Object.keys(core.previousDOMInfo).forEach(function (ref) {"
            "  var el = core.previousDOMInfo[ref];"
            "  if (el instanceof HTMLSelectElement) {"
            "    selects[ref] = {options: Array.from(el.options).map(function (o) { return o.text; }),"
            "                    selected: el.selectedIndex >= 0 ? el.options[el.selectedIndex].text : null};"
            "  }"
            "});"
            "root.selects = selects;"
            "return root;"
        )

    def metadata(self) -> dict[str, Any]:
        """``{"done", "env_reward", "raw_reward", "reason"}`` of the current episode."""
        return self._driver.execute_script(
            "return {done: WOB_DONE_GLOBAL, env_reward: WOB_REWARD_GLOBAL,"
            " raw_reward: WOB_RAW_REWARD_GLOBAL, reason: WOB_REWARD_REASON};"
        )

    # -- actions (refs come from the last ``dom()``)

    def click(self, ref: int) -> str | None:
        """Click element ``ref`` (and focus it); returns an error message or None."""
        result = self._driver.execute_script(f"return core.elementClick({int(ref)});")
        return None if result is True else str(result)

    def type_text(self, text: str, replace: bool = True) -> None:
        """Send keystrokes to the focused element; ``replace`` selects its content first."""
        from selenium.webdriver.common.action_chains import ActionChains

        if replace:
            self._driver.execute_script(
                "var el = document.activeElement;"
                "if (el && typeof el.select === 'function') { el.select(); }"
            )
        chain = ActionChains(self._driver, duration=0)
        for key in text:
            chain.w3c_actions.key_action.key_down(key)
            chain.w3c_actions.key_action.key_up(key)
        chain.perform()

    def press(self, key: str) -> None:
        """Press a key or combination in MiniWoB's syntax ("<Enter>", "C-a", "x")."""
        from miniwob.selenium_actions import execute_press_key

        execute_press_key(key, self._driver)

    def select_option(self, ref: int, option: str) -> str | None:
        """Choose the option whose text is ``option`` in ``<select>`` ``ref``; returns an error or None."""
        return self._driver.execute_script(
            "var el = core.previousDOMInfo[arguments[0]];"
            "if (!(el instanceof HTMLSelectElement)) { return 'element ' + arguments[0] + ' is not a select'; }"
            "var want = arguments[1].trim().toLowerCase();"
            "for (var i = 0; i < el.options.length; i++) {"
            "  if (el.options[i].text.trim().toLowerCase() === want) {"
            "    el.selectedIndex = i; el.focus();"
            "    el.dispatchEvent(new Event('input', {bubbles: true}));"
            "    el.dispatchEvent(new Event('change', {bubbles: true}));"
            "    return null;"
            "  }"
            "}"
            "return 'no option ' + JSON.stringify(arguments[1]) + ' in element ' + arguments[0];",
            int(ref),
            option,
        )

    def _wait_for(self, script: str) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self._driver.execute_script(script):
            if time.monotonic() > deadline:
                raise RuntimeError(f"MiniWoB page not ready after {READY_TIMEOUT_S} s ({self.task})")
            time.sleep(READY_POLL_S)
