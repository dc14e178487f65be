"""The trajectory viewer (same as ``python -m agentrl_jax.viewer``):

    python launch/viewer.py runs/babyai [runs/other ...] [--port 8765]
    python launch/viewer.py runs/babyai --export episodes.html --status done --limit 20
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from agentrl_jax.viewer.__main__ import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
