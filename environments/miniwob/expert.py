"""A rule-based expert for the supported MiniWoB++ tasks that reads only the text observation.

It parses the same text the agent sees (the ``Task:`` line and the element lines of
``dom_text.render``), so solving a task with it shows that the text interface carries enough
information. One ``MiniWoBExpert`` plays one episode at a time: call ``reset()`` between episodes
(it remembers which tabs it opened and which buttons it clicked).
"""

from __future__ import annotations

import dataclasses
import json
import re

_LINE = re.compile(r'^(?P<indent> *)\[(?P<ref>\d+)\] (?P<tag>\S+)(?: (?P<text>"(?:[^"\\]|\\.)*"))?(?P<rest>.*)$')
_ATTR = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\[[^\]]*\]|\S+)')
_ORDINALS = {"1st": 0, "2nd": 1, "3rd": 2, "4th": 3, "5th": 4, "6th": 5}
_WIDGET_TAGS = {
    "checkbox": "input_checkbox",
    "radio": "input_radio",
    "text": "input_text",
    "textarea": "textarea",
    "button": "button",
}


@dataclasses.dataclass
class PageElement:
    """One element line of the observation."""

    ref: int
    tag: str
    text: str
    depth: int
    attrs: dict[str, str]


def parse_observation(observation: str) -> tuple[str, list[PageElement]]:
    """``(utterance, elements)`` from an observation made by ``MiniWoBEnvironment``."""
    utterance = ""
    elements: list[PageElement] = []
    for line in observation.splitlines():
        if line.startswith("Task: "):
            utterance = line[len("Task: ") :].strip()
            continue
        m = _LINE.match(line)
        if not m:
            continue
        text = json.loads(m["text"]) if m["text"] else ""
        attrs = {k: (json.loads(v) if v.startswith('"') else v) for k, v in _ATTR.findall(m["rest"])}
        elements.append(PageElement(int(m["ref"]), m["tag"], text, len(m["indent"]) // 2, attrs))
    return utterance, elements


def _quoted(utterance: str) -> list[str]:
    return re.findall(r'"([^"]*)"', utterance)


def _quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


class MiniWoBExpert:
    """``act(task, observation) -> action`` for every task in ``catalog.SUPPORTED_TASKS``."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._done_refs: list[int] = []
        self._typed: set[int] = set()
        self._visited_tabs: set[str] = set()

    # -- helpers over the parsed page

    @staticmethod
    def _find(elements: list[PageElement], text: str, tags: tuple[str, ...] | None = None) -> PageElement | None:
        """The element whose text is ``text`` (exact first, then case-insensitive)."""
        pool = [e for e in elements if tags is None or e.tag in tags]
        for match in (lambda e: e.text == text, lambda e: e.text.lower() == text.lower()):
            for element in pool:
                if match(element):
                    return element
        return None

    @staticmethod
    def _of_tag(elements: list[PageElement], *tags: str) -> list[PageElement]:
        return [e for e in elements if e.tag in tags]

    def _click(self, element: PageElement | None) -> str:
        if element is None:
            return "press Tab"  # nothing sensible to do: a harmless action
        self._done_refs.append(element.ref)
        return f"click [{element.ref}]"

    def _type(self, element: PageElement | None, text: str) -> str:
        if element is None:
            return "press Tab"
        self._typed.add(element.ref)
        return f"type [{element.ref}] {_quote(text)}"

    def _submit(self, elements: list[PageElement], label: str = "submit") -> str:
        buttons = self._of_tag(elements, "button")
        target = self._find(buttons, label) or (buttons[-1] if buttons else None)
        return self._click(target)

    def _boxes(self, elements: list[PageElement], wanted: set[str], input_tag: str) -> str:
        """Tick exactly the boxes whose label is in ``wanted``, then submit."""
        for i, element in enumerate(elements):
            if element.tag != "label":
                continue
            box = next((e for e in elements[i + 1 :] if e.tag == input_tag and e.depth > element.depth), None)
            if box is None:
                continue
            checked = box.attrs.get("checked") == "true"
            if (element.text in wanted) != checked:
                return self._click(box)
        return self._submit(elements)

    # -- the policy

    def act(self, task: str, observation: str) -> str:
        utterance, elements = parse_observation(observation)
        quoted = _quoted(utterance)
        buttons = self._of_tag(elements, "button")

        if task == "click-test":
            return self._click(buttons[0] if buttons else None)
        if task in ("click-test-2", "click-button-sequence"):
            names = re.findall(r"button (\w+)", utterance)
            for name in names:
                target = self._find(buttons, name)
                if target is not None and target.ref not in self._done_refs:
                    return self._click(target)
            return self._click(self._find(buttons, names[-1]) if names else None)
        if task in ("click-button", "unicode-test"):
            return self._click(self._find(buttons, quoted[0]))
        if task == "click-link":
            return self._click(self._find(elements, quoted[0], ("span", "a")))
        if task == "click-dialog":
            return self._click(self._find(buttons, "Close"))
        if task == "click-dialog-2":
            label = quoted[0]
            return self._click(self._find(buttons, "Close" if label == "x" else label))
        if task in ("click-checkboxes", "click-option"):
            m = re.match(r"Select (.*) and click Submit\.?$", utterance)
            names = m[1] if m else ""
            wanted = set() if names == "nothing" else {n.strip() for n in names.split(",") if n.strip()}
            return self._boxes(elements, wanted, "input_checkbox" if task == "click-checkboxes" else "input_radio")
        if task == "click-tab":
            m = re.search(r"(Tab #\d+)", utterance)
            return self._click(self._find(elements, m[1] if m else "", ("a",)))
        if task == "click-tab-2":
            target = self._find(elements, quoted[0], ("span", "a"))
            if target is not None and not target.text.startswith("Tab #"):
                return self._click(target)
            for tab in self._of_tag(elements, "a"):
                if tab.text.startswith("Tab #") and tab.text not in self._visited_tabs:
                    self._visited_tabs.add(tab.text)
                    return self._click(tab)
            return self._click(None)
        if task == "click-widget":
            tag = _WIDGET_TAGS.get(quoted[0], quoted[0])
            matches = self._of_tag(elements, tag)
            return self._click(matches[0] if matches else None)
        if task == "click-collapsible-nodelay":
            headers = [e for e in elements if e.tag == "h3"]
            if headers and not self._done_refs:
                return self._click(headers[0])
            return self._submit(elements)
        if task == "choose-list":
            m = re.match(r"Select (.*) from the list", utterance)
            select = next(iter(self._of_tag(elements, "select")), None)
            if select is not None and m and select.attrs.get("selected") != m[1]:
                return f"select [{select.ref}] {_quote(m[1])}"
            return self._submit(elements)
        if task in ("enter-text", "enter-text-dynamic", "enter-text-2"):
            text = quoted[0]
            if "lower case" in utterance:
                text = text.lower()
            elif "upper case" in utterance:
                text = text.upper()
            field = next(iter(self._of_tag(elements, "input_text")), None)
            if field is not None and field.ref not in self._typed:
                return self._type(field, text)
            return self._submit(elements)
        if task == "enter-password":
            for field in self._of_tag(elements, "input_password"):
                if field.ref not in self._typed:
                    return self._type(field, quoted[0])
            return self._submit(elements)
        if task == "login-user":
            username, password = quoted[0], quoted[1]
            for field in self._of_tag(elements, "input_text", "input_password"):
                if field.ref not in self._typed:
                    return self._type(field, username if field.tag == "input_text" else password)
            return self._submit(elements, "Login")
        if task == "focus-text":
            return self._click(next(iter(self._of_tag(elements, "input_text")), None))
        if task == "focus-text-2":
            m = re.search(r"(\d+(?:st|nd|rd|th))", utterance)
            fields = self._of_tag(elements, "input_text")
            index = _ORDINALS.get(m[1], 0) if m else 0
            return self._click(fields[index] if index < len(fields) else None)
        raise ValueError(f"the expert does not know task {task!r}")


class MiniWoBExpertPolicy:
    """The rule-based MiniWoB++ expert for the task named by the task id."""

    def __init__(self, task_id: str):
        from environments.miniwob.catalog import parse_task_id

        self.task, _ = parse_task_id(task_id)
        self.expert = MiniWoBExpert()

    def act(self, observation: str) -> str | None:
        return self.expert.act(self.task, observation)
