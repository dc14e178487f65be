"""Deterministic rewriting rules that turn a sentence of a summary into a question clause.

Used by the search task set (``search_qa.py``). Pure functions of their arguments:

* ``split_sentences(text)``: sentences end at ". " before a capital letter, a quote or "(",
  except after an initial or an abbreviation (``ends_sentence``: "J. R. R. Tolkien", "St.
  Peter's", "the U.S. Army" stay one sentence; "in the U.S. In 1900 ..." is two).
* ``mentioned_titles(sentence, titles)``: the corpus titles a sentence names, as whole words
  (longest first; one-word titles only away from the sentence start, where capitals are names).
* ``standalone_mentions(text, name)``: where ``name`` occurs outside a longer proper name
  ("Kingdom" in "United Kingdom" or "Kingdom of Belgium" does not count; "Europe" in "Northern
  Europe" does).
* ``question_clause(sentence, answer, wh, self_names)``: the sentence with

  1. an appositive of other names (", officially the Republic of India,", ", also known as
     ...,") dropped, then every name of the article it comes from (``self_names``: title, title
     without its disambiguation) replaced by "it"; ``None`` when a name is part of a longer
     proper name ("the Republic of India", "Cairo Governorate": "it" there would read "the
     Republic of it"); a name's own article goes with it ("The Netherlands is" -> "It is");
  2. a leading connective ("However, ", "In addition, ", ...) dropped;
  3. the answer (with an article before it) replaced by the question word ``wh`` ("which
     year", "what", "which person");
  4. words changed by the fixed synonym table ``SYNONYMS`` (one pass, so no rule feeds another;
     the first letter keeps its case);
  5. the final period replaced by "?" by the caller.

  ``None`` when the answer does not occur exactly once as whole words.
"""

from __future__ import annotations

import re
from typing import Iterable, Mapping

_SENTENCE_END = re.compile(r"\.\s+(?=[A-Z\"'(])")
_WORD = re.compile(r"\w+(?:[-'’]\w+)*")
YEAR = re.compile(r"(?<![\w.,-])(1[0-9]{3}|20[0-2][0-9])(?![\w-])")
MAX_TITLE_WORDS = 6

#: word -> replacement, applied once per word (whole words, case-insensitive on the first letter)
SYNONYMS: Mapping[str, str] = {
    "approximately": "roughly", "began": "started", "begins": "starts",
    "biggest": "largest", "largest": "biggest", "built": "constructed", "called": "named",
    "named": "called", "commonly": "usually", "usually": "typically", "considered": "regarded",
    "created": "made", "died": "passed away", "during": "in the course of", "established": "set up",
    "famous": "well known", "first": "earliest", "founded": "established", "important": "significant",
    "including": "such as", "known": "recognised", "large": "big", "located": "situated", "main": "principal", "major": "leading", "many": "numerous",
    "often": "frequently", "produced": "made", "received": "got",
    "released": "put out", "several": "a number of", "small": "little", "started": "began",
    "together": "jointly", "used": "employed", "uses": "employs", "using": "employing",
    "widely": "broadly", "won": "gained", "wrote": "authored", "written": "authored",
    "became": "turned into", "country": "nation", "city": "town",
    "film": "movie", "largely": "mostly", "also": "additionally", "known as": "called",
}
_MULTI = sorted(SYNONYMS, key=len, reverse=True)
_SYNONYM = re.compile(r"\b(" + "|".join(re.escape(w) for w in _MULTI) + r")\b", re.I)
_APPOSITIVE = re.compile(
    r",\s*(?:officially|formally|also known as|also called|known officially as|commonly known as|sometimes called)\b[^,;]*,"
)
_ARTICLE_BEFORE = re.compile(r"(?<![\w])(?:[Tt]he|an?)\s+(?=\x00)")  # "the which place" -> "which place"
_CAPITALISED = r"(?:[A-Z][\w'’-]*)"
_CONNECTIVE = re.compile(
    r"^(?:However|In addition|Additionally|Furthermore|Moreover|Also|Today|Currently|Nevertheless|Thus|Therefore)\s*,\s*"
)


