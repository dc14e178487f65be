"""A built-in task set built once and kept on disk.

Building the ``search`` task set takes a minute or two (``search_qa.py``: ~36,000 candidate
questions, each searched once); a server start reads it back from a JSON file in well under a
second. The file is named by a key that changes whenever the build could give another result:

    key = sha256(task set name, build parameters, sha256(corpus file bytes),
                 sha256 of the source of every module the build runs, bm25s version)[:16]

so an edited corpus, an edited rule (``paraphrase.py``, ``search_qa.py``, ...), other split
moduli (the build parameters name the test and dev moduli: a file from before the dev split
has another key) or another BM25 version builds afresh (no version number to forget to bump).
A record whose split is not train / dev / test makes the file unreadable (rebuilt). Files live in
``$AGENTRL_JAX_CACHE/deepsearch`` (default ``~/.cache/agentrl_jax/deepsearch``). A file that
cannot be read back (truncated, edited, another layout) is rebuilt and replaced, with a warning;
writes are atomic (a temporary file renamed into place), so concurrent servers never read half
a file. ``python -m environments.deepsearch.backend`` builds the default set ahead of time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Callable, Mapping, Sequence

from environments.deepsearch import corpus, paraphrase, qa, retriever, scoring, search_qa
from environments.deepsearch.qa import QAItem

log = logging.getLogger("environments.deepsearch")

CACHE_ENV = "AGENTRL_JAX_CACHE"
#: the modules whose code decides what a build yields (their source is part of the key)
BUILD_MODULES = (corpus, paraphrase, qa, retriever, scoring, search_qa)
LAYOUT = 1  # the file's layout (fields below)
_FIELDS = ("id", "question", "golden_answers", "split", "source", "kind", "path")


def cache_dir() -> Path:
    """``$AGENTRL_JAX_CACHE/deepsearch`` (default ``~/.cache/agentrl_jax/deepsearch``)."""
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "agentrl_jax")
    return Path(root) / "deepsearch"


def _file_digest(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def code_version(modules: Sequence = BUILD_MODULES) -> str:
    """sha256 over the source files of ``modules`` and the installed bm25s version."""
    digest = hashlib.sha256()
    for module in modules:
        digest.update(Path(module.__file__).read_bytes())
    try:
        digest.update(metadata.version("bm25s").encode())
    except metadata.PackageNotFoundError:
        pass
    return digest.hexdigest()


def cache_key(name: str, corpus_file: Path, params: Mapping[str, object], version: str | None = None) -> str:
    """The file name's key (module docstring)."""
    parts = {"name": name, "params": dict(params), "corpus": _file_digest(corpus_file),
             "code": version or code_version(), "layout": LAYOUT}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _encode(items: Sequence[QAItem]) -> list[dict]:
    return [{field: getattr(item, field) for field in _FIELDS} for item in items]


def _decode(records: object) -> list[QAItem]:
    """The items of a cache file; ``ValueError`` when it is not one this code wrote."""
    if not isinstance(records, dict) or records.get("layout") != LAYOUT or not isinstance(records.get("items"), list):
        raise ValueError("not a task-set cache file of this layout")
    items = []
    for record in records["items"]:
        if not isinstance(record, dict) or set(record) != set(_FIELDS) or record["split"] not in qa.SPLITS:
            raise ValueError(f"bad record {str(record)[:80]!r}")
        items.append(QAItem(
            id=str(record["id"]), question=str(record["question"]),
            golden_answers=tuple(map(str, record["golden_answers"])), split=str(record["split"]),
            source=str(record["source"]), kind=str(record["kind"]), path=tuple(map(str, record["path"])),
        ))  # fmt: skip
    if not items:
        raise ValueError("no items")
    return items


def cache_path(name: str, corpus_file: Path, params: Mapping[str, object],
               directory: Path | None = None) -> Path:
    """The cache file of the task set ``name`` over ``corpus_file`` built with ``params``
    (it may not exist yet): ``<directory>/<name>-<key>.json``, directory default
    :func:`cache_dir`."""
    directory = Path(directory) if directory is not None else cache_dir()
    return directory / f"{name}-{cache_key(name, Path(corpus_file), params)}.json"


def load_or_build(name: str, corpus_file: Path, params: Mapping[str, object], build: Callable[[], list[QAItem]],
                  directory: Path | None = None) -> tuple[list[QAItem], bool]:
    """``(items, built)``: the task set ``name`` over ``corpus_file`` from its cache file, or
    ``build()`` written to it (``built`` True). ``params``: every build argument that changes
    the result (part of the key)."""
    path = cache_path(name, corpus_file, params, directory)
    directory = path.parent
    if path.exists():
        try:
            return _decode(json.loads(path.read_text(encoding="utf-8"))), False
        except (OSError, ValueError, TypeError, KeyError) as error:  # JSONDecodeError is a ValueError
            log.warning("deep search: rebuilding the unreadable task-set cache %s (%s)", path, error)
    items = build()
    tmp = None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=directory)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({"layout": LAYOUT, "name": name, "params": dict(params), "items": _encode(items)}, fh)
        os.replace(tmp, path)
        log.info("deep search: %d %s questions cached in %s", len(items), name, path)
    except OSError as error:  # a read-only home still serves, it builds again next time
        log.warning("deep search: could not write the task-set cache %s (%s)", path, error)
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
    return items, True

