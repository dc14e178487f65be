"""The admissible actions of a deep-search episode: what ``DeepSearchEnvironment.valid_actions``
lists (TWOSOME-style: a short ranked list the policy chooses from).

A pure function of what the agent has seen: the question, the queries it has searched and the
passages the searches returned (titles and text, newest search first). It returns at most
``MAX_ADMISSIBLE`` distinct actions in the environment's short syntax (``search q`` /
``answer a``, no tags: one token of boilerplate an option), each accepted by the environment
(``env.parse_tool_call`` reads it back unchanged): at most ``MAX_SEARCHES`` searches, then at
most ``MAX_ANSWERS`` answers::

    search q    q = the question's key phrase (what a templated question describes: "... the
                encyclopedia article on <key phrase>. ..."; without one, the question), then, before the first search
                only, the question itself (about 50 tokens: not repeated every turn), then the
                names in the key phrase, then the names found in the passages in the order the
                passages were returned (the newest search first: the current page) and the
                order of their words; never a query already searched, the title of a passage
                already returned, nor a name whose words the key phrase all contains
                ("Welles" for "the 1941 drama film by Orson Welles")
    answer a    a = the names and years of the passages' sentences, the sentences sharing most
                content words with what the question asks (``asked_part``) first (ties: the
                newest search, its best passage, reading order), years first when the question
                asks "which year", each name followed by itself without its edge words that the
                question contains ("Pacific Ocean", "Ocean"); never a span that the question
                itself contains

A *name* is a run of capitalised words, possibly joined by "of" / "the" / "de" / "van" ...
("Republic of the Congo", "Jan van Eyck"), without a leading sentence word ("In", "He", "The",
"Among", "Unlike") or a trailing "'s"; a passage's title counts as a name at the start of its
first sentence. A *year* is a four-digit number 1000-2029. *Junk* names are never listed
(``is_junk``): a name cut at an initial ("Herman J", "Booker T", "D.C": a name stops at
an initial's period), a name ending in a joining word once the question's words are trimmed
("Efficacy of"), a month or weekday ("July").

The caps (16 searches, 10 answers) and the short syntax were chosen with
``benchmarks/analysis/deepsearch_options.py`` (docs/ENVIRONMENTS.md, "Deep search"): the options
block takes ~160 SmolLM2 tokens a turn instead of ~270, and the oracle restricted to the lists
(``expert.listed_oracle_solves``) solves as many questions as before.

No golden answer can leak into the list: the function receives only the question, the searched
queries and the returned passages (it has no access to the episode's ``QAItem``, the corpus or
the index), and every span it lists is copied from those texts. Deterministic: the same inputs
give the same list (no sets are iterated, ties break by position).
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence

from environments.deepsearch.corpus import Passage
from environments.deepsearch.paraphrase import YEAR, ends_sentence, split_sentences
from environments.deepsearch.scoring import normalize_answer

#: the most actions listed (at most one per option letter a..z)
MAX_ADMISSIBLE = 26
#: search actions at most, listed first
MAX_SEARCHES = 16
#: answer actions at most, after the searches
MAX_ANSWERS = 10
#: the words that open a listed action (``env.parse_tool_call`` reads ``search q`` / ``answer a``)
SEARCH, ANSWER = "search", "answer"

_CONNECTORS = ("of", "the", "de", "del", "della", "di", "da", "du", "des", "van", "von", "der", "den", "la", "le", "y", "al", "bin", "ibn")
_CAPITALISED = r"[A-Z][\w'’.-]*\w|[A-Z]"
_NAME = re.compile(rf"(?<![\w'’-])(?:{_CAPITALISED})(?:\s+(?:(?:{'|'.join(_CONNECTORS)})\s+)*(?:{_CAPITALISED}))*")
_KEY_PHRASE_START = re.compile(r"encyclopedia article on (?=\S)")
# what may end a key phrase: ". " / ": " before a capital (a period only where it ends a
# sentence: not "J. R. R. Tolkien"), " born?" / " die?" at the end, or the question's end
_KEY_PHRASE_END = re.compile(r"[.:]\s+(?=[A-Z])|\s+(?:born|die)\?\s*$|[?:.]?\s*$")
_POSSESSIVE = re.compile(r"['’]s?$")
_CONTENT_WORD = re.compile(r"[a-z0-9]+")
#: capitalised words that start sentences rather than names; dropped from the front of a name
_SENTENCE_WORDS = frozenset("""
a an and are as at be but by for from he her his if in into is it its no not of on or she such that
the their then there these they this those to was were will with after before during since while
when where although though however today currently also many some one two other both each most
among amongst unlike like between despite following according within without under over about
through throughout across along around against because thus therefore later originally formerly
""".split())
#: words of the question that say nothing about which sentence answers it
_QUESTION_WORDS = _SENTENCE_WORDS | frozenset("""
what which who whom whose year place person consider first named encyclopedia article did was
does do is it
""".split())


def _unique(items: Iterable[str]) -> list[str]:
    seen: set[str] = set()
    return [x for x in items if not (normalize_answer(x) in seen or seen.add(normalize_answer(x)))]


def _clean(text: str) -> str:
    """``text`` as a tool-call argument: one line, no tag brackets, single spaces."""
    return " ".join(text.replace("<", " ").replace(">", " ").split())


def _key_phrase_span(question: str) -> tuple[int, int, int, int] | None:
    """``(template start, phrase start, phrase end, template end)`` of ``question``'s
    "encyclopedia article on <key phrase>" and what ends it; None without the template."""
    match = _KEY_PHRASE_START.search(question)
    if match is None:
        return None
    for end in _KEY_PHRASE_END.finditer(question, match.end() + 1):
        inside = end[0][:1] == "." and end.end() < len(question)
        if inside and not ends_sentence(question, end.start()):
            continue  # the period of an initial or abbreviation inside the phrase
        return match.start(), match.end(), end.start(), end.end()
    return None  # unreachable: the last alternative matches at the end


def key_phrase(question: str) -> str | None:
    """What a templated question describes: ``"Consider the first city named in the encyclopedia
    article on the 1434 painting by Jan van Eyck. It is ..." -> "the 1434 painting by Jan van
    Eyck"`` (a period after an initial does not end it: "... on the novel by J. R. R. Tolkien.
    It is ..." -> "the novel by J. R. R. Tolkien"); None for a question without the template."""
    span = _key_phrase_span(question)
    return question[span[1]:span[2]].strip() if span else None


