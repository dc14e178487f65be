"""A run directory as the viewer sees it: config, summary, metrics, evaluations, episodes.

Everything is read from the files the trainer writes (``config.json``, ``summary.json``,
``metrics.jsonl``, ``trajectories_*.jsonl``, each plain or ``.gz``; ``launch/eval.py --output``
files too) and re-read when they change, so a run that is still training is shown as it grows.
Missing or partial files give empty sections, never errors.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import threading
from collections import defaultdict
from typing import Any, Callable

import numpy as np

from agentrl_common.jsonl_files import find_run_file, is_gzip, iter_lines
from agentrl_jax.viewer.index import RunIndex

log = logging.getLogger(__name__)

_EVAL_KEY = re.compile(r"^eval/(avg|pass)@(\d+)$")
_EVAL_ENV_KEY = re.compile(r"^eval/([^/]+)/(avg@\d+|pass@\d+|success_rate|mean_reward)$")


def _read_json(path: str) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists kept as values)."""
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, dict) and v:
                out.update(flatten(v, key))
            else:
                out[key] = v
    return out


def _metrics_row(line: bytes) -> dict[str, Any] | None:
    """The JSON object of one ``metrics.jsonl`` line; None when it is not one or has no usable
    (finite, numeric) ``step``."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    step = row.get("step") if isinstance(row, dict) else None
    if isinstance(step, (int, float)) and not isinstance(step, bool) and math.isfinite(step):
        return row
    return None


class MetricsLog:
    """``metrics.jsonl`` read incrementally: only bytes appended since the last ``update``
    are parsed; a shorter file (rewritten) is read again from the start. A committed run's
    ``metrics.jsonl.gz`` (``find_run_file``: used when there is no plain file) is read whole,
    and again when its size changes."""

    def __init__(self, path: str):
        self.path = path  # the plain file's path
        self._source: str | None = None  # the file read: ``path`` or ``path + ".gz"``
        self._rows: list[dict[str, Any]] = []
        self._offset = 0
        self._lock = threading.Lock()

    def update(self) -> int:
        with self._lock:
            source = find_run_file(os.path.dirname(self.path), os.path.basename(self.path))
            if source != self._source:
                self._rows, self._offset, self._source = [], 0, source
            try:
                size = os.path.getsize(source) if source else -1
            except OSError:
                size = -1
            if size < 0:
                self._rows, self._offset = [], 0
                return 0
            if size < self._offset or (is_gzip(source) and size != self._offset):
                self._rows, self._offset = [], 0
            if size == self._offset:
                return 0
            if is_gzip(source):
                lines: list[bytes] = list(iter_lines(source))
                end = size
            else:
                with open(source, "rb") as f:
                    f.seek(self._offset)
                    data = f.read(size - self._offset)
                end = data.rfind(b"\n") + 1  # a half-written last line waits
                lines = data[:end].splitlines()
            added = 0
            for line in lines:
                row = _metrics_row(line)  # a row without a usable step is skipped
                if row is not None:
                    self._rows.append(row)
                    added += 1
            self._offset += end
            return added

    def rows(self) -> list[dict[str, Any]]:
        self.update()
        with self._lock:
            return list(self._rows)

    @property
    def size(self) -> int:
        return self._offset


class Run:
    """One run directory. ``run_id``: its position on the command line (the API's ``run``)."""

    def __init__(self, run_id: int, path: str, name: str | None = None,
                 cache_dir: str | None = None, load_tokenizer: bool = True):
        self.id = run_id
        self.path = os.path.abspath(path)
        self.name = name or os.path.basename(self.path.rstrip("/")) or self.path
        self.index = RunIndex(self.path, cache_dir=cache_dir)
        self.metrics = MetricsLog(os.path.join(self.path, "metrics.jsonl"))
        self._json_cache: dict[str, tuple[float, Any]] = {}
        self._tokenizer: Any = None
        self._tokenizer_error: str | None = None
        self._tokenizer_lock = threading.Lock()
        self._token_strings: dict[int, str] = {}
        self.allow_tokenizer = load_tokenizer

    # ------------------------------------------------------------------ small files
    def _json(self, name: str) -> Any:
        path = os.path.join(self.path, name)
        try:
            mtime = os.stat(path).st_mtime_ns
        except OSError:
            return None
        cached = self._json_cache.get(name)
        if cached is None or cached[0] != mtime:
            cached = (mtime, _read_json(path))
            self._json_cache[name] = cached
        return cached[1]

    def config(self) -> dict[str, Any]:
        cfg = self._json("config.json")
        return cfg if isinstance(cfg, dict) else {}

    def summary(self) -> dict[str, Any]:
        s = self._json("summary.json")
        return s if isinstance(s, dict) else {}

    def cfg(self, dotted: str, default: Any = None) -> Any:
        """A config value by dotted key (``learner.advantage_estimator``)."""
        node: Any = self.config()
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    # ------------------------------------------------------------------ evaluations
    def eval_table(self) -> list[dict[str, Any]]:
        """One row per evaluation, sorted by step: ``step, k, avg, pass, success_rate,
        mean_reward, dropped, num_tasks, seconds, old_metric, per_env {env: {metric: value}},
        source``. From ``metrics.jsonl`` (written as the run goes), ``summary.json`` (task
        counts) and ``launch/eval.py`` output files in the run directory. ``avg`` is Avg@k, the
        mean task score (``training/evaluation/eval_metrics.py``); ``old_metric`` marks an evaluation
        written before that definition (no success rate logged): its ``avg`` is the share of
        episodes with the success flag or a positive score."""
        rows: dict[tuple[str, int], dict[str, Any]] = {}
        for m in self.metrics.rows():
            if not any(k.startswith("eval/") for k in m):
                continue
            step = int(m["step"])
            row = rows.setdefault(("run", step), {"step": step, "source": "run", "per_env": {}})
            for key, value in m.items():
                match = _EVAL_KEY.match(key)
                if match:
                    row["k"] = int(match.group(2))
                    row["avg" if match.group(1) == "avg" else "pass"] = value
                elif key in ("eval/mean_reward", "eval/dropped", "eval/seconds",
                             "eval/success_rate"):
                    row[key.split("/")[1]] = value
                else:
                    env_match = _EVAL_ENV_KEY.match(key)
                    if env_match:
                        metric = env_match.group(2).split("@")[0]
                        row["per_env"].setdefault(env_match.group(1), {})[metric] = value
        evals = self.summary().get("evals")
        for step_s, ev in (evals.items() if isinstance(evals, dict) else ()):
            if not isinstance(ev, dict):
                continue
            try:
                step = int(step_s)
            except ValueError:
                continue
            row = rows.setdefault(("run", step), {"step": step, "source": "run", "per_env": {}})
            self._merge_eval_result(row, ev)
        for name in sorted(os.listdir(self.path)) if os.path.isdir(self.path) else ():
            if not name.endswith(".json") or name in ("config.json", "summary.json"):
                continue
            ev = self._json(name)
            if isinstance(ev, dict) and "avg_at_k" in ev:
                step = int(ev["step"]) if isinstance(ev.get("step"), int) else -1
                row = {"step": step, "source": name, "per_env": {}}
                self._merge_eval_result(row, ev)
                rows[(name, step)] = row
        for row in rows.values():
            row["old_metric"] = "avg" in row and "success_rate" not in row
        return sorted(rows.values(), key=lambda r: (r["step"], r["source"] != "run",
                                                    r["source"]))

    @staticmethod
    def _merge_eval_result(row: dict[str, Any], ev: dict[str, Any]) -> None:
        """Fields of an ``EvalResult`` dict (summary.json / launch/eval.py) into ``row``."""
        for src, dst in (("k", "k"), ("avg_at_k", "avg"), ("pass_at_k", "pass"),
                         ("success_rate", "success_rate"), ("mean_reward", "mean_reward"), ("dropped", "dropped"),
                         ("num_tasks", "num_tasks")):
            if src in ev and dst not in row:
                row[dst] = ev[src]
        per_env = ev.get("per_env")
        for env, metrics in (per_env.items() if isinstance(per_env, dict) else ()):
            if isinstance(metrics, dict):
                dest = row["per_env"].setdefault(env, {})
                for key, value in metrics.items():
                    dest.setdefault(key.split("@")[0], value)

    def before_after(self) -> dict[str, Any]:
        """The held-out tasks at the first and the last evaluated step, from the evaluation
        episodes: per task the success rate (the environment's completion flag) and mean reward
        (the score) before and after and the episodes (file, row, sample) of each side."""
        t = self.index.table()
        c = t.columns
        if "eval" not in t.kinds or not len(t):
            return {"steps": [], "tasks": []}
        is_eval = c["kind"] == t.kinds.index("eval")
        steps = sorted(set(c["step"][is_eval].tolist()))
        out: dict[str, Any] = {"steps": steps, "tasks": []}
        if not steps:
            return out
        before, after = steps[0], steps[-1]
        out.update(before=before, after=after)
        error = {i for i, s in enumerate(t.vocab["status"]) if s in ("env_error", "engine_error")}
        sides: dict[tuple[int, int], dict[str, list]] = defaultdict(lambda: {"before": [],
                                                                              "after": []})
        for side, step in (("before", before), ("after", after)):
            for i in np.flatnonzero(is_eval & (c["step"] == step)):
                sides[(int(c["env"][i]), int(c["task"][i]))][side].append(i)
        for (env, task), eps in sorted(sides.items(), key=lambda kv: (t.vocab["env"][kv[0][0]],
                                                                        t.vocab["task"][kv[0][1]])):
            entry: dict[str, Any] = {"env": t.vocab["env"][env], "task_id": t.vocab["task"][task]}
            for side, idx in eps.items():
                ok = [i for i in idx if int(c["status"][i]) not in error]
                entry[side] = {
                    "episodes": [{"file": int(c["file"][i]), "row": int(c["row"][i]),
                                  "sample": int(c["sample_index"][i]),
                                  "success": bool(c["success"][i]),
                                  "reward": float(c["reward"][i]),
                                  "status": t.vocab["status"][int(c["status"][i])]}
                                 for i in sorted(idx, key=lambda i: int(c["sample_index"][i]))],
                    "success_rate": (float(np.mean([bool(c["success"][i]) for i in ok]))
                                     if ok else None),
                    "mean_reward": float(np.mean(c["reward"][ok])) if ok else None}
            out["tasks"].append(entry)
        return out

    # ------------------------------------------------------------------ live status
    def status(self) -> dict[str, Any]:
        """What changes while a run trains: file sizes, the last logged step, indexed rows."""
        self.metrics.update()
        files = {}
        for name in ("metrics.jsonl", "summary.json", "config.json"):
            path = find_run_file(self.path, name)  # metrics.jsonl may be .gz (committed runs)
            try:
                if path:
                    files[os.path.basename(path)] = os.path.getsize(path)
            except OSError:
                pass
        for f in self.index.files:
            files[os.path.basename(f.path)] = f.size
        rows = self.metrics.rows()
        return {"run": self.id, "files": files,
                "last_step": max((int(r["step"]) for r in rows), default=None),
                "metrics_rows": len(rows),
                "episodes": sum(f.n for f in self.index.files),
                "pending_bytes": self.index.pending_bytes}

    # ------------------------------------------------------------------ tokens
    def tokenizer(self) -> Any:
        """The run's tokenizer (``config.json`` ``model.name``), loaded once; ``None`` when it
        cannot be loaded (the reason is in :attr:`tokenizer_error`)."""
        with self._tokenizer_lock:
            if self._tokenizer is not None or self._tokenizer_error is not None:
                return self._tokenizer
            name = self.cfg("model.name")
            if not self.allow_tokenizer:
                self._tokenizer_error = "tokenizer loading is off (--no-tokenizer)"
            elif not name:
                self._tokenizer_error = "config.json names no model"
            else:
                try:
                    from agentrl_jax.models.pretrained import resolve_model_path
                    from agentrl_jax.models.tokenizer import load_tokenizer

                    self._tokenizer = load_tokenizer(resolve_model_path(str(name)))
                except Exception as e:  # any failure: show ids only, say why
                    self._tokenizer_error = f"tokenizer of {name!r} not available: {e}"
            return self._tokenizer

    @property
    def tokenizer_error(self) -> str | None:
        return self._tokenizer_error

    def token_strings(self, ids: list[int]) -> list[str] | None:
        """Each id decoded on its own (cached), or ``None`` without a tokenizer."""
        tok = self.tokenizer()
        if tok is None:
            return None
        out = []
        for i in ids:
            s = self._token_strings.get(i)
            if s is None:
                try:
                    s = tok.decode([i])
                except Exception:  # an id outside the vocabulary
                    s = f"<{i}?>"
                self._token_strings[i] = s
            out.append(s)
        return out

    def decode(self, ids: list[int]) -> str | None:
        """``ids`` decoded as the agent decoded its replies (special tokens skipped)."""
        tok = self.tokenizer()
        if tok is None:
            return None
        try:
            return tok.decode(ids, skip_special_tokens=True)
        except Exception:
            return None

    def close(self) -> None:
        self.index.close()


def metric_series(rows: list[dict[str, Any]], keys: tuple[str, ...]
                  ) -> tuple[str | None, list[int], list[float]]:
    """The first of ``keys`` present in ``rows``: (key, steps, values), finite values only."""
    for key in keys:
        pts = [(int(r["step"]), float(r[key])) for r in rows
               if isinstance(r.get(key), (int, float)) and math.isfinite(float(r[key]))]
        if pts:
            return key, [p[0] for p in pts], [p[1] for p in pts]
    return None, [], []


def eval_success_key(rows: list[dict[str, Any]]) -> tuple[str, ...]:
    """The ``eval/avg@k`` keys present in ``rows`` (the held-out Avg@k curve)."""
    keys = sorted({k for r in rows for k in r if _EVAL_KEY.match(k) and k.startswith("eval/avg")},
                  key=lambda k: int(k.split("@")[1]))
    return tuple(keys)


#: the learning-curve panels: (title, metric keys tried in order, y label)
CURVES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("train reward", ("rollout/mean_reward",), "mean episode reward"),
    ("held-out Avg@k", ("eval/avg@*",), "Avg@k (mean score; old runs: share > 0)"),
    ("entropy", ("actor/entropy",), "nats / token"),
    ("KL", ("actor/ref_kl", "actor/kl_loss", "actor/ppo_kl"), "nats"),
    ("step time", ("train/step_seconds", "perf/step_time_s"), "seconds"),
    ("train success", ("rollout/success_rate",), "success rate"),
    ("horizon", ("train/horizon",), "turns"),
    ("grad norm", ("actor/grad_norm",), "L2 norm"),
)


def curve_keys(keys: tuple[str, ...], rows: list[dict[str, Any]]) -> tuple[str, ...]:
    """``keys`` with ``eval/avg@*`` expanded to the run's ``eval/avg@k`` keys."""
    out: list[str] = []
    for k in keys:
        out.extend(eval_success_key(rows) if k == "eval/avg@*" else (k,))
    return tuple(out)


def curves(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The :data:`CURVES` panels of one run: ``title, key, ylabel, steps, values`` (empty
    steps for a metric the run did not log)."""
    out = []
    for title, keys, ylabel in CURVES:
        key, steps, values = metric_series(rows, curve_keys(keys, rows))
        out.append({"title": title, "key": key, "ylabel": ylabel, "steps": steps,
                    "values": values})
    return out


Decoder = Callable[[list[int]], "str | None"]
