"""The index of one trajectory JSONL file (:class:`FileIndex`), built incrementally.

For every complete line (one episode) it keeps the byte offset and length plus a fixed-size
record of summary fields (:data:`RECORD`: step, env, task, status, reward, success, turns,
invalid actions, parse failures, token counts, the final context, group, ...), and appends the
episode's searchable text (lower-cased task id, episode id, error and every non-system message)
to a text file. Nothing of the episode itself is kept in memory: a page of results is served
by seeking to the rows' offsets.

A compressed file (``.jsonl.gz``, one gzip member per training step: ``agentrl_common.
jsonl_files``) is indexed a whole member at a time: a row keeps its member's byte offset and
compressed length and the line's place inside the decompressed member, and reading a row
decompresses its member (the last one read is kept). A member cut short (being written, or a
killed run) waits like a half-written line.

:meth:`FileIndex.update` reads only the bytes appended since the last call (a line is indexed
once its newline is written, so a half-written last line waits), and rebuilds from scratch when
the file shrank or its first bytes changed (it was replaced). With a cache directory the
records, the text and the string vocabularies are stored as append-only files plus a
``meta.json`` written last (atomically), so a restart re-reads only the new tail; a crash
between the two leaves longer data files than ``meta.json`` says, which are truncated on load.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
import logging
import mmap
import os
import tempfile
import threading
from typing import Any

import numpy as np

from agentrl_common.jsonl_files import is_gzip, iter_gzip_members
from agentrl_jax.viewer.index_record import (_READ_CHUNK, _TEXT_SEP, ERROR_STATUSES, RECORD,
                                             VOCAB_COLUMNS, _float, as_int, count_column,
                                             default_cache_dir, episode_text)
from agentrl_jax.viewer.record import context_tokens, count_field

try:  # faster than json on these large lines; the stdlib is the fallback
    import orjson

    def _loads(b: bytes) -> Any:
        return orjson.loads(b)
except ImportError:  # pragma: no cover - orjson is a runtime dependency
    def _loads(b: bytes) -> Any:
        return json.loads(b)

log = logging.getLogger(__name__)

INDEX_VERSION = 3  # 3: the parse_failures and context_tokens columns


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
        self.compressed = is_gzip(self.path)
        self._member: tuple[int, bytes] | None = None  # (offset, data): the last member read
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
            self._member = None
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
                text_length: int, vocab_out: list, member_length: int = 0,
                inner: int = 0) -> tuple:
        tokens, mask = ep.get("token_ids"), ep.get("loss_mask")
        n_trained = -1
        if isinstance(mask, list):
            try:
                n_trained = int(sum(1 for m in mask if m))
            except TypeError:
                n_trained = -1
        step = as_int(ep.get("step"), self.default_step)
        return (offset, length, member_length, inner, step,
                self._code("env", ep.get("env"), vocab_out),
                self._code("task", ep.get("task_id"), vocab_out),
                self._code("status", ep.get("status") or "unknown", vocab_out),
                _float(ep.get("reward")), 1 if ep.get("success") else 0,
                as_int(ep.get("num_turns"), 0), as_int(ep.get("invalid_actions"), 0),
                len(tokens) if isinstance(tokens, list) else -1, n_trained,
                as_int(ep.get("group_id")), as_int(ep.get("sample_index")),
                as_int(ep.get("policy_version")), as_int(ep.get("horizon")),
                1 if ep.get("error") else 0,
                count_column(count_field(ep, "parse_failures")),
                count_column(context_tokens(ep)), text_offset, text_length)

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

    def _parse(self, line: bytes, records: list, texts: list, vocab_out: list, text_pos: int,
               offset: int, member_length: int = 0, inner: int = 0) -> int:
        """Index one line (a record and its text); returns the text position after it."""
        if not line.strip():
            return text_pos
        try:
            ep = _loads(line)
            if not isinstance(ep, dict):
                raise ValueError("not an object")
        except ValueError:
            self.bad_lines += 1
            return text_pos
        text = episode_text(ep).encode("utf-8", "replace") + _TEXT_SEP
        records.append(self._record(ep, offset, len(line), text_pos, len(text) - 1, vocab_out,
                                    member_length, inner))
        texts.append(text)
        return text_pos + len(text)

    def _index_members(self, end: int) -> int:
        """Index the whole gzip members from ``indexed_bytes`` until one ends at or past
        ``end``."""
        records: list[tuple] = []
        texts: list[bytes] = []
        vocab_out: list[str] = []
        text_pos = self.text_bytes
        pos = self.indexed_bytes
        with open(self.path, "rb") as f:
            for offset, length, data in iter_gzip_members(f, pos):
                start = 0
                while True:
                    nl = data.find(b"\n", start)
                    if nl < 0:
                        break
                    text_pos = self._parse(data[start:nl], records, texts, vocab_out, text_pos,
                                           offset, length, start)
                    start = nl + 1
                pos = offset + length
                if pos >= end:
                    break
        if records:
            self._append(records, texts, vocab_out)
        with self._lock:
            self.indexed_bytes = pos
            self.text_bytes = text_pos
        return len(records)

    def _index_range(self, end: int) -> int:
        """Index the complete lines in [indexed_bytes, end) (and the rest of a line that
        crosses ``end``)."""
        if self.compressed:
            return self._index_members(end)
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
                    text_pos = self._parse(buf[start:nl], records, texts, vocab_out, text_pos,
                                           pos + start)
                    start = nl + 1
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
        """The raw JSON line of ``row`` (one seek + one read; .gz: its member decompressed)."""
        rec = self.rows()[row]
        if self.compressed:
            return self._read_member_line(row, rec)
        with open(self.path, "rb") as f:
            f.seek(int(rec["offset"]))
            data = f.read(int(rec["length"]))
        if len(data) != int(rec["length"]):
            raise FileChangedError(f"{self.path} changed under the index (row {row})")
        return data

    def _read_member_line(self, row: int, rec: np.void) -> bytes:
        offset, length = int(rec["offset"]), int(rec["member_length"])
        with self._lock:
            cached = self._member
        if cached is not None and cached[0] == offset:
            data = cached[1]
        else:
            with open(self.path, "rb") as f:
                members = list(itertools.islice(iter_gzip_members(f, offset), 1))
            if not members or members[0][1] != length:
                raise FileChangedError(f"{self.path} changed under the index (row {row})")
            data = members[0][2]
            with self._lock:
                self._member = (offset, data)
        start = int(rec["inner"])
        line = data[start:start + int(rec["length"])]
        if len(line) != int(rec["length"]):
            raise FileChangedError(f"{self.path} changed under the index (row {row})")
        return line

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


__all__ = ["FileIndex", "FileChangedError", "RECORD", "VOCAB_COLUMNS", "ERROR_STATUSES",
           "INDEX_VERSION", "default_cache_dir", "episode_text", "as_int"]
