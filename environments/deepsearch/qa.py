"""Question-answer sets for the deep-search family.

Built-in set (``build_wiki_qa``), derived deterministically from the default Wikipedia-summary
corpus, one candidate per article:

1. Take the first sentence of the summary (up to the first ". " followed by a capital letter).
2. Keep it only if it has the definitional form ``<Title> [(...)] is|was|are|were <predicate>.``
   where ``<Title>`` is the article title without a trailing disambiguation in parentheses.
3. Keep predicates of 8-40 words (shorter ones, like "a constellation in the southern sky",
   are often true of several articles) that do not contain the answer (normalised, whole tokens).
4. Question: ``"Who|What <verb> <predicate>?"`` (``Who`` for articles of the topic "People"),
   e.g. "What is a 1968 epic science fiction film produced and directed by Stanley Kubrick, ...?"
   Golden answers: the title (and the title without its disambiguation).
5. Drop every question whose text occurs for more than one article (ambiguous).

The answer is in the corpus by construction (the title heads its own passage). Task ids are
``wiki-<first 10 hex of sha1(title)>``; an article is in the test split when
``int(sha1(title), 16) % 10 == 0`` (about 10%), and a non-test article in the dev split when
``int(sha1("dev:" + title), 16) % 10 == 0`` (about a tenth of the rest, taken out of train), so
the split does not depend on file order.

User sets: JSONL lines ``{"question", "golden_answers"}`` (Search-R1; ``"answer"`` / ``"answers"``
also accepted), optional ``"id"`` and ``"split"`` (``"train"``, ``"dev"`` or ``"test"``).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import re
from pathlib import Path
from typing import Iterable, Sequence

from environments.deepsearch.corpus import CorpusError, Passage, read_jsonl_records
from environments.deepsearch.scoring import contains_answer

MIN_PREDICATE_WORDS = 8
MAX_PREDICATE_WORDS = 40
TEST_MODULUS = 10
DEV_MODULUS = 10  # about a tenth of the non-test keys are dev (lookup set, user files)
SPLITS = ("train", "dev", "test")

_SENTENCE_END = re.compile(r"\.\s+(?=[A-Z\"'(])")
_PAREN = r"\((?:[^()]|\([^()]*\))*\)"
_AFTER_TITLE = re.compile(rf"^(?:\s*{_PAREN})?\s*,?\s+(is|was|are|were)\s+(.+?)\.?$", re.S)


@dataclasses.dataclass(frozen=True)
class QAItem:
    id: str
    question: str
    golden_answers: tuple[str, ...]
    split: str
    source: str = ""  # the passage id the answer is found in (built-in sets)
    kind: str = "lookup"  # built-in sets: "lookup" (this module), "fact" / "hop" (search_qa.py)
    path: tuple[str, ...] = ()  # built-in sets: the titles of the articles to read, in order


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def hash_split(key: str, modulus: int = TEST_MODULUS, dev_modulus: int | None = None) -> str:
    """Stable across runs and machines: ``"test"`` when ``int(sha1(key), 16) % modulus == 0``
    (about 1/modulus of keys); else, with ``dev_modulus``, ``"dev"`` when
    ``int(sha1("dev:" + key), 16) % dev_modulus == 0`` (about 1/dev_modulus of the rest, a second
    hash independent of the first); else ``"train"``. The test keys do not depend on
    ``dev_modulus``: the dev split is carved out of train only."""
    if int(_digest(key), 16) % modulus == 0:
        return "test"
    if dev_modulus is not None and int(_digest(f"dev:{key}"), 16) % dev_modulus == 0:
        return "dev"
    return "train"


def first_sentence(text: str) -> str:
    match = _SENTENCE_END.search(text)
    return (text[: match.start() + 1] if match else text).strip()


def base_title(title: str) -> str:
    """``"Mercury (planet)" -> "Mercury"``."""
    return re.sub(r"\s*\([^()]*\)\s*$", "", title).strip()


def question_from_passage(passage: Passage) -> tuple[str, tuple[str, ...]] | None:
    """``(question, golden_answers)`` for a passage of definitional form, else None."""
    name = base_title(passage.title)
    if len(name) < 2:
        return None
    if not passage.text.startswith(name):
        return None
    sentence = first_sentence(passage.text)
    match = _AFTER_TITLE.match(sentence[len(name) :])
    if match is None:
        return None
    verb, predicate = match[1], " ".join(match[2].split())
    words = predicate.split()
    if not MIN_PREDICATE_WORDS <= len(words) <= MAX_PREDICATE_WORDS:
        return None
    answers = tuple(dict.fromkeys([passage.title, name]))
    if contains_answer(predicate, answers):
        return None
    wh = "Who" if passage.topic == "People" else "What"
    return f"{wh} {verb} {predicate}?", answers


def build_wiki_qa(passages: Sequence[Passage]) -> list[QAItem]:
    """The built-in QA set (see the module docstring), in corpus order."""
    candidates = []
    for passage in passages:
        made = question_from_passage(passage)
        if made is not None:
            candidates.append((passage, *made))
    counts = collections.Counter(question.lower() for _, question, _ in candidates)
    items = []
    for passage, question, answers in candidates:
        if counts[question.lower()] > 1:
            continue
        key = passage.title
        items.append(
            QAItem(
                id=f"wiki-{_digest(key)[:10]}",
                question=question,
                golden_answers=answers,
                split=hash_split(key, TEST_MODULUS, DEV_MODULUS),
                source=passage.id,
                path=(passage.title,),
            )
        )
    return items


def load_jsonl_qa(path: str | Path, split: str | None = None) -> list[QAItem]:
    """A user QA file. ``split`` forces every item's split; otherwise a record's ``"split"`` field
    is used, else ``hash_split`` of its question (about 10% test, a tenth of the rest dev)."""
    path = Path(path)
    if not path.exists():
        raise CorpusError(f"QA file {path} not found")
    items = []
    for number, record in read_jsonl_records(path):
        question = record.get("question")
        answers = record.get("golden_answers", record.get("answers", record.get("answer")))
        if isinstance(answers, str):
            answers = [answers]
        if not question or not answers:
            raise CorpusError(f"{path}:{number}: a QA record needs 'question' and 'golden_answers'")
        item_split = split or str(record.get("split") or hash_split(str(question), TEST_MODULUS, DEV_MODULUS))
        if item_split not in SPLITS:
            raise CorpusError(f"{path}:{number}: split must be one of {list(SPLITS)}, not {item_split!r}")
        item_id = str(record.get("id", f"{path.stem}-{number - 1}"))
        items.append(QAItem(item_id, str(question), tuple(str(a) for a in answers), item_split))
    if not items:
        raise CorpusError(f"QA file {path} is empty")
    return items


def check_unique_ids(items: Iterable[QAItem]) -> None:
    seen: set[str] = set()
    for item in items:
        if item.id in seen:
            raise CorpusError(f"duplicate QA id {item.id!r}")
        seen.add(item.id)
