"""A seekable, incrementally built index of a run's trajectory JSONL files.

One :class:`FileIndex` per JSONL file keeps, for every complete line (one episode), its byte
offset and length plus a fixed-size record of summary fields (:data:`RECORD`: step, env, task,
status, reward, success, turns, invalid actions, token counts, group, ...), and appends the
episode's searchable text (lower-cased task id, episode id, error and every non-system message)
to a text file. Nothing of the episode itself is kept in memory: a page of results is served by
seeking to the rows' offsets.

The index grows incrementally: :meth:`FileIndex.update` reads only the bytes appended since the
last call (a line is indexed once its newline is written, so a half-written last line waits), and
rebuilds from scratch when the file shrank or its first bytes changed (it was replaced). With a
cache directory the records, the text and the string vocabularies are stored as append-only files
plus a ``meta.json`` written last (atomically), so a restart re-reads only the new tail; a crash
between the two leaves longer data files than ``meta.json`` says, which are truncated on load.

:class:`RunIndex` combines the files of one run into one table (:class:`Table`) and answers
:class:`Query` objects (filters, text search, sort, paging) with NumPy over the records.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import json
import logging
import math
import mmap
import os
import re
import tempfile
import threading
from typing import Any, Iterable, Sequence

import numpy as np

try:  # faster than json on these large lines; the stdlib is the fallback
    import orjson

    def _loads(b: bytes) -> Any:
        return orjson.loads(b)
except ImportError:  # pragma: no cover - orjson is a runtime dependency
    def _loads(b: bytes) -> Any:
        return json.loads(b)

log = logging.getLogger(__name__)

INDEX_VERSION = 1

#: one index record per episode (little-endian, fixed size: the cache file is an array of these)
RECORD = np.dtype([
    ("offset", "<i8"),  # byte offset of the line in the JSONL file
    ("length", "<i4"),  # bytes of the line, without the newline
    ("step", "<i4"),  # training step (-1: not recorded)
    ("env", "<i4"),  # code into the file's "env" vocabulary
    ("task", "<i4"),  # code into the "task" vocabulary
    ("status", "<i4"),  # code into the "status" vocabulary
    ("reward", "<f8"),
    ("success", "i1"),
    ("num_turns", "<i4"),
    ("invalid", "<i4"),  # invalid_actions
    ("n_tokens", "<i4"),  # len(token_ids) (-1: not recorded)
    ("n_trained", "<i4"),  # sum(loss_mask) (-1: not recorded)
    ("group_id", "<i4"),
    ("sample_index", "<i4"),
    ("policy_version", "<i4"),
    ("horizon", "<i4"),
    ("has_error", "i1"),  # a non-empty "error" field
    ("text_offset", "<i8"),  # the episode's searchable text in the text file
    ("text_length", "<i4"),
])
VOCAB_COLUMNS = ("env", "task", "status")
ERROR_STATUSES = ("env_error", "engine_error")
_INT32_MAX = 2**31 - 1
_READ_CHUNK = 8 << 20  # bytes read per block while indexing
_TEXT_SEP = b"\x00"  # between two episodes' texts: a search term cannot contain it


def default_cache_dir() -> str:
    """``$AGENTRL_JAX_CACHE/viewer`` (default ``~/.cache/agentrl_jax/viewer``)."""
    root = os.environ.get("AGENTRL_JAX_CACHE",
                          os.path.join(os.path.expanduser("~"), ".cache", "agentrl_jax"))
    return os.path.join(root, "viewer")


def _int(value: Any, default: int = -1) -> int:
    """An int32 from a JSON value (bools, floats and numeric strings too), else ``default``."""
    try:
        v = int(value)
    except (TypeError, ValueError, OverflowError):
        return default
    return v if -_INT32_MAX <= v <= _INT32_MAX else default


def _float(value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return 0.0
    return v if math.isfinite(v) else 0.0


def episode_text(ep: dict[str, Any]) -> str:
    """The searchable text of an episode (lower-cased): env, task id, episode id, status, error
    and every message except the system prompt (the same long instructions in every episode of
    an environment, which would make every episode match its words)."""
    parts = [str(ep.get(k) or "") for k in ("env", "task_id", "episode_id", "status", "error")]
    for m in ep.get("messages") or ():
        if isinstance(m, dict) and m.get("role") != "system":
            parts.append(str(m.get("content") or ""))
    return "\n".join(parts).lower().replace("\x00", " ")


class FileIndex:
    """The index of one JSONL file of episodes (see the module docstring).

    ``kind``: ``train`` / ``eval`` / ``other`` (from the file name); ``default_step``: the step
    of records that have none (the checkpoint step of a ``launch/eval.py`` output).
    ``cache_dir``: where the index files live (``None``: a private temporary directory, removed
    with the object).
    """

    def __init__(self, path: str, kind: str = "other", default_step: int = -1,
                 cache_dir: str | None = None):
        self.path = os.path.abspath(path)
        self.kind = kind
        self.default_step = int(default_step)
        self._lock = threading.RLock()  # guards the published state (rows, vocabularies, mmap)
        self._update_lock = threading.Lock()  # one update at a time (parsing runs unlocked)
        self._tmp: tempfile.TemporaryDirectory | None = None
        if cache_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="agentrl_viewer_")
            self.dir = self._tmp.name
        else:
            key = hashlib.sha1(self.path.encode()).hexdigest()[:16]
            self.dir = os.path.join(cache_dir, f"{os.path.basename(self.path)}-{key}")
        os.makedirs(self.dir, exist_ok=True)
        self._rows = np.zeros(1024, RECORD)
        self.n = 0  # indexed rows
        self.vocab: dict[str, list[str]] = {c: [] for c in VOCAB_COLUMNS}
        self._codes: dict[str, dict[str, int]] = {c: {} for c in VOCAB_COLUMNS}
        self.indexed_bytes = 0  # the file is indexed up to here (always just after a newline)
        self.text_bytes = 0
        self.bad_lines = 0  # complete lines that are not a JSON object (skipped)
        self.signature = ""  # sha1 of the first sig_length bytes of the file
        self.sig_length = 0
        self.inode = -1
        self.size = 0  # file size at the last update
        self.version = 0  # bumped on every change (rows added or a rebuild)
        self._mm: mmap.mmap | None = None
        self._mm_len = 0
        if cache_dir is not None:
            self._load_cache()

    # ------------------------------------------------------------------ cache files
    def _p(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def _load_cache(self) -> None:
        try:
            with open(self._p("meta.json")) as f:
                meta = json.load(f)
            if meta.get("version") != INDEX_VERSION or meta.get("path") != self.path:
                raise ValueError("stale index format")
            n, text_bytes = int(meta["rows"]), int(meta["text_bytes"])
            rows = np.fromfile(self._p("rows.bin"), RECORD, count=n)
            if len(rows) != n or os.path.getsize(self._p("text.bin")) < text_bytes:
                raise ValueError("truncated index files")
            vocab: dict[str, list[str]] = {c: [] for c in VOCAB_COLUMNS}
            with open(self._p("vocab.jsonl")) as f:
                for _, line in zip(range(int(meta["vocab_entries"])), f):
                    column, value = json.loads(line)
                    vocab[column].append(value)
            if sum(len(v) for v in vocab.values()) != int(meta["vocab_entries"]):
                raise ValueError("truncated vocabulary")
        except (OSError, ValueError, KeyError, TypeError) as e:
            if os.path.exists(self._p("meta.json")):
                log.info("index cache %s not used (%s); rebuilding", self.dir, e)
            self._reset_files()
            return
        # drop whatever a crash appended after meta.json was last written
        self._truncate("rows.bin", n * RECORD.itemsize)
        self._truncate("text.bin", text_bytes)
        self._rewrite_vocab(vocab)
        self._rows = np.zeros(max(1024, n * 2), RECORD)
        self._rows[:n] = rows
        self.n = n
        self.vocab = vocab
        self._codes = {c: {v: i for i, v in enumerate(vs)} for c, vs in vocab.items()}
        self.indexed_bytes = int(meta["indexed_bytes"])
        self.text_bytes = text_bytes
        self.bad_lines = int(meta.get("bad_lines", 0))
        self.signature, self.sig_length = meta["signature"], int(meta["sig_length"])
        self.inode = int(meta.get("inode", -1))
        self.version += 1

    def _truncate(self, name: str, size: int) -> None:
        with open(self._p(name), "r+b") as f:
            f.truncate(size)

    def _rewrite_vocab(self, vocab: dict[str, list[str]]) -> None:
        with open(self._p("vocab.jsonl"), "w") as f:
            for column, values in vocab.items():
                for v in values:
                    f.write(json.dumps([column, v]) + "\n")

    def _reset_files(self) -> None:
        for name in ("rows.bin", "text.bin", "vocab.jsonl"):
            open(self._p(name), "wb").close()
        try:
            os.remove(self._p("meta.json"))
        except OSError:
            pass

    def _write_meta(self) -> None:
        meta = {"version": INDEX_VERSION, "path": self.path, "rows": self.n,
                "text_bytes": self.text_bytes, "indexed_bytes": self.indexed_bytes,
                "vocab_entries": sum(len(v) for v in self.vocab.values()),
                "bad_lines": self.bad_lines, "signature": self.signature,
                "sig_length": self.sig_length, "inode": self.inode}
        tmp = self._p(f"meta.json.tmp{os.getpid()}")
        with open(tmp, "w") as f:
            json.dump(meta, f)
        os.replace(tmp, self._p("meta.json"))

    # ------------------------------------------------------------------ building
    def _reset(self) -> None:
        with self._lock:
            self._close_mmap()
            self._reset_files()
            self._rows = np.zeros(1024, RECORD)
            self.n = 0
            self.vocab = {c: [] for c in VOCAB_COLUMNS}
            self._codes = {c: {} for c in VOCAB_COLUMNS}
            self.indexed_bytes = self.text_bytes = self.bad_lines = 0
            self.signature, self.sig_length, self.inode = "", 0, -1
            self.version += 1

    @staticmethod
    def _head_signature(path: str, length: int) -> str:
        with open(path, "rb") as f:
            return hashlib.sha1(f.read(length)).hexdigest()

    def _code(self, column: str, value: Any, vocab_out: list) -> int:
        s = "" if value is None else str(value)
        codes = self._codes[column]
        code = codes.get(s)
        if code is None:
            code = codes[s] = len(self.vocab[column])
            self.vocab[column].append(s)
            vocab_out.append(json.dumps([column, s]))
        return code

    def _record(self, ep: dict[str, Any], offset: int, length: int, text_offset: int,
                text_length: int, vocab_out: list) -> tuple:
        tokens, mask = ep.get("token_ids"), ep.get("loss_mask")
        n_trained = -1
        if isinstance(mask, list):
            try:
                n_trained = int(sum(1 for m in mask if m))
            except TypeError:
                n_trained = -1
        step = _int(ep.get("step"), self.default_step)
        return (offset, length, step, self._code("env", ep.get("env"), vocab_out),
                self._code("task", ep.get("task_id"), vocab_out),
                self._code("status", ep.get("status") or "unknown", vocab_out),
                _float(ep.get("reward")), 1 if ep.get("success") else 0,
                _int(ep.get("num_turns"), 0), _int(ep.get("invalid_actions"), 0),
                len(tokens) if isinstance(tokens, list) else -1, n_trained,
                _int(ep.get("group_id")), _int(ep.get("sample_index")),
                _int(ep.get("policy_version")), _int(ep.get("horizon")),
                1 if ep.get("error") else 0, text_offset, text_length)

    def update(self, max_bytes: int | None = None) -> int:
        """Index the lines appended since the last call (at most about ``max_bytes`` of the file
        in this call; ``None``: all). Returns the number of new rows; rebuilds from scratch when
        the file was replaced or truncated; a missing file is an empty index."""
        with self._update_lock:
            try:
                st = os.stat(self.path)
            except OSError:
                if self.n or self.indexed_bytes:
                    self._reset()
                self.size = 0
                return 0
            self.size = st.st_size
            if self.indexed_bytes and (
                    st.st_size < self.indexed_bytes or st.st_ino != self.inode
                    or self._head_signature(self.path, self.sig_length) != self.signature):
                log.info("%s was replaced or truncated: indexing it again", self.path)
                self._reset()
            if st.st_size == self.indexed_bytes:
                return 0
            end = st.st_size if max_bytes is None else min(st.st_size,
                                                            self.indexed_bytes + max_bytes)
            added = self._index_range(end)
            if not self.sig_length or self.sig_length < 4096:
                self.sig_length = min(4096, self.indexed_bytes)
                self.signature = self._head_signature(self.path, self.sig_length)
                self.inode = st.st_ino
            if added:
                with self._lock:
                    self.version += 1
            self._write_meta()
            return added

    def _index_range(self, end: int) -> int:
        """Index the complete lines in [indexed_bytes, end) (and the rest of a line that
        crosses ``end``)."""
        added = 0
        records: list[tuple] = []
        texts: list[bytes] = []
        vocab_out: list[str] = []
        text_pos = self.text_bytes
        pos = self.indexed_bytes
        with open(self.path, "rb") as f:
            f.seek(pos)
            carry = b""
            while True:
                block = f.read(_READ_CHUNK)
                if not block:
                    break  # EOF: a trailing line without newline waits for its newline
                buf = carry + block
                start = 0
                while True:
                    nl = buf.find(b"\n", start)
                    if nl < 0:
                        break
                    line = buf[start:nl]
                    line_offset = pos + start
                    start = nl + 1
                    if not line.strip():
                        continue
                    try:
                        ep = _loads(line)
                        if not isinstance(ep, dict):
                            raise ValueError("not an object")
                    except ValueError:
                        self.bad_lines += 1
                        continue
                    text = episode_text(ep).encode("utf-8", "replace") + _TEXT_SEP
                    records.append(self._record(ep, line_offset, len(line), text_pos,
                                                len(text) - 1, vocab_out))
                    texts.append(text)
                    text_pos += len(text)
                pos += start
                carry = buf[start:]
                if pos >= end:
                    break
        if records:
            self._append(records, texts, vocab_out)
            added = len(records)
        with self._lock:
            self.indexed_bytes = pos
            self.text_bytes = text_pos
        return added

    def _append(self, records: list[tuple], texts: list[bytes], vocab_out: list[str]) -> None:
        new = np.array(records, RECORD)
        with open(self._p("vocab.jsonl"), "a") as f:
            f.write("".join(v + "\n" for v in vocab_out))
        with open(self._p("text.bin"), "ab") as f:
            f.write(b"".join(texts))
        with open(self._p("rows.bin"), "ab") as f:
            f.write(new.tobytes())
        with self._lock:
            need = self.n + len(new)
            if need > len(self._rows):
                grown = np.zeros(max(need, 2 * len(self._rows)), RECORD)
                grown[:self.n] = self._rows[:self.n]
                self._rows = grown  # earlier snapshots keep the old array: they stay valid
            self._rows[self.n:need] = new
            self.n = need

    # ------------------------------------------------------------------ reading
    def rows(self) -> np.ndarray:
        """The records indexed so far (a view; later appends do not change it)."""
        with self._lock:
            return self._rows[:self.n]

    def snapshot(self) -> tuple[np.ndarray, dict[str, list[str]]]:
        """(records, vocabularies) at one instant."""
        with self._lock:
            return self._rows[:self.n], {c: list(v) for c, v in self.vocab.items()}

    def read_line(self, row: int) -> bytes:
        """The raw JSON line of ``row`` (one seek + one read)."""
        rec = self.rows()[row]
        with open(self.path, "rb") as f:
            f.seek(int(rec["offset"]))
            data = f.read(int(rec["length"]))
        if len(data) != int(rec["length"]):
            raise FileChangedError(f"{self.path} changed under the index (row {row})")
        return data

    def read(self, row: int) -> dict[str, Any]:
        """The episode of ``row`` as a dict."""
        data = self.read_line(row)
        try:
            ep = _loads(data)
        except ValueError as e:
            raise FileChangedError(f"{self.path}: row {row} is no longer valid JSON ({e})") from e
        if not isinstance(ep, dict):
            raise FileChangedError(f"{self.path}: row {row} is not a JSON object")
        return ep

    def _close_mmap(self) -> None:
        if self._mm is not None:
            self._mm.close()
            self._mm = None
            self._mm_len = 0

    def search(self, term: str, rows: np.ndarray | None = None) -> np.ndarray:
        """Row numbers (sorted) whose searchable text contains ``term`` (case-insensitive)."""
        needle = term.lower().encode("utf-8")
        if not needle or _TEXT_SEP in needle:
            raise ValueError("the search text must be non-empty and without NUL characters")
        with self._lock:
            recs = self._rows[:self.n] if rows is None else rows
            if not len(recs):
                return np.zeros(0, np.int64)
            end = int(recs[-1]["text_offset"]) + int(recs[-1]["text_length"]) + 1
            if self._mm is None or self._mm_len < end:
                self._close_mmap()
                with open(self._p("text.bin"), "rb") as f:
                    self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                self._mm_len = len(self._mm)
            mm = self._mm
        starts = recs["text_offset"].tolist()
        lengths = recs["text_length"].tolist()
        hits: list[int] = []
        pos = 0
        while True:
            i = mm.find(needle, pos, end)
            if i < 0:
                break
            r = bisect.bisect_right(starts, i) - 1
            hits.append(r)
            pos = starts[r] + lengths[r] + 1  # the next episode's text
        return np.asarray(hits, np.int64)

    def close(self) -> None:
        with self._lock:
            self._close_mmap()
            if self._tmp is not None:
                self._tmp.cleanup()
                self._tmp = None


class FileChangedError(RuntimeError):
    """A file was rewritten after it was indexed (its rows no longer match)."""


# ---------------------------------------------------------------------------------- the table
@dataclasses.dataclass
class Table:
    """All files of a run as columns (one entry per episode), with run-wide string codes.

    ``file`` / ``row``: where the episode is (the file's position in ``RunIndex.files`` and its
    row there); ``kind``: code into ``kinds``; ``env`` / ``task`` / ``status``: codes into
    ``vocab[column]``; the other columns as in :data:`RECORD`.
    """

    columns: dict[str, np.ndarray]
    vocab: dict[str, list[str]]
    kinds: list[str]
    version: tuple
    file_rows: list[int]  # rows of each file in the table (files are concatenated in order)

    def __len__(self) -> int:
        return len(self.columns["file"])


SORT_KEYS = ("order", "step", "reward", "num_turns", "invalid", "n_tokens", "n_trained",
             "task", "env", "status", "success", "group_id")


@dataclasses.dataclass(frozen=True)
class Query:
    """Filters, text search, sort and page over a run's episodes.

    Every filter is optional (``None``: no filter). ``task``: case-insensitive substring of the
    task id; ``statuses`` / ``envs`` / ``kinds``: any of; ``step_min..step_max``,
    ``reward_min..reward_max``, ``turns_min..turns_max``: inclusive ranges; ``success``: True /
    False; ``invalid``: True = at least one invalid action, False = none; ``error``: True =
    error statuses only; ``search``: case-insensitive substring of the episode's text (see
    :func:`episode_text`). ``sort``: one of :data:`SORT_KEYS` (``order``: file order), ties
    broken by file order; ``descending`` reverses the key (ties stay in file order).
    """

    kinds: tuple[str, ...] | None = None
    envs: tuple[str, ...] | None = None
    task: str | None = None
    statuses: tuple[str, ...] | None = None
    step_min: int | None = None
    step_max: int | None = None
    reward_min: float | None = None
    reward_max: float | None = None
    turns_min: int | None = None
    turns_max: int | None = None
    success: bool | None = None
    invalid: bool | None = None
    error: bool | None = None
    search: str | None = None
    sort: str = "order"
    descending: bool = False
    offset: int = 0
    limit: int = 50

    def filter_key(self) -> tuple:
        d = dataclasses.asdict(self)
        for k in ("offset", "limit"):
            d.pop(k)
        return tuple(sorted(d.items()))


@dataclasses.dataclass
class Page:
    total: int  # matching episodes
    offset: int
    limit: int
    files: np.ndarray  # [n] file index of each row on the page
    rows: np.ndarray  # [n] row within that file
    positions: np.ndarray  # [n] position in the run's table


class RunIndex:
    """The episodes of a run directory: its trajectory files, kept up to date on demand.

    ``files``: (path, kind, default_step) triples, found by :func:`trajectory_files` when not
    given. ``rescan()`` looks for new files; ``update()`` indexes new lines of every file.
    """

    def __init__(self, run_dir: str, cache_dir: str | None = None,
                 files: Sequence[tuple[str, str, int]] | None = None):
        self.run_dir = os.path.abspath(run_dir)
        self.cache_dir = cache_dir
        self._fixed_files = files is not None
        self.files: list[FileIndex] = []
        self._lock = threading.RLock()
        self._table: Table | None = None
        self._results: dict[tuple, np.ndarray] = {}  # filter key -> sorted table positions
        self._search_cache: dict[tuple, np.ndarray] = {}
        self._add_files(files if files is not None else trajectory_files(self.run_dir))

    def _add_files(self, found: Iterable[tuple[str, str, int]]) -> bool:
        known = {f.path for f in self.files}
        added = False
        for path, kind, step in found:
            if os.path.abspath(path) not in known:
                self.files.append(FileIndex(path, kind, step, self.cache_dir))
                added = True
        return added

    def rescan(self) -> bool:
        """Pick up trajectory files that appeared since (e.g. the first evaluation's)."""
        if self._fixed_files:
            return False
        with self._lock:
            return self._add_files(trajectory_files(self.run_dir))

    def update(self, max_bytes: int | None = None) -> int:
        """Index new lines of every file (``max_bytes`` per file and call); new row count."""
        return sum(f.update(max_bytes) for f in list(self.files))

    @property
    def pending_bytes(self) -> int:
        """Bytes of the files not indexed yet (as of their last update)."""
        return sum(max(f.size - f.indexed_bytes, 0) for f in self.files)

    @property
    def version(self) -> tuple:
        return tuple((f.path, f.version, f.n) for f in self.files)

    def table(self) -> Table:
        """The combined table (rebuilt only when a file changed)."""
        with self._lock:
            version = self.version
            if self._table is not None and self._table.version == version:
                return self._table
            snaps = [f.snapshot() for f in self.files]
            kinds = sorted({f.kind for f in self.files})
            vocab: dict[str, list[str]] = {c: [] for c in VOCAB_COLUMNS}
            codes: dict[str, dict[str, int]] = {c: {} for c in VOCAB_COLUMNS}
            parts: dict[str, list[np.ndarray]] = {}
            for i, (f, (rows, fvocab)) in enumerate(zip(self.files, snaps)):
                n = len(rows)
                cols = {name: rows[name] for name in RECORD.names
                        if name not in ("offset", "length", "text_offset", "text_length")}
                for c in VOCAB_COLUMNS:
                    remap = np.empty(len(fvocab[c]) + 1, np.int32)
                    for j, s in enumerate(fvocab[c]):
                        code = codes[c].get(s)
                        if code is None:
                            code = codes[c][s] = len(vocab[c])
                            vocab[c].append(s)
                        remap[j] = code
                    cols[c] = remap[rows[c]] if n else np.zeros(0, np.int32)
                cols["file"] = np.full(n, i, np.int32)
                cols["row"] = np.arange(n, dtype=np.int64)
                cols["kind"] = np.full(n, kinds.index(f.kind), np.int32)
                for name, col in cols.items():
                    parts.setdefault(name, []).append(col)
            columns = {name: (np.concatenate(p) if p else np.zeros(0)) for name, p in
                       parts.items()}
            if not columns:
                columns = {name: np.zeros(0, RECORD[name]) for name in RECORD.names}
                columns.update(file=np.zeros(0, np.int32), row=np.zeros(0, np.int64),
                               kind=np.zeros(0, np.int32))
            self._table = Table(columns, vocab, kinds, version, [len(r) for r, _ in snaps])
            self._results.clear()
            self._search_cache = {k: v for k, v in self._search_cache.items()
                                  if k[1] == version}
            return self._table

    # ------------------------------------------------------------------ queries
    def search_mask(self, table: Table, term: str) -> np.ndarray:
        """Boolean [len(table)]: the episode's text contains ``term``."""
        key = (term.lower(), table.version)
        hit = self._search_cache.get(key)
        if hit is None:
            hit = np.zeros(len(table), bool)
            base = 0
            for f, n in zip(self.files, table.file_rows):
                if n:
                    hit[base + f.search(term, f.rows()[:n])] = True
                base += n
            self._search_cache[key] = hit
        return hit

    def mask(self, q: Query, table: Table | None = None) -> np.ndarray:
        """Boolean [len(table)]: the episodes that pass every filter of ``q``."""
        t = table or self.table()
        c = t.columns
        m = np.ones(len(t), bool)

        def any_of(column: str, values: Sequence[str], vocab: list[str]) -> None:
            nonlocal m
            codes = [i for i, v in enumerate(vocab) if v in set(values)]
            m &= np.isin(c[column], np.asarray(codes, np.int32))

        if q.kinds is not None:
            any_of("kind", q.kinds, t.kinds)
        if q.envs is not None:
            any_of("env", q.envs, t.vocab["env"])
        if q.statuses is not None:
            any_of("status", q.statuses, t.vocab["status"])
        if q.task:
            needle = q.task.lower()
            codes = [i for i, v in enumerate(t.vocab["task"]) if needle in v.lower()]
            m &= np.isin(c["task"], np.asarray(codes, np.int32))
        for column, lo, hi in (("step", q.step_min, q.step_max),
                               ("reward", q.reward_min, q.reward_max),
                               ("num_turns", q.turns_min, q.turns_max)):
            if lo is not None:
                m &= c[column] >= lo
            if hi is not None:
                m &= c[column] <= hi
        if q.success is not None:
            m &= (c["success"] != 0) == q.success
        if q.invalid is not None:
            m &= (c["invalid"] > 0) == q.invalid
        if q.error is not None:
            err_codes = [i for i, v in enumerate(t.vocab["status"]) if v in ERROR_STATUSES]
            m &= np.isin(c["status"], np.asarray(err_codes, np.int32)) == q.error
        if q.search:
            m &= self.search_mask(t, q.search)
        return m

    def matching(self, q: Query) -> tuple[Table, np.ndarray]:
        """(table, positions of the matching episodes in sort order); cached per filter set."""
        t = self.table()
        key = q.filter_key()
        with self._lock:
            cached = self._results.get(key) if self._table is t else None
        if cached is not None:
            return t, cached
        pos = np.flatnonzero(self.mask(q, t))
        if q.sort != "order" and len(pos):
            key_col = _sort_column(t, q.sort)[pos]
            if q.descending:
                key_col = -key_col.astype(np.float64)
            order = np.lexsort((pos, key_col))  # stable: ties keep file order
            pos = pos[order]
        elif q.descending:
            pos = pos[::-1].copy()
        with self._lock:
            if self._table is t:
                if len(self._results) > 32:
                    self._results.pop(next(iter(self._results)))
                self._results[key] = pos
        return t, pos

    def query(self, q: Query) -> Page:
        """One page of ``q`` (``offset`` beyond the matches gives an empty page)."""
        t, pos = self.matching(q)
        sel = pos[q.offset:q.offset + q.limit]
        return Page(total=len(pos), offset=q.offset, limit=q.limit,
                    files=t.columns["file"][sel], rows=t.columns["row"][sel], positions=sel)

    def summary(self, table: Table, position: int) -> dict[str, Any]:
        """The index fields of one episode as a JSON-friendly dict."""
        c = table.columns
        i = int(position)
        out: dict[str, Any] = {
            "file": int(c["file"][i]), "row": int(c["row"][i]),
            "kind": table.kinds[int(c["kind"][i])],
            "env": table.vocab["env"][int(c["env"][i])],
            "task_id": table.vocab["task"][int(c["task"][i])],
            "status": table.vocab["status"][int(c["status"][i])],
            "reward": float(c["reward"][i]), "success": bool(c["success"][i]),
            "has_error": bool(c["has_error"][i])}
        for name in ("step", "num_turns", "invalid", "n_tokens", "n_trained", "group_id",
                     "sample_index", "policy_version", "horizon"):
            out[name] = int(c[name][i])
        return out

    def read(self, file: int, row: int) -> dict[str, Any]:
        """The full episode record at (file, row)."""
        return self.files[file].read(row)

    def close(self) -> None:
        for f in self.files:
            f.close()


def _sort_column(t: Table, name: str) -> np.ndarray:
    if name not in SORT_KEYS:
        raise ValueError(f"unknown sort key {name!r} (choices: {', '.join(SORT_KEYS)})")
    if name in ("task", "env", "status"):
        vocab = t.vocab[name]
        rank = np.empty(len(vocab), np.int64)
        rank[np.argsort(np.asarray(vocab, dtype=object), kind="stable")] = np.arange(len(vocab))
        return rank[t.columns[name]] if len(vocab) else t.columns[name].astype(np.int64)
    return t.columns[name]


# ---------------------------------------------------------------------------------- discovery
_PROCESS_RE = re.compile(r"^trajectories_(train|eval)(\.process\d+)?\.jsonl$")


def trajectory_files(run_dir: str) -> list[tuple[str, str, int]]:
    """The episode files of a run directory as (path, kind, default step), in a stable order.

    ``trajectories_train[.process<i>].jsonl`` (kind ``train``) and ``trajectories_eval...``
    (``eval``), written by the trainer; ``<name>_trajectories.jsonl`` written by
    ``launch/eval.py --output <name>.json`` (``eval``, step from ``<name>.json``);
    ``eval_episodes.jsonl`` (``eval``; per-episode summaries kept with published results).
    """
    try:
        names = sorted(os.listdir(run_dir))
    except OSError:
        return []
    out: list[tuple[str, str, int]] = []
    for name in names:
        path = os.path.join(run_dir, name)
        if not os.path.isfile(path):
            continue
        m = _PROCESS_RE.match(name)
        if m:
            out.append((path, m.group(1), -1))
        elif name.endswith("_trajectories.jsonl"):
            step = -1
            try:
                with open(os.path.join(run_dir, name[:-len("_trajectories.jsonl")] + ".json")) as f:
                    step = _int(json.load(f).get("step"))
            except (OSError, ValueError, AttributeError):
                pass
            out.append((path, "eval", step))
        elif name == "eval_episodes.jsonl":
            out.append((path, "eval", -1))
    order = {"train": 0, "eval": 1}
    out.sort(key=lambda x: (order.get(x[1], 2), x[0]))
    return out
