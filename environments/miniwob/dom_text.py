"""Render a MiniWoB DOM tree (``core.getDOMInfo()``) as text lines with element refs.

Each shown element is one line, indented by nesting::

    [9] button "Submit" id=subbtn
    [7] input_text id=username value=""
    [6] input_checkbox checked=false
    [5] label "fzzqo"
    [4] select id=options options=["Bobine", "Ferne"] selected="Bobine"

Rules: an element is shown when it has text or can be interacted with (inputs, buttons, links,
labels, selects, text areas); containers without text are skipped (their children are shown one
level up). Text nodes between elements are folded into their parent's text. ``<body>`` is not
shown. Refs are stable within an episode and are what the ``click`` / ``type`` / ``select``
actions take.
"""

from __future__ import annotations

import dataclasses
from typing import Any

INTERACTIVE_TAGS = frozenset({"button", "a", "select", "textarea", "label", "option", "summary"})
MAX_TEXT = 300


@dataclasses.dataclass(frozen=True)
class Element:
    """One element of the page (shown or not), with the state its line shows: ``value`` of an
    input or text area, ``options`` and ``selected`` of a ``<select>``, ``focused``."""

    ref: int
    tag: str
    text: str
    shown: bool
    value: str = ""
    options: tuple[str, ...] = ()
    selected: str | None = None
    focused: bool = False


def _quote(text: str) -> str:
    text = " ".join(text.split())
    if len(text) > MAX_TEXT:
        text = text[: MAX_TEXT - 3] + "..."
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _text_of(node: dict[str, Any]) -> str:
    """The element's own text (leaf) or the text of its direct text-node children."""
    own = node.get("text")
    if own:
        return str(own).strip()
    parts = [str(c.get("text", "")).strip() for c in node.get("children", []) if c.get("tag", "").lower() == "t"]
    return " ".join(p for p in parts if p)


def _is_interactive(tag: str) -> bool:
    return tag.startswith("input") or tag in INTERACTIVE_TAGS


def render(root: dict[str, Any]) -> tuple[str, dict[int, Element]]:
    """``(text, elements)``: the page as lines, and every element by ref (shown or not)."""
    selects: dict[str, dict[str, Any]] = root.get("selects") or {}
    lines: list[str] = []
    elements: dict[int, Element] = {}

    def visit(node: dict[str, Any], depth: int, is_root: bool) -> None:
        tag = str(node.get("tag", "")).lower()
        if tag == "t":
            return
        ref = int(node["ref"])
        text = _text_of(node)
        shown = not is_root and (bool(text) or _is_interactive(tag))
        select = selects.get(str(ref)) if tag == "select" else None
        elements[ref] = Element(
            ref=ref, tag=tag, text=text, shown=shown,
            value="" if tag in ("input_checkbox", "input_radio") else str(node.get("value") or ""),
            options=tuple(str(o) for o in select.get("options", [])) if select else (),
            selected=None if not select or select.get("selected") is None else str(select["selected"]),
            focused=bool(node.get("focused")),
        )  # fmt: skip
        if shown:
            parts = [f"[{ref}] {tag}"]
            if text and not tag.startswith("input"):
                parts.append(_quote(text))
            if node.get("id"):
                parts.append(f"id={node['id']}")
            if tag in ("input_checkbox", "input_radio"):
                parts.append(f"checked={'true' if node.get('value') else 'false'}")
            elif tag.startswith("input") or tag == "textarea":
                parts.append(f"value={_quote(str(node.get('value') or ''))}")
            if select is not None:
                parts.append("options=[" + ", ".join(_quote(o) for o in select.get("options", [])) + "]")
                if select.get("selected") is not None:
                    parts.append(f"selected={_quote(select['selected'])}")
            if node.get("focused"):
                parts.append("focused")
            lines.append("  " * depth + " ".join(parts))
        for child in node.get("children", []):
            visit(child, depth + 1 if shown else depth, False)

    visit(root, 0, True)
    return "\n".join(lines), elements
