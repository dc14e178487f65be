"""The command line shared by every family server: ``python -m environments.<name> [options]``.

A family's ``__main__.py`` is three lines::

    from environments.core.cli import main

    main("babyai")
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import sys
from typing import Sequence

from environments.core.server import DEFAULT_MAX_BODY, build_app


def parse_args(name: str, argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"python -m environments.{name}", description=f"Serve the {name} environments over HTTP.")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default: loopback only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-sessions", type=int, default=1024, help="live environment instances at most (503 beyond)")
    parser.add_argument("--idle-timeout", type=float, default=600.0, help="close sessions unused for this many seconds")
    parser.add_argument("--max-body", type=int, default=DEFAULT_MAX_BODY, help="largest request body in bytes (413 beyond)")
    parser.add_argument("--workers", type=int, default=32, help="threads for blocking environment calls")
    parser.add_argument("--parent-pid", type=int, default=None, help="shut down when this process is gone (the launcher sets it)")
    parser.add_argument("--log-level", default="INFO")
    return parser.parse_args(argv)


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A uvloop loop when uvloop is installed (about 2x cheaper per request), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def main(name: str, argv: Sequence[str] | None = None) -> None:
    """Parse the command line and serve family ``name`` until SIGINT/SIGTERM."""
    from aiohttp import web

    from environments.registry import get_family

    args = parse_args(name, argv)
    logging.basicConfig(stream=sys.stderr, level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    family = get_family(name)
    # The server allocates many short-lived objects per request; fewer young-generation
    # collections cut the per-step CPU by ~5% (measured on BabyAI).
    gc.set_threshold(20_000, 20, 50)
    app = build_app(
        family,
        max_sessions=args.max_sessions,
        idle_timeout=args.idle_timeout,
        max_body=args.max_body,
        workers=args.workers,
        parent_pid=args.parent_pid,
    )
    logging.getLogger("environments.server").info("%s listening on http://%s:%d", name, args.host, args.port)
    web.run_app(
        app,
        host=args.host,
        port=args.port,
        access_log=None,
        print=None,
        shutdown_timeout=10.0,
        loop=new_event_loop(),
    )
