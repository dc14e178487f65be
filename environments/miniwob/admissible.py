"""The admissible actions of a MiniWoB++ page: what ``MiniWoBEnvironment.valid_actions`` lists.

A pure function of the page's elements (``dom_text.render``) and the task's instruction (the
utterance). Each action is one the environment accepts (``actions.parse_action`` parses it and
it names an element of the page), written as the observation's instructions teach them::

    type [ref] "text"       each text field x each candidate text (below)
    select [ref] "option"   each option of each <select> but the selected one
    click [ref]             each interactive element (buttons, links, inputs, labels, ...)
    press [Enter]           once, where a text field is on the page
    click [ref]             each other shown element with text (spans, headers, paragraphs)

in that order (the kinds above are the tiers, most useful first; page order within a tier),
without duplicates, the first ``MAX_ADMISSIBLE`` (26: one option letter each). The order uses
the page's structure only, never which element the instruction names.

Candidate texts for ``type``: MiniWoB's instructions quote what to enter (``Enter "Kiara" into
the text field``): the quoted strings, in order, each followed by its upper-case or lower-case
form where the instruction asks for ``upper case`` / ``lower case``; with nothing quoted, up to
``MAX_TOKEN_CANDIDATES`` words of the instruction (not its first word, not a common word of
instructions), those with a digit or a capital first. A ``type`` that would leave the field's
value as it is, and a ``select`` of the option already selected, are left out (they change
nothing).
"""

from __future__ import annotations

import json
import re
from typing import Iterable, Sequence

from environments.miniwob.dom_text import Element

#: the most actions listed: one per option letter a..z
MAX_ADMISSIBLE = 26
#: candidate texts taken from the instruction's words where it quotes nothing
MAX_TOKEN_CANDIDATES = 3
#: candidate texts at most (quoted strings and their case forms)
MAX_TEXT_CANDIDATES = 6

#: input types that take typed text (dom_text tags are ``input_<type>``)
TEXT_FIELD_TAGS = frozenset({"textarea", "input_text", "input_password", "input_email", "input_search",
                             "input_tel", "input_url", "input_number"})  # fmt: skip
#: elements clicked in the first click tier (``select`` is driven by ``select`` actions instead)
INTERACTIVE_CLICK_TAGS = frozenset({"button", "a", "label", "summary", "option", "textarea"})

_QUOTED = re.compile(r'"([^"]*)"')
_WORD_EDGES = ".,;:!?()[]{}'\"“”‘’"
_COMMON_WORDS = frozenset("""
a an the and or of to in into on onto at by for from with as is are be it its this that then than
all any both each either one two some no not only also your you
click select enter type press submit choose find focus close expand switch search use fill set go
button buttons field fields text textbox box input inputs form list link links tab tabs item items
option options dialog section page widget widgets case letters letter below above
""".split())


def _quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _unique(items: Iterable[str]) -> list[str]:
    seen: set[str] = set()
    return [x for x in items if not (x in seen or seen.add(x))]


def candidate_texts(instruction: str) -> list[str]:
    """What a ``type`` action may enter, from the task's instruction (module docstring):
    ``'Type "ab" in all upper case letters' -> ["ab", "AB"]``,
    ``"Book a flight from: LEB to: RDG" -> ["LEB", "RDG", "flight"]``."""
    quoted = [q for q in _QUOTED.findall(instruction) if q.strip()]
    lowered = instruction.lower()
    texts: list[str] = []
    for q in quoted:
        texts.append(q)
        if "upper case" in lowered or "uppercase" in lowered:
            texts.append(q.upper())
        if "lower case" in lowered or "lowercase" in lowered:
            texts.append(q.lower())
    if quoted:
        return _unique(texts)[:MAX_TEXT_CANDIDATES]
    words = [w.strip(_WORD_EDGES) for w in instruction.split()[1:]]
    words = _unique(w for w in words if w and w.lower() not in _COMMON_WORDS)
    marked = [w for w in words if any(c.isdigit() or c.isupper() for c in w)]
    return _unique(marked + words)[:MAX_TOKEN_CANDIDATES]


def admissible_actions(elements: Sequence[Element], instruction: str, limit: int = MAX_ADMISSIBLE) -> list[str]:
    """The page's admissible actions, most useful first (module docstring), at most ``limit``.

    elements: the page's elements in page order (``render``'s dict values; those not
    ``shown`` are skipped); instruction: the task's utterance."""
    shown = [e for e in elements if e.shown]
    fields = [e for e in shown if e.tag in TEXT_FIELD_TAGS]
    texts = candidate_texts(instruction) if fields else []
    actions = [f"type [{e.ref}] {_quote(t)}" for e in fields for t in texts if t != e.value]
    actions += [f"select [{e.ref}] {_quote(o)}" for e in shown if e.tag == "select"
                for o in e.options if o != e.selected]
    interactive = [e for e in shown if e.tag.startswith("input") or e.tag in INTERACTIVE_CLICK_TAGS]
    actions += [f"click [{e.ref}]" for e in interactive]
    if fields:
        actions.append("press [Enter]")
    clicked = {e.ref for e in interactive}
    actions += [f"click [{e.ref}]" for e in shown if e.text and e.tag != "select" and e.ref not in clicked]
    return _unique(actions)[:limit]
