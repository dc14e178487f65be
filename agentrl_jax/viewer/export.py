"""A self-contained HTML file of chosen episodes: the page's own CSS and JavaScript inlined and
the episodes' data embedded as JSON (turns, and the token view unless ``tokens=False``), so it
opens from disk in any browser, with no server and no network."""

from __future__ import annotations

import dataclasses
import html
import json
import os
import time
from typing import Any

from agentrl_jax.viewer.api import Viewer
from agentrl_jax.viewer.index import Query

MAX_EPISODES = 1000
STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")


def _static(name: str) -> str:
    with open(os.path.join(STATIC_DIR, name), encoding="utf-8") as f:
        return f.read()


def _script_json(data: Any) -> str:
    """JSON that is safe inside a ``<script>`` element (no ``</script>`` or ``<!--``)."""
    text = json.dumps(data, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def describe(q: Query) -> str:
    """The query's filters in words (the export's description)."""
    parts = []
    for f in dataclasses.fields(q):
        v = getattr(q, f.name)
        if f.name in ("offset", "limit", "sort", "descending") or v is None:
            continue
        parts.append(f"{f.name}={','.join(v) if isinstance(v, tuple) else v}")
    order = f"sorted by {q.sort}{' (descending)' if q.descending else ''}"
    return (", ".join(parts) or "no filter") + f"; {order}; offset {q.offset}"


def export_data(viewer: Viewer, run_id: int, q: Query, tokens: bool = True) -> dict[str, Any]:
    """What the export file embeds: the page of ``q`` and every episode on it."""
    if q.limit > MAX_EPISODES:
        raise ValueError(f"an export holds at most {MAX_EPISODES} episodes (limit={q.limit})")
    page = viewer.episodes(run_id, q)
    run = viewer.run(run_id)
    episodes = {f"{r['file']}:{r['row']}": viewer.episode(run_id, r["file"], r["row"], tokens)
                for r in page["rows"]}
    return {"title": f"{run.name}: {len(page['rows'])} of {page['total']} matching episodes",
            "description": f"run {run.path}; {describe(q)}; exported "
                           f"{time.strftime('%Y-%m-%d %H:%M:%S')}",
            "run": {"name": run.name, "path": run.path}, "rows": page["rows"],
            "episodes": episodes}


def export_html(viewer: Viewer, run_id: int, q: Query, tokens: bool = True) -> str:
    """The export file's text (see the module docstring)."""
    return render_html(export_data(viewer, run_id, q, tokens))


def render_html(data: dict[str, Any]) -> str:
    """The export page around ``data`` (from :func:`export_data`)."""
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(data['title'])}</title>
<link rel="icon" href="data:,">
<style>
{_static('style.css')}
</style>
</head>
<body>
<header>
  <span class="brand">agentrl-jax viewer</span>
  <nav></nav>
  <span class="live"><input type="checkbox" id="live"><span id="live-status"></span></span>
</header>
<main id="view"><p class="muted">loading…</p></main>
<script>window.VIEWER_EXPORT = {_script_json(data)};</script>
<script>
{_static('app.js')}
</script>
</body>
</html>
"""


def write_export(viewer: Viewer, run_id: int, q: Query, path: str, tokens: bool = True) -> int:
    """Write the export file to ``path``; returns the number of episodes in it."""
    data = export_data(viewer, run_id, q, tokens)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(render_html(data))
    return len(data["rows"])


def export_data_rows(text: str) -> list[dict[str, Any]]:
    """The episode rows embedded in an export file's text (for checks and tests)."""
    start = text.index("window.VIEWER_EXPORT = ") + len("window.VIEWER_EXPORT = ")
    end = text.index(";</script>", start)
    return json.loads(text[start:end])["rows"]
