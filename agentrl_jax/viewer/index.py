"""A run's episodes as one table: :class:`RunIndex` combines the :class:`FileIndex` of each of
the run's trajectory JSONL files (``viewer/file_index.py``) into one :class:`Table` and answers
:class:`Query` objects (filters, text search, sort, paging) with NumPy over the records.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
from typing import Any, Iterable, Sequence

import numpy as np

from agentrl_common.jsonl_files import TRAJECTORY_FILE, run_file_name
from agentrl_jax.viewer.file_index import ERROR_STATUSES, RECORD, VOCAB_COLUMNS, FileIndex, as_int

log = logging.getLogger(__name__)


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
                        if name not in ("offset", "length", "member_length", "inner",
                                        "text_offset", "text_length")}
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
        """The index fields of one episode as a JSON-friendly dict (``parse_failures`` and
        ``context_tokens``: ``None`` when the record does not say)."""
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
        for name in ("parse_failures", "context_tokens"):  # None: unknown (older records)
            out[name] = int(c[name][i]) if c[name][i] >= 0 else None
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


def trajectory_files(run_dir: str) -> list[tuple[str, str, int]]:
    """The episode files of a run directory as (path, kind, default step), in a stable order.

    ``trajectories_train[.process<i>].jsonl[.gz]`` (kind ``train``) and
    ``trajectories_eval...`` (``eval``), written by the trainer; ``<name>_trajectories.jsonl``
    written by ``launch/eval.py --output <name>.json`` (``eval``, step from ``<name>.json``);
    ``eval_episodes.jsonl`` (``eval``; per-episode summaries kept with published results).
    The last two may be gzip-compressed (``.jsonl.gz``, as large files are committed to
    ``results/``); when both forms exist the plain one is read.
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
        m = TRAJECTORY_FILE.match(name)
        plain = run_file_name(name)
        if m:
            out.append((path, m.group(1), -1))
        elif plain != name and plain in names:
            continue  # X.jsonl.gz beside X.jsonl: the plain file is the one read
        elif plain.endswith("_trajectories.jsonl"):
            step = -1
            try:
                with open(os.path.join(run_dir, plain[:-len("_trajectories.jsonl")] + ".json")) as f:
                    step = as_int(json.load(f).get("step"))
            except (OSError, ValueError, AttributeError):
                pass
            out.append((path, "eval", step))
        elif plain == "eval_episodes.jsonl":
            out.append((path, "eval", -1))
    order = {"train": 0, "eval": 1}
    out.sort(key=lambda x: (order.get(x[1], 2), x[0]))
    return out
