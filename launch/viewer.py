"""The trajectory viewer (same as ``python -m agentrl_jax.viewer``):

    python launch/viewer.py runs/babyai [runs/other ...] [--port 8765]
    python launch/viewer.py runs/babyai --export episodes.html --status done --limit 20
    python launch/viewer.py runs/babyai --host 0.0.0.0 --api-key KEY   # off loopback: a key

Loopback by default; any other address needs ``--api-key`` (default ``$AGENTRL_VIEWER_API_KEY``).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from agentrl_jax.viewer.__main__ import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
