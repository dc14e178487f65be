"""The command line shared by every family server: ``python -m environments.<name> [options]``.

A family's ``__main__.py`` is three lines::

    from environments.core.cli import main

    main("babyai")
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from typing import Sequence

from environments.core import jsonio
from agentrl_common.httpguard import (DEFAULT_MAX_CONNECTIONS, DEFAULT_READ_TIMEOUT_S, Limits, fit_connection_limit,
                                         freeze_startup_objects, require_key_off_loopback, run_app)
from environments.core.server import DEFAULT_MAX_BODY, build_app

API_KEY_ENV = "AGENTRL_ENV_API_KEY"

log = logging.getLogger("environments.server")


def parse_args(name: str, argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"python -m environments.{name}", description=f"Serve the {name} environments over HTTP.")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default: loopback only; any other needs --api-key)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-sessions", type=int, default=1024, help="live environment instances at most (503 beyond)")
    parser.add_argument("--idle-timeout", type=float, default=600.0, help="close sessions unused for this many seconds")
    parser.add_argument("--max-body", type=int, default=DEFAULT_MAX_BODY, help="largest request body in bytes (413 beyond)")
    parser.add_argument("--read-timeout", type=float, default=DEFAULT_READ_TIMEOUT_S,
                        help="seconds allowed for a request's headers (from the connection or the previous answer) and for its body (408)")
    parser.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS, help="open connections at most (503 and closed beyond)")
    parser.add_argument("--api-key", default=os.environ.get(API_KEY_ENV) or None,
                        help=f"require 'Authorization: Bearer <key>' on every route but /health (default: ${API_KEY_ENV})")
    parser.add_argument("--allowed-host", action="append", default=[],
                        help="a host name clients reach this server by (repeatable); requests naming another Host are refused (421). "
                        "Default: the loopback names on loopback, any Host elsewhere (the API key guards)")
    parser.add_argument("--workers", type=int, default=32, help="threads for blocking environment calls")
    parser.add_argument("--no-reuse", action="store_true",
                        help="close every environment instance with its session (families that reuse instances, e.g. MiniWoB++'s "
                        "browsers, otherwise keep them for the next /create)")
    parser.add_argument("--parent-pid", type=int, default=None, help="shut down when this process is gone (the launcher sets it)")
    parser.add_argument("--log-level", default="INFO")
    return parser.parse_args(argv)


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A uvloop loop when uvloop is installed (cheaper per request), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def main(name: str, argv: Sequence[str] | None = None) -> None:
    """Parse the command line and serve family ``name`` until SIGINT/SIGTERM."""
    from environments.registry import get_family

    args = parse_args(name, argv)
    logging.basicConfig(stream=sys.stderr, level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        require_key_off_loopback(args.host, args.api_key)
        limits = Limits(max_body=args.max_body, read_timeout=args.read_timeout,
                        max_connections=fit_connection_limit(args.max_connections), api_key=args.api_key)
    except ValueError as error:
        sys.exit(f"error: {error}")
    family = get_family(name)
    app = build_app(
        family,
        max_sessions=args.max_sessions,
        idle_timeout=args.idle_timeout,
        max_body=args.max_body,
        workers=args.workers,
        parent_pid=args.parent_pid,
        read_timeout=args.read_timeout,
        api_key=args.api_key,
        host=args.host,
        allowed_hosts=args.allowed_host,
        reuse_instances=False if args.no_reuse else None,
    )
    app.on_startup.append(freeze_startup_objects)
    log.info("%s listening on http://%s:%d", name, args.host, args.port)
    refusal = jsonio.dumps({"error": f"too many connections (limit {limits.max_connections}); retry later"})
    run_app(app, host=args.host, port=args.port, limits=limits, refusal_body=refusal, loop=new_event_loop(), shutdown_timeout=10.0)
