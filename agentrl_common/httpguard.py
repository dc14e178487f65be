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
* **Browser requests** (``request_guard_middleware``): a web page the user visits can send
  requests to a loopback server, but not with a JSON body (that needs a CORS preflight, which
  these servers never grant) and never without telling who it is (``Origin``,
  ``Sec-Fetch-Site``). So a ``Host`` header naming anything but the server's own names (DNS
  rebinding) is answered 421, an ``Origin`` other than the server's own or ``Sec-Fetch-Site:
  cross-site`` / ``same-site`` 403, and a body-carrying request (POST...) whose
  ``Content-Type`` is not ``application/json`` 415 (what a page can send without a preflight:
  ``text/plain``, forms). State-changing routes are registered for POST only (405 otherwise).
* **Malformed HTTP** (a bad request line or header): one WARNING line naming the peer and the
  reason (``ServerLog``), not aiohttp's traceback at ERROR.

``run_app`` serves an application with all of the above until SIGINT / SIGTERM (what the CLIs
use); ``GuardedSite`` is the listening site alone (for ``AppRunner`` users such as tests).
``exit_with_parent`` shuts a server down once the process that launched it is gone.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import ipaddress
import logging
import os
import signal
import socket
from typing import Any, Awaitable, Callable, Iterable

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from agentrl_common.gc_clock import freeze_heap

log = logging.getLogger("agentrl.httpguard")

DEFAULT_READ_TIMEOUT_S = 30.0
DEFAULT_MAX_CONNECTIONS = 1024
LINGER_S = 2.0  # at most this long draining an unread body after an error answer
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")  # what a client on this machine calls it
JSON_CONTENT_TYPE = "application/json"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})  # no body, no state change
FOREIGN_FETCH_SITES = frozenset({"cross-site", "same-site"})  # Sec-Fetch-Site of another origin


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
        """aiohttp ``AppRunner`` options: the header read timeout, the post-error drain and the
        server log that reports malformed requests in one line (``ServerLog``)."""
        return {"keepalive_timeout": self.read_timeout, "lingering_time": min(LINGER_S, self.read_timeout), "logger": SERVER_LOG}


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


# ------------------------------------------------------------------------- browser requests


def host_name(value: str) -> str | None:
    """The host name of a ``Host`` header (``name``, ``name:port``, ``[v6]:port``), lower case
    and without a trailing dot; None when it is not of that form."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[1:end], value[end + 1 :]
    else:
        name, colon, port = value.partition(":")
        rest = colon + port
    if rest and not (rest.startswith(":") and rest[1:].isdigit()):
        return None
    name = name.rstrip(".")
    return name or None


def allowed_hosts(bind_host: str | None, extra: Iterable[str] = ()) -> frozenset[str] | None:
    """The host names a request's ``Host`` header may name; None: any.

    A loopback server (no key needed) answers only to its own names: ``LOOPBACK_NAMES`` and
    ``bind_host``; so a page whose DNS name was rebound to 127.0.0.1 (its requests say
    ``Host: evil.example``) is refused. A server on another interface must have an API key,
    which a page does not know; it checks ``Host`` only when the operator lists the names
    clients use (``extra``: ``--allowed-host``), since those are not knowable here."""
    names = {n for n in (host_name(h) for h in extra) if n}
    if names or is_loopback(bind_host):
        bound = (bind_host or "").strip("[]").lower().rstrip(".")  # a name or an address, no port
        return frozenset({*LOOPBACK_NAMES, *names, *([bound] if bound and bound not in ("0.0.0.0", "::") else [])})
    return None


def refusal(request: web.Request, hosts: frozenset[str] | None) -> tuple[int, str] | None:
    """Why ``request`` is refused as a browser's cross-site request (status, message), or None.

    421: a ``Host`` not in ``hosts``. 403: an ``Origin`` that is not this server's own
    (``http(s)://`` + the ``Host`` header), or ``Sec-Fetch-Site`` saying another site or origin
    sent it. 415: a request other than GET / HEAD / OPTIONS to an existing route without a JSON
    ``Content-Type``."""
    host = request.headers.get("Host")
    if hosts is not None and host is not None and host_name(host) not in hosts:
        return 421, (f"Host {host[:100]!r} is not a name of this server: use the address it serves on "
                     "(or start it with --allowed-host NAME)")
    origin = request.headers.get("Origin")
    if origin is not None and (host is None or origin.lower() not in (f"http://{host.lower()}", f"https://{host.lower()}")):
        return 403, f"cross-origin request refused (Origin {origin[:100]!r}): this server takes no requests from web pages"
    if request.headers.get("Sec-Fetch-Site", "").lower() in FOREIGN_FETCH_SITES:
        return 403, "cross-site request refused (Sec-Fetch-Site): this server takes no requests from web pages"
    if request.method not in SAFE_METHODS and request.match_info.http_exception is None:
        given = request.headers.get("Content-Type")
        if given is None or request.content_type != JSON_CONTENT_TYPE:
            what = f"Content-Type {given[:100]!r}" if given is not None else "no Content-Type"
            return 415, f"{request.method} bodies must be JSON: send 'Content-Type: {JSON_CONTENT_TYPE}' (got {what})"
    return None


def request_guard_middleware(
    hosts: frozenset[str] | None,
    reject: Callable[[int, str, dict[str, str]], web.StreamResponse],
) -> Callable:
    """An aiohttp middleware answering ``refusal``'s statuses through ``reject(status, message,
    headers)`` (``hosts``: from ``allowed_hosts``). Put it first: nothing else runs for a
    refused request."""

    @web.middleware
    async def guard_request(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
        refused = refusal(request, hosts)
        if refused is not None:
            status, message = refused
            return reject(status, message, {"Accept": JSON_CONTENT_TYPE} if status == 415 else {})
        return await handler(request)

    return guard_request


# ----------------------------------------------------------------------------- malformed HTTP


class ServerLog(logging.LoggerAdapter):
    """aiohttp's server logger (``aiohttp.server``), except that a request aiohttp could not
    parse (``HttpProcessingError``: a bad request line, header or chunk) is one WARNING line
    ``malformed HTTP request from <peer>: <reason>`` instead of a traceback at ERROR (or, for
    a connection's first request with a bad method, at DEBUG: what aiohttp does for non-HTTP
    traffic such as TLS sent to an HTTP port). Errors of the application keep their
    tracebacks."""

    def exception(self, msg: Any, *args: Any, exc_info: Any = True, **kwargs: Any) -> None:
        if not self._malformed(args, exc_info):
            self.logger.exception(msg, *args, exc_info=exc_info, **kwargs)

    def debug(self, msg: Any, *args: Any, exc_info: Any = None, **kwargs: Any) -> None:
        if not self._malformed(args, exc_info):
            self.logger.debug(msg, *args, exc_info=exc_info, **kwargs)

    def _malformed(self, args: tuple[Any, ...], exc_info: Any) -> bool:
        """Log the one line if ``exc_info`` is a parse error (aiohttp's ``handle_error`` passes
        the peer as the first argument); True when it was."""
        if not isinstance(exc_info, HttpProcessingError):
            return False
        peer = args[0] if args else "an unknown peer"
        reason = " ".join(str(exc_info.message or type(exc_info).__name__).split())
        self.logger.warning("malformed HTTP request from %s: %s", peer, reason[:200])
        return True


SERVER_LOG = ServerLog(logging.getLogger("aiohttp.server"), {})


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
