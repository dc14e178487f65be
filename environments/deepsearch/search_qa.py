"""The ``search`` task set: deep-search questions that a single search with the question does
not answer. Built deterministically from the Wikipedia-summary corpus and its BM25 index.

Two kinds of question, both naming articles only by their Wikipedia ``description`` (e.g.
"American daily newspaper"; only descriptions that are unique in the corpus, at least two words
long and free of the article's title):

* ``fact``: a fact from INSIDE one article A (a sentence after the first, 6-40 words), rewritten
  by ``paraphrase.question_clause`` (A's names -> "it", connective dropped, the answer -> a
  question word, synonyms): "In the encyclopedia article on the italian Renaissance architect
  (1377-1446): He is regarded to be a founding father of what?" The answer is another article's
  title that the sentence names (golden answers: the title and the title without its
  disambiguation) or a year.
* ``hop``: B is the first article of its kind ("person" for people, else the head noun of B's
  description: "country", "city", "composer") that A's text names; the question describes A and
  asks B's birth / death year (people whose description carries them) or a fact of one of B's
  sentences that A's text does not contain: "In which year did the first person named in the
  encyclopedia article on the trojan hero in Greco-Roman mythology die?", "Consider the first
  city named in the encyclopedia article on the islamic scholar and jurist (1263-1328). It is
  the capital and biggest town of which place?"

A one-word title counts as named by a sentence (as an answer, or as B) only outside a longer
proper name (``paraphrase.standalone_mentions``): "Kingdom" in "United Kingdom" or "Kingdom of
Belgium" is no mention of the article "Kingdom (taxonomy)" ("Europe" in "Northern Europe", after
a lone compass word, is one of "Europe").

Filters (each question must pass all):
1. the answer occurs in the supporting article (A for ``fact``, B for ``hop``), not in the
   question, and (``hop``) not in A's text;
2. no title of the articles on the question's path occurs in the question;
3. a single BM25 search with the question text does NOT return the supporting article in its
   top ``k``;
4. each article on the path is in the top ``k`` of a search for its own title (the oracle's plan,
   ``expert.py``, can be carried out);
5. the question text is unique.

At most one ``fact`` question per article A and ``HOPS_PER_ARTICLE`` ``hop`` questions (one per
B); the first candidate in reading order that passes. Filter 3 is the binding one: of ~19,000
candidates about 1% pass (the summaries are short and BM25 matches their rare words; measured
with the command in docs/ENVIRONMENTS.md). Split BY ARTICLE: an article is held out when ``hash_split(title,
SEARCH_TEST_MODULUS)`` says ``"test"``; a question goes with its supporting article, and
``split_by_article`` keeps the splits disjoint by article (a ``hop`` question's first article
goes with it only when no question of the other split uses it). The dev split is then carved out
of train the same way: a train question whose supporting article ``hash_split(title,
SEARCH_TEST_MODULUS, SEARCH_DEV_MODULUS)`` puts in dev becomes a dev question, and train and dev
are made disjoint by article by the same rule, so no article supports questions of two splits;
the test questions do not change. Ids: ``fact-`` / ``hop-`` + the first 10 hex of sha1 of the
path and the answer.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import re
from typing import Callable, Collection, Iterable, Sequence

from environments.deepsearch.corpus import Passage
from environments.deepsearch.paraphrase import (YEAR, mentioned_titles, question_clause, split_sentences, standalone_mentions,
                                               whole_word, words)
from environments.deepsearch.qa import QAItem, base_title, hash_split
from environments.deepsearch.scoring import contains_answer

SEARCH_TEST_MODULUS = 3
SEARCH_DEV_MODULUS = 4  # about a quarter of the training articles are dev (50 of 247 questions)
SEARCH_FILTER_K = 3  # filters 3-4: top-k of one search
QUESTIONS_PER_ANSWER = 2  # near-duplicates: the same supporting article and answer
MIN_CLAUSE_WORDS = 6
MAX_CLAUSE_WORDS = 40
MIN_TITLE_CHARS = 4
CANDIDATES_PER_ARTICLE = 6


def task_sentences(text: str) -> list[str]:
    """The sentences questions are made from: every ". " before a capital ends one, initials
    and abbreviations included (``split_sentences(abbreviations=False)``). The task set keeps
    the split it was frozen with: the split that keeps "J. R. R. Tolkien" whole drops one
    train question (a clause cut at "U.S.": "... discovered in January which year by U.S?")
    and so changes the frozen train set (tests/test_deepsearch_search_qa.py), a change of the
    task set of its own."""
    return split_sentences(text, abbreviations=False)


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def names_of(passage: Passage) -> tuple[str, ...]:
    """The title and the title without its disambiguation (the golden answers for a title)."""
    return tuple(dict.fromkeys([passage.title, base_title(passage.title)]))


def with_the(description: str, common_words: Collection[str] = frozenset()) -> str:
    """``"Species of canine" -> "the species of canine"``, ``"American daily newspaper" -> "the
    American daily newspaper"``: the first word is lowercased when ``common_words`` (words seen
    in lower case inside descriptions) has it."""
    text = description.strip().rstrip(".")
    first = text.split(" ", 1)[0]
    if first.lower() in common_words and first[1:].islower():
        text = text[0].lower() + text[1:]
    return text if text.lower().startswith(("the ", "a ", "an ")) else f"the {text}"


class _Corpus:
    """Look-ups over the passages that question making needs."""

    def __init__(self, passages: Sequence[Passage]) -> None:
        self.by_title = {p.title: p for p in passages}
        keys: dict[str, list[str]] = collections.defaultdict(list)
        for passage in passages:
            name = base_title(passage.title)
            if len(name) >= MIN_TITLE_CHARS and name[:1].isupper():
                keys[" ".join(words(name))].append(passage.title)
        # a base name shared by two articles ("Mercury (planet)", "Mercury (element)") links neither
        self.title_keys = {key: titles[0] for key, titles in keys.items() if len(titles) == 1}
        self.common_words = {w for p in passages for w in p.description.split()[1:] if w.isalpha() and w.islower()}
        counts = collections.Counter(p.description.strip().lower() for p in passages)
        self.describable = {
            p.title
            for p in passages
            if len(p.description.split()) >= 2
            and counts[p.description.strip().lower()] == 1
            and not contains_answer(p.description, names_of(p))
            and not any(contains_answer(p.description, [w]) for w in words(base_title(p.title)) if len(w) >= MIN_TITLE_CHARS)
        }

    def wh_word(self, answer: str) -> str:
        if YEAR.fullmatch(answer):
            return "which year"
        topic = self.by_title[answer].topic
        return {"People": "which person", "Geography": "which place"}.get(topic, "what")

    def answers(self, passage: Passage, sentence: str) -> list[tuple[str, tuple[str, ...]]]:
        """``(answer in the sentence, golden answers)``: titles named (not the passage's own; a
        one-word title only outside a longer proper name, ``first_named_at``), then years."""
        own = set(names_of(passage))
        found = []
        for title in mentioned_titles(sentence, self.title_keys):
            if title not in own and base_title(title) not in own and self.first_named_at(sentence, title) is not None:
                found.append((base_title(title), names_of(self.by_title[title])))
        found += [(year, (year,)) for year in dict.fromkeys(m[0] for m in YEAR.finditer(sentence))]
        return found

    @staticmethod
    def first_named_at(text: str, title: str) -> int | None:
        """Where ``text`` first names the article ``title`` (its ``base_title`` as whole words);
        a ONE-word name inside a longer proper name does not count ("Kingdom" in "United
        Kingdom" or "Kingdom of Belgium": ``paraphrase.standalone_mentions``). None: nowhere."""
        name = base_title(title)
        if len(words(name)) == 1:
            spans = standalone_mentions(text, name)
            return spans[0][0] if spans else None
        match = whole_word(name).search(text)
        return None if match is None else match.start()

    def clauses(self, passage: Passage, sentences: Iterable[str]) -> Iterable[tuple[str, tuple[str, ...], str]]:
        """``(clause, golden answers, answer)`` for the passage's sentences, in reading order."""
        for sentence in sentences:
            for answer, golden in self.answers(passage, sentence):
                clause = question_clause(sentence, answer, self.wh_word(answer if YEAR.fullmatch(answer) else golden[0]), names_of(passage))
                if clause and MIN_CLAUSE_WORDS <= len(clause.split()) <= MAX_CLAUSE_WORDS:
                    yield clause[0].upper() + clause[1:], golden, answer


def _clean(question: str, golden: Sequence[str], path: Sequence[Passage]) -> bool:
    """Filters 1-2 on the text."""
    if contains_answer(question, golden) or not contains_answer(path[-1].contents, golden):
        return False
    return not any(contains_answer(question, names_of(p)) for p in path)


_LIFE = re.compile(r"\((?:c\.\s*)?(?:born\s+)?(\d{3,4})(?:\s*[–-]\s*(?:c\.\s*)?(\d{3,4}))?\)")
_HEAD_END = {"of", "in", "by", "from", "for", "with", "and", "or", "native", "that", "which", "on", "at", "to", "whose"}
HOPS_PER_ARTICLE = 3


def kind_of(b: Passage) -> str | None:
    """What a question calls B: "person" for people, else the head noun of B's description
    ("Nordic country in Northern Europe" -> "country"); None when there is none."""
    if b.topic == "People":
        return "person"
    head = []
    for word in b.description.split():
        if word.lower() in _HEAD_END or not word.isalpha():
            break
        head.append(word)
    if not head:
        return None
    last = head[-1] if len(head) > 1 else head[0][:1].lower() + head[0][1:]  # the first word is capitalised
    return last if last.islower() else None


def first_mentions(a: Passage, corpus: _Corpus) -> list[Passage]:
    """The articles A's text names, in reading order of their first mention (A itself excluded;
    a one-word title only outside a longer proper name, ``_Corpus.first_named_at``)."""
    found = []
    for title in mentioned_titles(a.text, corpus.title_keys):
        start = corpus.first_named_at(a.text, title)
        if title != a.title and start is not None:
            found.append((start, title))
    return [corpus.by_title[title] for _, title in sorted(found)]


def hop_questions(a: Passage, a_clue: str, corpus: _Corpus) -> Iterable[tuple[Passage, str, tuple[str, ...], str]]:
    """``(B, question, golden, answer)`` for the first person and the first place A names: its
    birth / death year (people whose description carries them), then facts of its sentences."""
    seen_kinds = set()
    for b in first_mentions(a, corpus):
        kind = kind_of(b)
        if kind is None or kind in seen_kinds:
            continue
        seen_kinds.add(kind)
        subject = f"the first {kind} named in the encyclopedia article on {a_clue}"
        life = _LIFE.search(b.description) if kind == "person" else None
        if life is not None:
            for verb, year in (("born", life[1]), ("die", life[2])):
                if year:
                    wh = "was" if verb == "born" else "did"
                    yield b, f"In which year {wh} {subject} {verb}?", (year,), year
        for clause, golden, answer in corpus.clauses(b, task_sentences(b.text)):
            yield b, f"Consider {subject}. {clause}?", golden, answer


def candidates(passages: Sequence[Passage], corpus: _Corpus, modulus: int) -> list[QAItem]:
    """Every article's first ``CANDIDATES_PER_ARTICLE`` questions of each kind, filters 1-2 applied."""
    made: list[QAItem] = []
    for a in passages:
        if a.title not in corpus.describable:
            continue
        split = hash_split(a.title, modulus)
        a_clue = with_the(a.description, corpus.common_words)
        facts = 0
        for clause, golden, answer in corpus.clauses(a, task_sentences(a.text)[1:]):
            question = f"In the encyclopedia article on {a_clue}: {clause}?"
            if facts < CANDIDATES_PER_ARTICLE and _clean(question, golden, [a]):
                facts += 1
                made.append(QAItem(f"fact-{_digest(a.title + '|' + answer)[:10]}", question, golden, split, a.id, "fact", (a.title,)))
        hops: collections.Counter = collections.Counter()
        for b, question, golden, answer in hop_questions(a, a_clue, corpus):
            if hops[b.title] >= CANDIDATES_PER_ARTICLE:
                continue
            if contains_answer(a.contents, golden) or not _clean(question, golden, [a, b]):
                continue
            hops[b.title] += 1
            made.append(QAItem(f"hop-{_digest(a.title + '|' + b.title + '|' + answer)[:10]}", question, golden,
                               hash_split(b.title, modulus), b.id, "hop", (a.title, b.title)))
    return made


def build_search_qa(passages: Sequence[Passage], retriever, k: int = SEARCH_FILTER_K, modulus: int = SEARCH_TEST_MODULUS,
                    dev_modulus: int | None = SEARCH_DEV_MODULUS) -> list[QAItem]:
    """The ``search`` task set (module docstring), in corpus order. ``retriever``: a
    ``BM25Retriever`` over ``passages`` (its ``search_many`` is used for filters 3-4);
    ``dev_modulus`` None: no dev split."""
    return split_by_article(search_questions(passages, retriever, k, modulus), modulus, dev_modulus=dev_modulus)


def search_questions(passages: Sequence[Passage], retriever, k: int = SEARCH_FILTER_K,
                     modulus: int = SEARCH_TEST_MODULUS) -> list[QAItem]:
    """Every question that passes filters 1-5 (the limits per article and per answer applied),
    in corpus order, with its supporting article's train / test split, before
    ``split_by_article``."""
    corpus = _Corpus(passages)
    pool = candidates(passages, corpus, modulus)
    found = retriever.search_many([item.question for item in pool], k)
    titles = sorted({t for item in pool for t in item.path})
    reachable = {t for t, results in zip(titles, retriever.search_many(titles, k)) if t in results}
    kept: dict[tuple[str, ...], QAItem] = {}
    hops: collections.Counter = collections.Counter()
    per_answer: collections.Counter = collections.Counter()
    for item, top in zip(pool, found):
        key = (item.kind, *item.path)
        if key in kept or item.path[-1] in top or not all(t in reachable for t in item.path):
            continue
        if per_answer[item.path[-1], item.golden_answers[0]] >= QUESTIONS_PER_ANSWER:
            continue
        if item.kind == "hop":
            if hops[item.path[0]] >= HOPS_PER_ARTICLE:
                continue
            hops[item.path[0]] += 1
        per_answer[item.path[-1], item.golden_answers[0]] += 1
        kept[key] = item
    counts = collections.Counter(item.question.lower() for item in kept.values())
    ids = collections.Counter(item.id for item in kept.values())
    return [item for item in kept.values() if counts[item.question.lower()] == 1 and ids[item.id] == 1]


def split_by_article(items: Sequence[QAItem], modulus: int = SEARCH_TEST_MODULUS,
                     dev_modulus: int | None = None) -> list[QAItem]:
    """The questions that keep the splits disjoint by article, in their order.

    A question's split is its supporting article's (``item.split``, train or test); an article
    may serve as the first hop of another split's question only when no question of its own
    split uses it (``claimed``, test questions first). With ``dev_modulus``, the dev split
    is then carved out of the train questions kept: a question whose supporting article
    (``path[-1]``) ``hash_split(title, modulus, dev_modulus)`` puts in dev becomes a dev
    question, and the same rule makes train and dev disjoint by article (dev questions first).
    The test questions are the same with or without ``dev_modulus`` (after the first pass no
    kept train question shares an article with a test question).
    """
    kept = [items[i] for i in claimed(items, lambda title: hash_split(title, modulus), scarce="test")]
    if dev_modulus is None:
        return kept

    def home(title: str) -> str:
        return hash_split(title, modulus, dev_modulus)

    carved = [dataclasses.replace(item, split="dev") if item.split == "train" and home(item.path[-1]) == "dev"
              else item for item in kept]
    train_dev = [i for i, item in enumerate(carved) if item.split != "test"]
    keep = {train_dev[j] for j in claimed([carved[i] for i in train_dev], home, scarce="dev")}
    return [item for i, item in enumerate(carved) if item.split == "test" or i in keep]


def claimed(items: Sequence[QAItem], home: Callable[[str], str], scarce: str) -> list[int]:
    """The indices (ascending) of the questions kept when every article may support questions of
    one split only. Greedy, deterministic: first every question whose articles all have its
    split as their ``home`` (these never conflict), then the others, ``scarce``-split questions
    first (the held-out questions are the scarce ones), each claiming its articles for its split
    and dropped when one is already claimed by another split."""
    owner: dict[str, str] = {}
    order = sorted(range(len(items)), key=lambda i: (
        any(home(t) != items[i].split for t in items[i].path), items[i].split != scarce, i))
    kept = []
    for i in order:
        item = items[i]
        if any(owner.get(t, item.split) != item.split for t in item.path):
            continue
        owner.update((t, item.split) for t in item.path)
        kept.append(i)
    return sorted(kept)
