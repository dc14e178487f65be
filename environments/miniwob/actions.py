"""Parse the web-navigation action language.

    click [ref]              click an element
    type [ref] "text"        click an input, replace its content with text (quotes optional)
    select [ref] "option"    choose an option of a <select> by its text
    press [key]              press a key: Enter, Tab, Backspace, Escape, ArrowDown, ... or a
                             combination like ctrl+a (also MiniWoB's own "<Enter>", "C-a")

Brackets around refs and keys are optional. The parser never raises: a string that is not an
action becomes ``ParsedAction(kind="invalid", error=...)``.
"""

from __future__ import annotations

import dataclasses
import json
import re

# element refs are 1 to 9 ASCII digits (a longer number is no element; int() of 4,300 digits raises)
_CLICK = re.compile(r"^click\s*\[?\s*([0-9]{1,9})\s*\]?$", re.I)
_TYPED = re.compile(r"^(type|select)\s*\[?\s*([0-9]{1,9})\s*\]?\s*(.*)$", re.I | re.S)
_PRESS = re.compile(r"^press\s*\[?\s*([^\]]+?)\s*\]?$", re.I)

_MODIFIERS = {"ctrl": "C-", "control": "C-", "shift": "S-", "alt": "A-", "meta": "M-", "cmd": "M-"}
_KEY_ALIASES = {
    "enter": "Enter", "return": "Enter", "tab": "Tab", "backspace": "Backspace", "escape": "Escape",
    "esc": "Escape", "space": "Space", "delete": "Delete", "del": "Delete", "home": "Home", "end": "End",
    "pageup": "PageUp", "pagedown": "PageDown", "arrowup": "ArrowUp", "arrowdown": "ArrowDown",
    "arrowleft": "ArrowLeft", "arrowright": "ArrowRight", "up": "ArrowUp", "down": "ArrowDown",
    "left": "ArrowLeft", "right": "ArrowRight",
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class ParsedAction:
    kind: str  # "click" | "type" | "select" | "press" | "invalid"
    ref: int | None = None
    text: str = ""
    error: str = ""


def _unquote(text: str) -> str:
    """The argument of ``type`` / ``select``: quotes or brackets around it are removed, also a
    lone opening or closing quote (agent-side parsers often strip one end)."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':
        try:
            return str(json.loads(text))
        except ValueError:
            return text[1:-1]
    if len(text) >= 2 and ((text[0] == "[" and text[-1] == "]") or text[0] == text[-1] == "'"):
        return text[1:-1]
    if text[:1] in ('"', "'") and text[-1:] not in ('"', "'"):
        return text[1:]
    if text[-1:] in ('"', "'") and text[:1] not in ('"', "'"):
        return text[:-1]
    return text


def miniwob_key(key: str) -> str | None:
    """``"ctrl+a" -> "C-a"``, ``"Enter" -> "<Enter>"``, ``"<Tab>"`` and ``"x"`` unchanged; None if unknown."""
    from miniwob.constants import WEBDRIVER_SPECIAL_KEYS

    key = key.strip()
    if key in WEBDRIVER_SPECIAL_KEYS or (len(key) == 1 and key.isprintable()):
        return key
    if m := re.fullmatch(r"((?:[CSAM]-)+)(.+)", key):  # MiniWoB's own modifier syntax
        rest = miniwob_key(m[2])
        return None if rest is None else m[1] + rest
    prefix = ""
    parts = [p for p in re.split(r"\s*\+\s*", key) if p]
    if not parts:
        return None
    for part in parts[:-1]:
        modifier = _MODIFIERS.get(part.lower())
        if modifier is None:
            return None
        prefix += modifier
    last = parts[-1]
    if len(last) == 1 and last.isprintable():
        return prefix + last
    name = _KEY_ALIASES.get(last.lower(), last)
    special = f"<{name}>"
    return prefix + special if special in WEBDRIVER_SPECIAL_KEYS else None


def parse_action(action: str) -> ParsedAction:
    """Parse one action string (surrounding whitespace and a trailing period are ignored)."""
    text = str(action).strip()
    if text.endswith(".") and not text.endswith('".'):
        text = text[:-1].rstrip()
    if text.endswith('".'):
        text = text[:-1]
    if not text:
        return ParsedAction("invalid", error="empty action")
    if m := _CLICK.match(text):
        return ParsedAction("click", ref=int(m[1]))
    if m := _TYPED.match(text):
        kind = m[1].lower()
        return ParsedAction(kind, ref=int(m[2]), text=_unquote(m[3]))
    if m := _PRESS.match(text):
        key = miniwob_key(m[1])
        if key is None:
            return ParsedAction("invalid", error=f"unknown key {m[1]!r}")
        return ParsedAction("press", text=key)
    return ParsedAction(
        "invalid",
        error='not an action; use click [ref], type [ref] "text", select [ref] "option" or press [key]',
    )
