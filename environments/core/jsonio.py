"""Fast JSON encoding for the protocol: orjson when installed, the standard library otherwise."""

from __future__ import annotations

import json
from typing import Any

try:  # orjson is optional: several times faster on the small messages of the protocol
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None


def dumps(obj: Any) -> bytes:
    """Serialise ``obj`` to UTF-8 JSON bytes."""
    if _orjson is not None:
        return _orjson.dumps(obj, option=_orjson.OPT_SERIALIZE_NUMPY)
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def loads(data: bytes | str) -> Any:
    """Parse JSON bytes or text; raises ``ValueError`` on malformed input."""
    if _orjson is not None:
        return _orjson.loads(data)
    return json.loads(data)
