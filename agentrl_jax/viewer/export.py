"""A self-contained HTML file of chosen episodes: the page's own CSS and JavaScript inlined and
the episodes' data embedded as JSON (turns, and the token view unless ``tokens=False``), so it
opens from disk in any browser, with no server and no network.

The file runs no script of the run's: the data sits in a ``<script type="application/json">``
block (never executed; ``<``, ``>`` and ``&`` written as ``\u003c``... so no text in it can end
the block), the page builds its HTML through one escaping helper (``static/dom.js``), and a
Content-Security-Policy ``<meta>`` lets only the page's own scripts run (by their SHA-256 hashes: no
other inline script, no inline event handler, nothing fetched). A malformed episode is exported
with its bad fields marked (``malformed``); one that cannot be read at all is left out, and
:class:`ExportSummary` counts both."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import html
import json
import re
import os
import time
from typing import Any

from agentrl_jax.viewer.api import Viewer, ViewerError
from agentrl_jax.viewer.index import Query

MAX_EPISODES = 1000
DATA_ELEMENT_ID = "viewer-export"  # the JSON block static/dom.js reads in an export file
SCRIPTS = ("dom.js", "app.js")  # the page's scripts, in loading order (static/index.html)
STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")


def _static(name: str) -> str:
    with open(os.path.join(STATIC_DIR, name), encoding="utf-8") as f:
        return f.read()


def _script_json(data: Any) -> str:
    """JSON that is safe inside a ``<script>`` element (no ``</script>`` or ``<!--``)."""
    text = json.dumps(data, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


@dataclasses.dataclass(frozen=True)
class ExportSummary:
    """What an export file holds: ``episodes`` written, of which ``malformed`` have fields
    marked bad; ``skipped`` could not be read and are not in the file."""

    episodes: int
    malformed: int = 0
    skipped: int = 0

    def line(self, path: str) -> str:
        """The one line the command line prints."""
        notes = [f"{self.malformed} malformed (bad fields marked)"] if self.malformed else []
        notes += [f"{self.skipped} unreadable, left out"] if self.skipped else []
        return (f"wrote {self.episodes} episodes to {path}"
                + (f" ({'; '.join(notes)})" if notes else ""))


def file_name(text: str) -> str:
    """``text`` as a safe file-name part (letters, digits, ``._-``; at most 100)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._")[:100] or "run"


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
    episodes, rows, skipped = {}, [], []
    for r in page["rows"]:
        try:
            episodes[f"{r['file']}:{r['row']}"] = viewer.episode(run_id, r["file"], r["row"],
                                                                 tokens)
        except ViewerError as e:  # the file changed under the index: leave it out, say so
            skipped.append(f"file {r['file']} row {r['row']}: {e}")
            continue
        rows.append(r)
    malformed = sum(bool(ep.get("malformed")) for ep in episodes.values())
    notes = (f"; {malformed} malformed (bad fields marked)" if malformed else "") + (
        f"; {len(skipped)} unreadable, left out" if skipped else "")
    return {"title": f"{run.name}: {len(rows)} of {page['total']} matching episodes",
            "description": f"run {run.path}; {describe(q)}; exported "
                           f"{time.strftime('%Y-%m-%d %H:%M:%S')}{notes}",
            "run": {"name": run.name, "path": run.path}, "rows": rows,
            "episodes": episodes, "skipped": skipped}


def export_html(viewer: Viewer, run_id: int, q: Query, tokens: bool = True) -> str:
    """The export file's text (see the module docstring)."""
    return render_html(export_data(viewer, run_id, q, tokens))


def script_hash(text: str) -> str:
    """The CSP source ``'sha256-…'`` allowing the inline script whose text is ``text``."""
    digest = base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode()
    return f"'sha256-{digest}'"


def render_html(data: dict[str, Any]) -> str:
    """The export page around ``data`` (from :func:`export_data`)."""
    scripts = ["\n" + _static(name) + "\n" for name in SCRIPTS]
    csp = (f"default-src 'none'; script-src {' '.join(map(script_hash, scripts))}; "
           "style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'")
    inline = "\n".join(f"<script>{text}</script>" for text in scripts)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{html.escape(csp)}">
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
<script type="application/json" id="{DATA_ELEMENT_ID}">{_script_json(data)}</script>
{inline}
</body>
</html>
"""


def write_export(viewer: Viewer, run_id: int, q: Query, path: str,
                 tokens: bool = True) -> ExportSummary:
    """Write the export file to ``path``; what it holds (:class:`ExportSummary`)."""
    data = export_data(viewer, run_id, q, tokens)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(render_html(data))
    return ExportSummary(len(data["rows"]),
                         sum(bool(ep.get("malformed")) for ep in data["episodes"].values()),
                         len(data["skipped"]))


def export_data_rows(text: str) -> list[dict[str, Any]]:
    """The episode rows embedded in an export file's text (for checks and tests)."""
    opening = f'<script type="application/json" id="{DATA_ELEMENT_ID}">'
    start = text.index(opening) + len(opening)
    end = text.index("</script>", start)
    return json.loads(text[start:end])["rows"]