def names(sentence: str) -> list[str]:
    """The names in ``sentence``, in reading order (module docstring):
    ``"In 1820 Al-Khwarizmi wrote in Baghdad, Iraq's capital." -> ["Al-Khwarizmi", "Baghdad", "Iraq"]``."""
    found = []
    for match in _NAME.finditer(sentence):
        words = match[0].split()
        while words and (words[0].lower() in _SENTENCE_WORDS or words[0].lower() in _CONNECTORS):
            words = words[1:]
        while words and words[-1].lower() in _CONNECTORS:
            words = words[:-1]
        if words:
            words[-1] = _POSSESSIVE.sub("", words[-1]) if len(words[-1]) > 2 else words[-1]
            name = " ".join(words).rstrip(".")
            if len(name) > 1 and not name.isdigit():
                found.append(name)
    return found


def _content_words(text: str) -> set[str]:
    return {w for w in _CONTENT_WORD.findall(text.lower()) if w not in _QUESTION_WORDS and len(w) > 2}


def _sentences(passage: Passage) -> list[str]:
    """The passage's sentences, its title (when it has one) at the front of the first."""
    sentences = split_sentences(passage.text) or [""]
    if passage.title:
        sentences[0] = f"{passage.title}: {sentences[0]}"
    return sentences


#: capitalised words that are dates, not names
_CALENDAR = frozenset("""
january february march april may june july august september october november december
monday tuesday wednesday thursday friday saturday sunday
""".split())


def _is_initial(word: str) -> bool:
    return len(word) == 1 or (len(word) <= 3 and "." in word)


def is_junk(name: str) -> bool:
    """Whether ``name`` is no useful search or answer (module docstring): cut at an initial
    (its last word one letter, or a dotted abbreviation such as "D.C"), ending in a joining word,
    or a month or weekday."""
    words = name.split()
    if not words or _is_initial(words[-1]) and len(words) > 1 or words[-1].lower() in _CONNECTORS:
        return True
    if len(words) == 1 and words[0].lower() in _CALENDAR:
        return True
    if "." in words[-1] and len(words[-1]) <= 4:  # "D.C", "U.S"
        return True
    return False