#: words that end in a period without ending a sentence (titles, "St." of saints and places)
ABBREVIATIONS = frozenset({"St", "Dr", "Mr", "Mrs", "Ms", "Mt", "Prof", "Rev", "Gen", "Col",
                           "Lt", "Capt", "Sgt", "Fr", "Hon", "Gov", "Sen", "Rep", "Pres"})
#: capitalised words that open a sentence, not a name: after an initial or abbreviation they
#: still end it ("in the U.S. In 1900 ...", "a subset of A. It is ...")
SENTENCE_OPENERS = frozenset("""
The In It He She They This These Those His Her Its Their There Then After Before During Since
While When Although Though However Today Following As On At By For From Due Many Most Some An
Is Was We Our But And Also Other Unlike Like According With Under Between Despite Both Each
""".split())
# the word before a period: one capital letter (an initial; not "I", mostly the numeral of
# "World War I."; not after a non-breaking space, a unit: "1.6 J."), or letters joined by
# periods ("U.S", "D.C", "G.I")
_INITIAL = re.compile(r"(?<![^ (\"'])(?:[A-HJ-Z]|[A-Za-z](?:\.[A-Za-z])+)$")
_WORD_BEFORE = re.compile(r"(?<![\w.])[A-Z][a-z]*$")
_NEXT_WORD = re.compile(r"\s+([\w'’-]+)")
_ABBREVIATION_CHARS = 16  # the longest word before a period that is looked at


def ends_sentence(text: str, period: int) -> bool:
    """Whether the period at ``text[period]`` (followed by a space and a capital, a quote or
    "(") ends a sentence: not after an initial ("J. R. R. Tolkien", "Franklin D. Roosevelt";
    "I" excepted), a dotted abbreviation ("U.S. Army") or a word of ``ABBREVIATIONS`` ("St.
    Peter"), unless the next word is one of ``SENTENCE_OPENERS`` ("in the U.S. In 1900") or
    a line break follows."""
    start = max(0, period - _ABBREVIATION_CHARS)  # lookbehinds still see text before start
    word = _WORD_BEFORE.search(text, start, period)
    abbreviated = (_INITIAL.search(text, start, period) is not None
                   or (word is not None and word[0] in ABBREVIATIONS))
    if not abbreviated:
        return True
    after = _NEXT_WORD.match(text, period + 1)
    return after is None or "\n" in after[0] or after[1] in SENTENCE_OPENERS


def split_sentences(text: str, abbreviations: bool = True) -> list[str]:
    """The sentences of ``text``, each with its final period: ``ends_sentence`` decides which
    ". " before a capital, a quote or "(" ends one; ``abbreviations=False``: every one does
    (the split the ``search`` task set is built with, ``search_qa.py``)."""
    parts, start = [], 0
    for match in _SENTENCE_END.finditer(text):
        if abbreviations and not ends_sentence(text, match.start()):
            continue
        parts.append(text[start : match.start() + 1].strip())
        start = match.end()
    tail = text[start:].strip()
    if tail:
        parts.append(tail)
    return [p for p in parts if p]


def words(text: str) -> list[str]:
    return _WORD.findall(text)


def whole_word(phrase: str) -> re.Pattern:
    return re.compile(r"(?<![\w])" + re.escape(phrase) + r"(?![\w])")


def mentioned_titles(sentence: str, titles: Mapping[str, str]) -> list[str]:
    """Titles (values of ``titles``, keyed by their words joined by spaces) named in ``sentence``:
    n-grams of 1..``MAX_TITLE_WORDS`` words, longest first, then in reading order; a one-word
    title counts only past the first word and when capitalised."""
    tokens = words(sentence)
    found: list[str] = []
    for n in range(min(MAX_TITLE_WORDS, len(tokens)), 0, -1):
        for i in range(len(tokens) - n + 1):
            key = " ".join(tokens[i : i + n])
            title = titles.get(key)
            if title is None or title in found:
                continue
            if n == 1 and (i == 0 or not key[:1].isupper()):
                continue
            if whole_word(key).search(sentence) is None:  # the words are adjacent in the text
                continue
            found.append(title)
    return found


def _keep_case(old: str, new: str) -> str:
    return new[:1].upper() + new[1:] if old[:1].isupper() else new


def rewrite_words(text: str) -> str:
    """Step 4: one pass of ``SYNONYMS``."""
    return _SYNONYM.sub(lambda m: _keep_case(m[0], SYNONYMS[m[0].lower()]), text)


