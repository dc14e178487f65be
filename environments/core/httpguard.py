"""Request limits shared by the environment servers and the inference server (aiohttp).

* **API key** (as SGLang's ``--api-key``): with a key set, every route except the open ones
  (``/health``...) needs ``Authorization: Bearer <key>``; 401 otherwise. A server that binds a
  non-loopback address must have a key: ``require_key_off_loopback`` refuses to start without.
* **Body size**: a ``Content-Length`` over the limit is answered 413 before anything is read;
  a chunked body is cut at the limit (aiohttp's ``client_max_size``), also 413.
* **Read timeouts**: the request line and headers must arrive within ``read_timeout`` of the
  connection opening or of the previous answer (aiohttp's keep-alive timer, which closes a
  connection whose request is incomplete), and the body within ``read_timeout`` of the handler
  starting to read it (408, connection closed).
* **Connection limit**: at most ``max_connections`` open connections; a further one is answered
  503 (``Retry-After``) and closed at once.

``run_app`` serves an application with all of the above until SIGINT / SIGTERM (what the CLIs
use); ``GuardedSite`` is the listening site alone (for ``AppRunner`` users such as tests).
``exit_with_parent`` shuts a server down once the process that launched it is gone.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import hmac
import ipaddress
import logging
import os
import signal
import socket
from typing import Any, Awaitable, Callable

from aiohttp import web

log = logging.getLogger("agentrl.httpguard")

DEFAULT_READ_TIMEOUT_S = 30.0
DEFAULT_MAX_CONNECTIONS = 1024
LINGER_S = 2.0  # at most this long draining an unread body after an error answer


@dataclasses.dataclass(frozen=True)
class Limits:
    """The limits of one server (see the module doc)."""

    max_body: int
    read_timeout: float = DEFAULT_READ_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    api_key: str | None = None

    def __post_init__(self) -> None:
        if self.max_body < 1 or self.read_timeout <= 0 or self.max_connections < 1:
            raise ValueError(f"invalid limits {self}: sizes and counts must be >= 1, timeouts > 0")
        if self.api_key is not None and not self.api_key:
            raise ValueError("an API key must not be empty")

    def runner_kwargs(self) -> dict[str, Any]:
        """aiohttp ``AppRunner`` options: the header read timeout and the post-error drain."""
        return {"keepalive_timeout": self.read_timeout, "lingering_time": min(LINGER_S, self.read_timeout)}


class GuardError(Exception):
    """A request refused by a limit; each server renders it in its own error format."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None, close: bool = False) -> None:
        super().__init__(message)
        self.status, self.message, self.headers, self.close = status, message, headers, close


# ------------------------------------------------------------------------------------ API key


