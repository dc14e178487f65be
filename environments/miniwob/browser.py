"""One headless Chromium (via chromedriver + Selenium) driving MiniWoB++ task pages.

This is a small replacement for ``miniwob.selenium_instance`` that (a) reuses one browser across
tasks and episodes, (b) passes the flags a root, offline, GPU-less box needs, (c) switches the
10-second episode timer off (an LLM agent thinks for longer than that) and (d) kills every
process it started on ``close()``: the pids of chromedriver and all its descendants are recorded,
and whatever survives ``driver.quit()`` is SIGTERMed, then SIGKILLed. Browsers still open at
interpreter exit are closed by an ``atexit`` hook. chromedriver stays in the caller's process group,
so ``launcher.ServerProcess.stop()`` (which signals the server's whole group) reaches the browsers
even if the server dies without cleaning up.

It talks to the task page through MiniWoB's own JavaScript API (``core.*``), exactly as
``miniwob.selenium_instance`` does.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import signal
import time
import weakref
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

_LIVE: "weakref.WeakSet[MiniWoBBrowser]" = weakref.WeakSet()


class BrowserUnavailableError(RuntimeError):
    """Chromium or chromedriver (or the miniwob package) is not installed."""


def chrome_paths() -> tuple[str, str]:
    """``(chromium binary, chromedriver)``: ``MINIWOB_CHROME_BINARY`` / ``MINIWOB_CHROMEDRIVER``, else
    ``chromium`` / ``chromedriver`` on ``PATH`` (Debian's packages put them in /usr/bin)."""
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


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (None if it is gone): with the pid, it
    identifies a process even after the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode(errors="replace")
    except OSError:
        return None
    return int(stat[stat.rfind(")") + 2 :].split()[19])


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
        self._known: dict[int, int | None] = {}  # pid -> start time
        self.task: str | None = None
        self.episodes = 0

    # -- processes

    def start(self) -> None:
        """Start chromedriver + Chromium (slow: seconds). Called lazily by ``open_task``."""
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
        service = Service(executable_path=driver_path, log_output=os.devnull)
        self._driver = webdriver.Chrome(service=service, options=options)
        self._driver_pid = service.process.pid
        self._remember([self._driver_pid, *descendants(self._driver_pid)])
        self._driver.set_script_timeout(30)
        _LIVE.add(self)

    def _remember(self, pids: list[int]) -> None:
        for pid in pids:
            if pid not in self._known:
                self._known[pid] = start_time(pid)

    @property
    def pids(self) -> set[int]:
        """chromedriver and the Chromium processes started by it that are still running."""
        if self._driver_pid is not None and pid_alive(self._driver_pid):
            self._remember(descendants(self._driver_pid))
        return {pid for pid, started in self._known.items() if pid_alive(pid) and start_time(pid) == started}

    def close(self) -> None:
        """Quit the browser and make sure chromedriver and all Chromium processes are gone. Idempotent."""
        driver, self._driver = self._driver, None
        if driver is None:
            return
        pids = self.pids
        with contextlib.suppress(Exception):
            driver.quit()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in pids:  # only processes that are still the ones we started (pid + start time)
                if pid_alive(pid) and start_time(pid) == self._known.get(pid):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, sig)
            deadline = time.monotonic() + 2.0
            while self._survivors(pids) and time.monotonic() < deadline:
                time.sleep(0.02)
            if not self._survivors(pids):
                break
        # reap chromedriver if it is our child (avoids a zombie)
        with contextlib.suppress(Exception):
            driver.service.process.wait(timeout=1)
        self._driver_pid = None
        self._known.clear()
        self.task = None
        _LIVE.discard(self)

    def _survivors(self, pids: set[int]) -> list[int]:
        return [p for p in pids if pid_alive(p) and start_time(p) == self._known.get(p)]

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


@atexit.register
def _close_all() -> None:
    """Close the browsers that are still open when the interpreter exits."""
    for browser in list(_LIVE):
        with contextlib.suppress(Exception):
            browser.close()