def inside_proper_name(text: str, name: str) -> bool:
    """Whether ``name`` occurs in ``text`` as part of a longer proper name: after a capitalised
    word other than the sentence's first (optionally joined by "of" / "of the": "Republic of
    India") or before one ("Cairo Governorate")."""
    escaped = re.escape(name)
    before = re.compile(rf"(?<![\w])(?<!^){_CAPITALISED}\s+(?:of\s+(?:the\s+)?)?{escaped}(?![\w])")
    after = re.compile(rf"(?<![\w]){escaped}\s+{_CAPITALISED}")
    return bool(before.search(text) or after.search(text))


_SENTENCE_START = re.compile(r"(?:^|[.!?][\"'’)]?\s+)$")
_CAPITALISED_BEFORE = re.compile(r"(?<![\w'’-])([A-Z][\w'’-]*)\s+$")
_NAME_GOES_ON = re.compile(rf"\s+(?:of\s+(?:the\s+)?)?{_CAPITALISED}")
#: a capitalised word before a name that names a part of the same place ("Northern Europe")
COMPASS_WORDS = frozenset({
    "North", "South", "East", "West", "Northern", "Southern", "Eastern", "Western", "Central",
    "Northeast", "Northwest", "Southeast", "Southwest", "Northeastern", "Northwestern", "Southeastern", "Southwestern",
})


def _starts_sentence(text: str, start: int) -> bool:
    return _SENTENCE_START.search(text, 0, start) is not None


def standalone_mentions(text: str, name: str) -> list[tuple[int, int]]:
    """The ``(start, end)`` character spans where ``name`` occurs in ``text`` as whole words and
    NOT as part of a longer proper name, in reading order. An occurrence is part of a longer
    name when

    * a capitalised word comes right before it that does not start a sentence (the start of
      ``text`` or after ". " / "! " / "? "): "United Kingdom", "New South Wales", unless that
      word is a lone compass word (``COMPASS_WORDS``, itself not after another capitalised word):
      "Northern Europe", "West Asia" name a part of Europe / Asia and count; or
    * a capitalised word comes right after it, directly or after "of" / "of the": "Western
      Hemisphere", "Kingdom of Belgium", "State of Palestine".

    ``standalone_mentions("Brussels is in the Kingdom of Belgium and in Europe.", "Kingdom") ==
    []``; ``standalone_mentions("The Kingdom is a rank.", "Kingdom") == [(4, 11)]`` ("The" starts
    the sentence)."""
    spans = []
    for match in whole_word(name).finditer(text):
        before = _CAPITALISED_BEFORE.search(text, 0, match.start())
        if before is not None and not _starts_sentence(text, before.start()):
            earlier = _CAPITALISED_BEFORE.search(text, 0, before.start())
            lone_compass = before[1] in COMPASS_WORDS and (earlier is None or _starts_sentence(text, earlier.start()))
            if not lone_compass:
                continue
        if _NAME_GOES_ON.match(text, match.end()):
            continue
        spans.append(match.span())
    return spans


def question_clause(sentence: str, answer: str, wh: str, self_names: Iterable[str]) -> str | None:
    """Steps 1-4 of the module docstring; the clause without its final punctuation."""
    pattern = YEAR if wh == "which year" and YEAR.fullmatch(answer) else whole_word(answer)
    if len([m for m in pattern.finditer(sentence) if m[0] == answer]) != 1:
        return None
    placeholder = "\x00"
    text = pattern.sub(lambda m: placeholder if m[0] == answer else m[0], sentence)
    text = _APPOSITIVE.sub("", text)
    for name in sorted(set(self_names), key=len, reverse=True):
        if name and name != answer:
            if inside_proper_name(text, name):
                return None
            text = re.compile(r"(?<![\w])(?:[Tt]he\s+)?" + re.escape(name) + r"(?![\w])").sub("it", text)
    text = _CONNECTIVE.sub("", text.strip())
    text = rewrite_words(text)
    text = _ARTICLE_BEFORE.sub("", text).replace(placeholder, wh)
    text = text.rstrip(" .;:")
    if text.startswith("it ") or text.startswith("it'"):
        text = "It" + text[2:]
    return " ".join(text.split()) or None