def is_loopback(host: str | None) -> bool:
    """True when ``host`` only reaches this machine (``127.0.0.0/8``, ``::1``, ``localhost``).

    An empty host or ``0.0.0.0`` / ``::`` (every interface) is not loopback; a name is loopback
    only if every address it resolves to is.
    """
    if not host:
        return False
    name = host.strip("[]")
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(name, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def require_key_off_loopback(host: str | None, api_key: str | None) -> None:
    """Raise ``ValueError`` when ``host`` is not loopback and no API key is set."""
    if not api_key and not is_loopback(host):
        raise ValueError(
            f"refusing to serve on {host or 'every interface'!r} without an API key: set --api-key "
            "(clients then send 'Authorization: Bearer <key>') or bind 127.0.0.1"
        )


def authorized(header: str | None, api_key: str) -> bool:
    """Constant-time check of an ``Authorization`` header against ``Bearer <api_key>``."""
    given = (header or "").encode("utf-8", "replace")
    return hmac.compare_digest(given, f"Bearer {api_key}".encode("utf-8", "replace"))


def api_key_middleware(
    api_key: str,
    reject: Callable[[int, str, dict[str, str]], web.StreamResponse],
    open_prefixes: tuple[str, ...] = ("/health",),
) -> Callable:
    """An aiohttp middleware answering 401 (through ``reject(status, message, headers)``) to any
    request without the key, except on paths starting with one of ``open_prefixes``."""

    @web.middleware
    async def check_api_key(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
        if request.method != "OPTIONS" and not request.path.startswith(open_prefixes):
            if not authorized(request.headers.get("Authorization"), api_key):
                response = reject(401, "missing or invalid API key: send 'Authorization: Bearer <key>'", {"WWW-Authenticate": "Bearer"})
                response.force_close()
                return response
        return await handler(request)

    return check_api_key


# ---------------------------------------------------------------------------------- the body


async def read_body(request: web.Request, limits: Limits) -> bytes:
    """The whole request body within the size and time limits (``GuardError`` 413 / 408)."""
    length = request.content_length
    if length is not None and length > limits.max_body:
        raise GuardError(413, too_large_message(length, limits.max_body), close=True)
    try:
        if request.content.is_eof():  # already received in full (the usual small body): no timer
            return await request.read()
        return await asyncio.wait_for(request.read(), limits.read_timeout)
    except asyncio.TimeoutError:
        raise GuardError(408, f"the request body did not arrive within {limits.read_timeout:g} s", close=True) from None
    except web.HTTPRequestEntityTooLarge:
        raise GuardError(413, too_large_message(None, limits.max_body), close=True) from None


def too_large_message(length: int | None, limit: int) -> str:
    """The 413 text: what was sent (when declared) against the limit."""
    size = f" ({length} bytes)" if length is not None else ""
    return f"request body too large{size}: this server accepts at most {limit} bytes ({limit / 2**20:.3g} MiB)"


# ------------------------------------------------------------------------ connection limit


class _Counted(asyncio.Protocol):
    """Forwards every protocol event to aiohttp's handler and frees a slot when closed."""

    def __init__(self, inner: asyncio.Protocol, gate: ConnectionGate) -> None:
        self._inner, self._gate = inner, gate
        self._open = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._open:
            self._open = False
            self._gate.active -= 1
        self._inner.connection_lost(exc)


class _Refused(asyncio.Protocol):
    """Answers a canned 503 and closes: the server already has its maximum of connections."""

    def __init__(self, answer: bytes) -> None:
        self._answer = answer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.write(self._answer)  # type: ignore[attr-defined]
        transport.close()


class ConnectionGate:
    """A protocol factory admitting at most ``limit`` connections of ``inner``'s protocols."""

    def __init__(self, inner: Callable[[], asyncio.Protocol], limit: int, refusal_body: bytes) -> None:
        self.inner, self.limit = inner, limit
        self.active = 0
        self.refused = 0
        self._answer = (
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
            b"Connection: close\r\nContent-Length: " + str(len(refusal_body)).encode() + b"\r\n\r\n" + refusal_body
        )

    def __call__(self) -> asyncio.Protocol:
        if self.active >= self.limit:
            self.refused += 1
            if self.refused in (1, 10, 100) or self.refused % 1000 == 0:
                log.warning("connection limit %d reached: %d connections refused so far", self.limit, self.refused)
            return _Refused(self._answer)
        self.active += 1
        return _Counted(self.inner(), self)


class GuardedSite(web.BaseSite):
    """A TCP site (like ``web.TCPSite``) whose connections go through a ``ConnectionGate``."""

    def __init__(self, runner: web.BaseRunner, host: str | None, port: int, *, max_connections: int, refusal_body: bytes, backlog: int = 128) -> None:
        super().__init__(runner, backlog=backlog)
        self._host, self._port = host, port
        self._max_connections, self._refusal_body = max_connections, refusal_body
        self.gate: ConnectionGate | None = None

    @property
    def name(self) -> str:
        return f"http://{self._host or '0.0.0.0'}:{self.port}"

    @property
    def port(self) -> int:
        """The bound port (the requested one until started; port 0 picks a free one)."""
        if self._server is not None and self._server.sockets:
            return self._server.sockets[0].getsockname()[1]
        return self._port

    async def start(self) -> None:
        await super().start()
        assert self._runner.server is not None
        self.gate = ConnectionGate(self._runner.server, self._max_connections, self._refusal_body)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self.gate, self._host, self._port, backlog=self._backlog, reuse_address=True)


# ------------------------------------------------------------------------------------ serving


def run_app(
    app: web.Application,
    *,
    host: str,
    port: int,
    limits: Limits,
    refusal_body: bytes,
    loop: asyncio.AbstractEventLoop | None = None,
    shutdown_timeout: float = 60.0,
    handler_cancellation: bool = False,
) -> None:
    """Serve ``app`` on ``host:port`` with ``limits`` until SIGINT / SIGTERM (then clean up)."""
    require_key_off_loopback(host, limits.api_key)
    loop = loop or asyncio.new_event_loop()
    asyncio.set_event_loop(loop)

    async def serve() -> None:
        runner = web.AppRunner(
            app, handle_signals=True, access_log=None, shutdown_timeout=shutdown_timeout,
            handler_cancellation=handler_cancellation, **limits.runner_kwargs(),
        )  # fmt: skip
        await runner.setup()
        try:
            site = GuardedSite(runner, host, port, max_connections=limits.max_connections, refusal_body=refusal_body)
            await site.start()
            while True:
                await asyncio.sleep(3600)
        finally:
            await runner.cleanup()

    main = loop.create_task(serve())
    try:
        loop.run_until_complete(main)
    except (web.GracefulExit, KeyboardInterrupt):
        pass
    finally:
        main.cancel()
        loop.run_until_complete(asyncio.gather(main, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def freeze_heap() -> None:
    """Move the objects made at start-up (modules, compiled functions, a model, catalogs: they
    live as long as the process) out of the collector's generations, so that a full collection
    scans only the objects requests made.

    Without it a full collection walks the whole start-up heap while holding the GIL, and the
    event loop (and every other thread) waits for it: a pytest process that had run most of the
    suite (~1M objects) showed full collections of 0.4-0.7 s, and one of ~1.8 s stalled a
    ``/health`` probe in CI. The collector keeps its default thresholds: an environment's closed
    instances are reference cycles (a minigrid level: rooms <-> neighbours, instructions <->
    env), which only the collector frees, and rarer full collections
    (``gc.set_threshold(20_000, 20, 50)`` was tried) let them pile up: BabyAI's RSS grew
    139 -> 208 MB over four create/close storms."""
    gc.collect()
    gc.freeze()


async def freeze_startup_objects(app: web.Application | None = None) -> None:
    """``freeze_heap`` as an ``on_startup`` hook for a server's application."""
    freeze_heap()


def fit_connection_limit(wanted: int, reserve: int = 256) -> int:
    """``wanted`` connections, or fewer when the open-file limit cannot be raised to hold them
    plus ``reserve`` descriptors for the server's own files, pipes and threads."""
    available = raise_nofile_limit(wanted + reserve) - reserve
    if available < wanted:
        log.warning("the open-file limit allows %d connections, not %d", max(available, 1), wanted)
    return max(1, min(wanted, available))


def raise_nofile_limit(wanted: int) -> int:
    """Raise the soft open-file limit towards ``wanted`` (within the hard limit); returns it."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return wanted
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


async def exit_with_parent(parent_pid: int, interval: float = 1.0) -> None:
    """Shut down (SIGTERM to ourselves: a graceful exit) once the parent process ``parent_pid``
    is gone, so a launcher that dies without stopping its servers leaves nothing behind."""
    while os.getppid() == parent_pid:
        await asyncio.sleep(interval)
    log.warning("parent process %d exited; shutting down", parent_pid)
    os.kill(os.getpid(), signal.SIGTERM)
