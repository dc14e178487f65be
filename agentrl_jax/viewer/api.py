"""The viewer's Python API: the data behind every view of the page, as JSON-ready dicts.

    from agentrl_jax.viewer import Viewer
    v = Viewer(["runs/smoke"])
    page = v.episodes(0, Query(statuses=("done",), sort="reward", descending=True, limit=5))
    ep = v.episode(0, page["rows"][0]["file"], page["rows"][0]["row"])
    print(v.render(0, page["rows"][0]["file"], page["rows"][0]["row"]))

The HTTP server (``server.py``) and the HTML export (``export.py``) call these methods; so
can notebooks and scripts.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Sequence

import numpy as np

from agentrl_jax.viewer import episode as episode_mod
from agentrl_jax.viewer import record as record_mod
from agentrl_jax.viewer.index import Query
from agentrl_jax.viewer.runs import Run, curves, flatten

PREVIEW_CHARS = 80


class ViewerError(ValueError):
    """A request the viewer cannot answer (unknown run, row out of range, ...): the HTTP
    server turns it into a 4xx answer with this message."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


class Viewer:
    """The runs given on the command line (``run`` arguments are positions in ``paths``)."""

    def __init__(self, paths: Sequence[str], cache_dir: str | None = None,
                 load_tokenizer: bool = True, names: Sequence[str] | None = None):
        if not paths:
            raise ValueError("no run directory given")
        names = list(names) if names else _unique_names(paths)
        self.runs = [Run(i, p, names[i], cache_dir=cache_dir, load_tokenizer=load_tokenizer)
                     for i, p in enumerate(paths)]

    # ------------------------------------------------------------------ lookups
    def run(self, run_id: int) -> Run:
        if not 0 <= run_id < len(self.runs):
            raise ViewerError(f"unknown run {run_id}: this viewer shows runs 0.."
                              f"{len(self.runs) - 1}", 404)
        return self.runs[run_id]

    def update(self) -> int:
        """Index every run's new episodes (all of them); new row count."""
        added = 0
        for r in self.runs:
            r.index.rescan()
            added += r.index.update()
        return added

    # ------------------------------------------------------------------ runs view
    def runs_info(self) -> list[dict[str, Any]]:
        """Per run: name, path, config (nested and flattened), summary, evaluation table,
        trajectory files."""
        out = []
        for r in self.runs:
            cfg = r.config()
            out.append({"id": r.id, "name": r.name, "path": r.path, "config": cfg,
                        "config_flat": {k: v for k, v in flatten(cfg).items()},
                        "summary": r.summary(), "evals": r.eval_table(),
                        "files": [{"file": i, "name": os.path.basename(f.path), "kind": f.kind,
                                   "episodes": f.n, "bytes": f.size}
                                  for i, f in enumerate(r.index.files)]})
        return out

    def metrics(self, run_id: int) -> dict[str, Any]:
        """The run's metrics rows and its learning-curve panels."""
        rows = self.run(run_id).metrics.rows()
        keys = sorted({k for row in rows for k in row if k not in ("step", "time")})
        return {"run": run_id, "rows": rows, "keys": keys, "curves": curves(rows)}

    def status(self) -> dict[str, Any]:
        return {"runs": [r.status() for r in self.runs]}

    # ------------------------------------------------------------------ browser
    def facets(self, run_id: int) -> dict[str, Any]:
        """The values the filters can take: kinds, envs, statuses, step range, file list."""
        r = self.run(run_id)
        t = r.index.table()
        c = t.columns
        return {"run": run_id, "episodes": len(t), "kinds": t.kinds,
                "envs": sorted(set(t.vocab["env"])), "statuses": sorted(set(t.vocab["status"])),
                "tasks": len(t.vocab["task"]),
                "steps": [int(c["step"].min()), int(c["step"].max())] if len(t) else None,
                "turns": [int(c["num_turns"].min()), int(c["num_turns"].max())]
                if len(t) else None,
                "pending_bytes": r.index.pending_bytes}

    def episodes(self, run_id: int, q: Query, preview: bool = True) -> dict[str, Any]:
        """One page of ``q``: ``total``, ``offset``, ``limit``, ``rows`` (index fields, plus
        the last reply and error read from the file when ``preview``)."""
        r = self.run(run_id)
        page = r.index.query(q)
        if q.offset > page.total:
            raise ViewerError(f"offset {q.offset} is past the {page.total} matching episodes")
        table = r.index.table()
        rows = []
        for pos in page.positions:
            s = r.index.summary(table, int(pos))
            if preview:
                s.update(self._preview(r, s["file"], s["row"]))
            rows.append(s)
        return {"run": run_id, "total": page.total, "offset": page.offset, "limit": page.limit,
                "rows": rows, "query": dataclasses.asdict(q)}

    @staticmethod
    def _preview(r: Run, file: int, row: int) -> dict[str, Any]:
        try:
            ep = r.index.read(file, row)
        except Exception as e:  # a file changed under the index: the list still shows
            return {"last_reply": None, "error": f"({e})"}
        messages = ep.get("messages") if isinstance(ep.get("messages"), list) else []
        replies = [m.get("content") for m in messages
                   if isinstance(m, dict) and m.get("role") == "assistant"]
        last = str(replies[-1]) if replies else None
        if last is not None and len(last) > PREVIEW_CHARS:
            last = last[:PREVIEW_CHARS - 1] + "\u2026"
        err = ep.get("error")
        return {"last_reply": last, "error": str(err)[:200] if err else None}

    # ------------------------------------------------------------------ one episode
    def _check_row(self, r: Run, file: int, row: int) -> None:
        if not 0 <= file < len(r.index.files):
            raise ViewerError(f"run {r.id} has no file {file} (it has "
                              f"{len(r.index.files)} trajectory files)", 404)
        n = r.index.files[file].n
        if not 0 <= row < n:
            raise ViewerError(f"file {file} of run {r.id} has no row {row} (it has {n} "
                              "indexed episodes)", 404)

    def record(self, run_id: int, file: int, row: int) -> dict[str, Any]:
        """The raw episode record (the JSON object of its line)."""
        r = self.run(run_id)
        self._check_row(r, file, row)
        try:
            return r.index.read(file, row)
        except RuntimeError as e:
            raise ViewerError(str(e), 409) from e

    def episode(self, run_id: int, file: int, row: int, tokens: bool = True) -> dict[str, Any]:
        """The episode view: its fields, turns, and (``tokens``) the token view with the
        loss-mask checks and the advantage. ``fields["parse_failures"]`` /
        ``fields["context_tokens"]`` are absent or ``None`` when unknown (records written before
        them; the context is read from the token ids when the record has those).

        A malformed record is shown as far as it can be: ``malformed`` maps each field of the
        wrong type to the reason (the field itself is ``None``; see ``record.py``), and token
        arrays that cannot be laid out leave out the token view (``malformed["tokens"]``: why)."""
        r = self.run(run_id)
        ep = self.record(run_id, file, row)
        f = r.index.files[file]
        parser = episode_mod.parser_for(r.cfg("rollout.parser"))
        fields, malformed = record_mod.episode_fields(ep)
        messages = record_mod.list_field(ep, "messages", malformed)
        record_mod.list_field(ep, "turn_rewards", malformed)
        out: dict[str, Any] = {"run": run_id, "file": file, "row": row, "kind": f.kind,
                               "file_name": os.path.basename(f.path), "fields": fields,
                               "malformed": malformed, "has_messages": bool(messages),
                               "has_tokens": bool(ep.get("token_ids"))}
        if "step" not in ep and f.default_step >= 0:
            out["fields"]["step"] = f.default_step
        if "context_tokens" not in ep:  # a full trajectory: its last chunk's length
            out["fields"]["context_tokens"] = record_mod.context_tokens(ep)
        out.update(episode_mod.turns(ep, parser))
        problem = record_mod.token_problem(ep) if ep.get("token_ids") else None
        if problem is not None:
            malformed["tokens"] = problem
        elif tokens and ep.get("token_ids"):
            out.update(self._token_section(r, file, row, ep))
        return out

    def _token_section(self, r: Run, file: int, row: int, ep: dict[str, Any]
                       ) -> dict[str, Any]:
        """``{tokens, checks}`` of a record whose token arrays passed ``token_problem``."""
        try:
            adv = self.advantage(r, file, row, ep)
        except (TypeError, ValueError, OverflowError, AttributeError) as e:  # a bad group member
            adv = {"value": None, "note": f"not recomputed: a record of its group is "
                                          f"malformed ({type(e).__name__}: {e})"}
        ids = [int(x) for x in ep["token_ids"]]
        strings = r.token_strings(ids)
        view = episode_mod.token_view(ep, strings, adv["value"])
        view["advantage_note"] = adv["note"]
        view["tokenizer_error"] = r.tokenizer_error if strings is None else None
        decode = r.decode if strings is not None else None
        checks = episode_mod.mask_checks(ep, decode,
                                         str(r.cfg("agent.response_prefix", "") or ""))
        return {"tokens": view, "checks": checks}

    def advantage(self, r: Run, file: int, row: int, ep: dict[str, Any]) -> dict[str, Any]:
        """``{value, note}``: the episode's advantage recomputed from its group (see
        ``episode.group_advantages``), or ``None`` with the reason."""
        f = r.index.files[file]
        if f.kind != "train":
            return {"value": None, "note": "evaluation episode: not trained"}
        if ep.get("status") in episode_mod.ERROR_STATUSES:
            return {"value": None, "note": f"not trained ({ep.get('status')} episodes are "
                                           "dropped from the update)"}
        estimator = str(r.cfg("learner.advantage_estimator", "grpo"))
        if r.cfg("learner.kl_in_reward"):
            return {"value": None, "note": "not recorded (KL in the reward: the advantage "
                                           "depends on the reference model)"}
        if estimator.lower().replace("-", "_") not in episode_mod.GROUP_ESTIMATORS:
            return {"value": None, "note": f"not recorded ({estimator} advantages need the "
                                           "whole batch or a critic)"}
        rows = f.rows()
        same = np.flatnonzero((rows["step"] == rows["step"][row])
                              & (rows["group_id"] == rows["group_id"][row]))
        staleness = int(r.cfg("train.max_staleness", 0) or 0)
        step = int(rows["step"][row])
        rewards, trained = [], []
        for i in same:
            try:
                member = ep if int(i) == row else f.read(int(i))
            except RuntimeError as e:  # the file changed under the index
                return {"value": None, "note": f"group not readable: {e}"}
            versions = member.get("turn_versions") or [member.get("policy_version") or 0]
            ok = (member.get("status") not in episode_mod.ERROR_STATUSES
                  and step - int(min(versions)) <= staleness  # the trainer's staleness rule
                  and any(member.get("loss_mask") or ()))
            rewards.append(float(member.get("reward") or 0.0))
            trained.append(ok)
        if r.cfg("train.skip_flat_groups"):
            kept = [x for x, t in zip(rewards, trained) if t]
            if kept and max(kept) - min(kept) <= 1e-6:
                return {"value": None, "note": "not trained (all rewards of the group are equal "
                                               "and train.skip_flat_groups drops such groups)"}
        kwargs = r.cfg("learner.advantage_kwargs") or {}
        eps = float(kwargs.get("eps", 1e-6)) if isinstance(kwargs, dict) else 1e-6
        adv = episode_mod.group_advantages(rewards, trained, estimator, eps)
        value = float(adv[list(same).index(row)]) if adv is not None else None
        if value is not None and not math.isfinite(value):
            return {"value": None, "note": "not trained (stale or no generated token)"}
        return {"value": value,
                "note": f"{estimator} advantage recomputed from the rewards of its group "
                        f"({int(sum(trained))} trained episodes of step {step}, group "
                        f"{int(rows['group_id'][row])}): "
                        + ", ".join(f"{x:.3g}" for x in rewards)}

    def render(self, run_id: int, file: int, row: int, width: int = 100,
               system: bool = False) -> str:
        """The episode as turn-by-turn plain text."""
        r = self.run(run_id)
        ep = self.record(run_id, file, row)
        return episode_mod.render_text(ep, episode_mod.parser_for(r.cfg("rollout.parser")),
                                       width, system)

    # ------------------------------------------------------------------ before / after
    def compare(self, run_id: int) -> dict[str, Any]:
        """Held-out tasks at the first vs the last evaluation (``Run.before_after``)."""
        out = self.run(run_id).before_after()
        out["run"] = run_id
        return out

    def close(self) -> None:
        for r in self.runs:
            r.close()


def _unique_names(paths: Sequence[str]) -> list[str]:
    """Base names of the run directories, with the parent added where two collide."""
    names = [os.path.basename(os.path.abspath(p).rstrip("/")) for p in paths]
    for i, n in enumerate(names):
        if names.count(n) > 1:
            parts = os.path.abspath(paths[i]).rstrip("/").split("/")
            names[i] = "/".join(parts[-2:])
    return [n if names.count(n) == 1 else f"{n}#{i}" for i, n in enumerate(names)]