def search_candidates(question: str, searched: Sequence[str], seen: Sequence[Passage]) -> list[str]:
    """The queries listed (module docstring), best first, at most ``MAX_SEARCHES``."""
    done = {normalize_answer(q) for q in searched} | {normalize_answer(p.title) for p in seen if p.title}
    phrase = key_phrase(question)
    described = set(_CONTENT_WORD.findall((phrase or "").lower()))
    found = [name for passage in seen for sentence in _sentences(passage) for name in names(sentence)
             if not is_junk(name) and not set(_CONTENT_WORD.findall(name.lower())) <= described]
    head = [phrase, question] if phrase and not searched else [phrase or question]
    queries = [*head, *names(phrase or question), *found]
    queries = [q for q in map(_clean, queries) if normalize_answer(q) and normalize_answer(q) not in done]
    return _unique(queries)[:MAX_SEARCHES]


def asked_part(question: str) -> str:
    """The part of ``question`` that asks (what follows the key phrase of a templated question,
    plus its first words up to "named": ``"Consider the first city named in the encyclopedia
    article on X. It is the capital of which place?" -> "Consider the first city named It is
    the capital of which place?"``); the whole question otherwise."""
    span = _key_phrase_span(question)
    if span is None:
        return question
    return f"{question[:span[0]].replace('in the', ' ')} {question[span[3]:]}"


def _trimmed(name: str, question_words: set[str]) -> list[str]:
    """``name`` and, when its first or last words occur in the question, ``name`` without them:
    ``"Pacific Ocean"`` for "... in the southwestern Pacific what?" -> ``["Pacific Ocean", "Ocean"]``."""
    words = name.split()
    while len(words) > 1 and words[0].lower() in question_words:
        words = words[1:]
    while len(words) > 1 and words[-1].lower() in question_words:
        words = words[:-1]
    short = " ".join(words)
    return [name] if short == name else [name, short]


def answer_candidates(question: str, seen: Sequence[Passage]) -> list[str]:
    """The answers listed (module docstring), best first, at most ``MAX_ANSWERS``."""
    asked = _content_words(asked_part(question))
    question_words = set(_CONTENT_WORD.findall(question.lower()))
    wants_year = "which year" in question.lower()
    scored = []
    for rank, passage in enumerate(seen):
        for position, sentence in enumerate(_sentences(passage)):
            overlap = len(asked & _content_words(sentence))
            scored.append((-overlap, rank, position, sentence))
    ordered = [row[-1] for row in sorted(scored, key=lambda row: row[:3])]
    years = [m[0] for sentence in ordered for m in YEAR.finditer(sentence)]
    spans = [short for sentence in ordered for name in names(sentence) if not is_junk(name)
             for short in _trimmed(name, question_words) if not is_junk(short)]
    in_question = f" {normalize_answer(question)} "
    answers = [a for a in map(_clean, years + spans if wants_year else spans + years)
               if normalize_answer(a) and f" {normalize_answer(a)} " not in in_question]
    return _unique(answers)[:MAX_ANSWERS]


def admissible_actions(question: str, searched: Sequence[str], seen: Sequence[Passage],
                       limit: int = MAX_ADMISSIBLE) -> list[str]:
    """At most ``limit`` actions (module docstring) for an episode of ``question`` after the
    queries ``searched`` returned the passages ``seen`` (newest search first, each search's
    passages in rank order, each passage once): ``["search q", ..., "answer a", ...]``."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    searches = [f"{SEARCH} {q}" for q in search_candidates(question, searched, seen)]
    answers = [f"{ANSWER} {a}" for a in answer_candidates(question, seen)]
    return (searches + answers)[:limit]


def after_search(searched: Sequence[str], seen: Sequence[Passage], query: str,
                 returned: Sequence[Passage]) -> tuple[list[str], list[Passage]]:
    """What the agent has seen after ``search query`` returned ``returned``: the
    queries with ``query`` appended, and the passages with ``returned`` at the front (newest
    search first) and each passage once."""
    new_ids = {p.id for p in returned}
    return [*searched, query], [*returned, *(p for p in seen if p.id not in new_ids)]

