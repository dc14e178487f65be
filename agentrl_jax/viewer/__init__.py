"""The trajectory viewer: a local web page of a run's curves, evaluations and episodes.

    python -m agentrl_jax.viewer RUN_DIR [RUN_DIR ...]

Python API (notebooks, scripts): :class:`Viewer` (every view's data as dicts), :class:`Query`
(filters, search, sort, page), :func:`render_text` (an episode turn by turn as text),
:class:`RunIndex` (the seekable episode index). See docs/VIEWER.md.
"""

from agentrl_jax.viewer.api import Viewer, ViewerError
from agentrl_jax.viewer.episode import render_text
from agentrl_jax.viewer.index import Query, RunIndex

__all__ = ["Viewer", "ViewerError", "Query", "RunIndex", "render_text"]
