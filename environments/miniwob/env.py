"""The MiniWoB++ web-navigation environment over a text view of the page.

Observation: the task's instruction (MiniWoB's "utterance") and the page's visible elements, one
per line with a ref (see ``dom_text.py``). Actions: ``click [ref]``, ``type [ref] "text"``,
``select [ref] "option"``, ``press [key]`` (see ``actions.py``). ``valid_actions()`` lists the
page's admissible ones (``admissible.py``), which the server appends for ``list_actions`` sessions.

Reward: MiniWoB ends the episode itself (a right or wrong final click, a submitted form); the
step that ends it gets reward 1.0 when MiniWoB's raw reward is > 0 (``success``), else 0.0.
``info["score"]`` is MiniWoB's raw reward in [-1, 1] (some tasks give partial credit). The
episode timer is disabled, so think time never costs reward. After ``max_steps`` actions without
an outcome the episode is ``truncated``.

Each instance owns one headless Chromium, started on the first ``reset`` and reused across
episodes and tasks; ``close()`` kills it and its chromedriver.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from environments.core.base import ResetResult, StepResult, TextEnvironment
from environments.miniwob.actions import parse_action
from environments.miniwob.admissible import admissible_actions
from environments.miniwob.browser import MiniWoBBrowser
from environments.miniwob.catalog import SUPPORTED_TASKS, data_mode_of_seed, make_task_id, parse_task_id, split_of_seed
from environments.miniwob.dom_text import Element, render

log = logging.getLogger("environments.miniwob")

INSTRUCTIONS = """You operate a web page to complete the task stated at the top of each observation. \
The page is shown as a list of elements, one per line, each with a reference number in brackets, \
its tag, its text in quotes and its state (value=, checked=, selected=, focused). Indentation \
shows nesting. Answer with exactly one action per turn:
  click [ref]             click the element (links, buttons, checkboxes, tabs, labels, fields)
  type [ref] "text"       click the input field and replace its content with text
  select [ref] "option"   choose an option of a select element by its text
  press [key]             press a key such as Enter, Tab, Backspace or ctrl+a
The page updates after each action. The episode ends when the task is completed or failed \
(for example by clicking a wrong button), or after {max_steps} actions."""


class MiniWoBEnvironment(TextEnvironment):
    """One browser, any number of episodes of the supported MiniWoB++ tasks.

    max_steps: actions per episode before ``truncated``.
    settle_s: pause after each action before reading the page (for pages with animations).
    refresh_every: reload the task page every this many episodes (bounds page memory growth).
    """

    name = "miniwob"

    def __init__(self, max_steps: int = 15, settle_s: float = 0.0, refresh_every: int = 100) -> None:
        self.max_steps = max_steps
        self.settle_s = settle_s
        self.refresh_every = refresh_every
        self.browser = MiniWoBBrowser()
        self._elements: dict[int, Element] = {}
        self._utterance = ""
        self._task_id: str | None = None
        self._steps = 0
        self._episodes_on_page = 0
        self._active = False
        self._closed = False

    def reset(self, task_id: str, seed: int | None = None) -> ResetResult:
        """Start ``task_id`` (``"<task>/seed=<n>"``; a bare task name uses ``seed``)."""
        if self._closed:
            raise RuntimeError("this MiniWoB environment is closed")
        task, episode_seed = parse_task_id(task_id, seed)
        try:
            if self.browser.task == task and self._episodes_on_page >= self.refresh_every:
                self.browser.task = None  # force a reload of the page
            if self.browser.task != task:
                self._episodes_on_page = 0
            self.browser.open_task(task)
            self.browser.begin_episode(episode_seed, data_mode=data_mode_of_seed(episode_seed))
            self._episodes_on_page += 1
            observation = self._observe()
        except Exception:
            self.browser.close()  # a broken browser is restarted by the next reset
            raise
        self._task_id = make_task_id(task, episode_seed)
        self._steps = 0
        self._active = True
        info = {
            "task_id": self._task_id,
            "task_name": task,
            "seed": episode_seed,
            "split": split_of_seed(episode_seed),
            "max_steps": self.max_steps,
            "instructions": INSTRUCTIONS.format(max_steps=self.max_steps),
            "utterance": self._utterance,
        }
        return ResetResult(observation=observation, info=info)

    def step(self, action: str) -> StepResult:
        if not self._active:
            raise RuntimeError("step() before reset(), or after the episode ended")
        self._steps += 1
        try:
            return self._step(action)
        except Exception:
            self._active = False
            self.browser.close()  # a browser in an unknown state is replaced at the next reset
            raise

    def _step(self, action: str) -> StepResult:
        info: dict[str, Any] = {"steps": self._steps, "invalid_action": False}
        parsed = parse_action(action)
        error = self._execute(parsed)
        if error:
            info["invalid_action"] = True
        if self.settle_s:
            time.sleep(self.settle_s)
        meta = self.browser.metadata()
        if meta.get("done"):
            raw = float(meta.get("raw_reward") or 0.0)
            success = raw > 0
            self._active = False
            info.update(success=success, score=raw, reason=meta.get("reason"))
            observation = f"The episode is over: the task was {'completed' if success else 'failed'}."
            return StepResult(observation=observation, reward=1.0 if success else 0.0, done=True, info=info)
        observation = self._observe()
        if error:
            observation = f"Invalid action: {error}\n\n{observation}"
        truncated = self._steps >= self.max_steps
        if truncated:
            self._active = False
        info.update(success=False, score=0.0)
        return StepResult(observation=observation, reward=0.0, done=False, truncated=truncated, info=info)

    def valid_actions(self) -> list[str] | None:
        """The current page's admissible actions (``admissible.admissible_actions``: typing the
        instruction's quoted texts into fields, choosing options, clicking elements, pressing
        Enter), at most 26, from the elements of the last observation (no browser call); None
        between episodes."""
        if not self._active:
            return None
        return admissible_actions(list(self._elements.values()), self._utterance)

    def close(self) -> None:
        """Kill the browser and chromedriver. Idempotent."""
        self._closed = True
        self._active = False
        self.browser.close()

    # -- helpers

    def _observe(self) -> str:
        self._utterance = self.browser.utterance()
        page, self._elements = render(self.browser.dom())
        return f"Task: {self._utterance}\n\nPage:\n{page}"

    def _execute(self, parsed) -> str:
        """Run a parsed action; returns an error message for actions that could not be applied."""
        if parsed.kind == "invalid":
            return parsed.error
        if parsed.kind == "press":
            self.browser.press(parsed.text)
            return ""
        element = self._elements.get(parsed.ref)
        if element is None:
            return f"there is no element [{parsed.ref}] on the page"
        if parsed.kind == "click":
            return self.browser.click(parsed.ref) or ""
        if parsed.kind == "type":
            failure = self.browser.click(parsed.ref)
            if failure:
                return failure
            self.browser.type_text(parsed.text)
            return ""
        if parsed.kind == "select":
            return self.browser.select_option(parsed.ref, parsed.text) or ""
        return f"unknown action kind {parsed.kind}"  # pragma: no cover


__all__ = ["MiniWoBEnvironment", "SUPPORTED_TASKS"]
