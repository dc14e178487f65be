"""The viewer's HTTP server (aiohttp): the page, its static files and a JSON API.

    GET /                      the page (static/index.html, dom.js, app.js, style.css; nothing
                               external)
    GET /api/runs              every run: config, summary, evaluation table, trajectory files
    GET /api/metrics?run=R     metrics.jsonl rows and the learning-curve panels
    GET /api/status            per run: file sizes, last step, indexed episodes (polled: live view)
    GET /api/facets?run=R      filter values (kinds, envs, statuses, step range)
    GET /api/episodes?run=R&…  one page of episodes (filters, q= text search, sort, offset, limit)
    GET /api/episode?run=R&file=F&row=N[&tokens=0]   one episode: turns, tokens, mask checks
    GET /api/compare?run=R     held-out tasks at the first vs the last evaluation
    GET /api/export?run=R&…    a self-contained HTML file of the episodes of a query

Every parameter is validated (``params.py``): a bad one is a 400 (unknown run / file / row: 404)
with a JSON ``{"error": message}``. A background thread indexes the runs' trajectory files and
keeps indexing what the trainer appends, so lists, curves and status grow while a run trains.

Guards (``agentrl_common.httpguard``, as the environment and rollout servers): a ``Host`` that
is not one of the server's names is 421 (DNS rebinding), a foreign ``Origin`` or
``Sec-Fetch-Site`` 403; with an API key every ``/api/`` route needs ``Authorization: Bearer
<key>`` (401; the page and its static files carry no run data and stay open, the page asks for
the key). Every answer carries ``X-Content-Type-Options: nosniff`` and a Content-Security-Policy:
the page may run only its own script file (:data:`PAGE_CSP`: no inline script, no inline event
handler, nothing from another origin), the JSON and the export nothing at all (:data:`DATA_CSP`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Awaitable, Callable

from aiohttp import web

from agentrl_common.httpguard import allowed_hosts as hosts_for
from agentrl_common.httpguard import (GuardedSite, Limits, authorized, request_guard_middleware,
                                     require_key_off_loopback)
from agentrl_jax.viewer import export as export_mod
from agentrl_jax.viewer import params as P
from agentrl_jax.viewer.api import Viewer, ViewerError

log = logging.getLogger(__name__)

STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
STATIC_FILES = {"dom.js": "application/javascript", "app.js": "application/javascript",
                "style.css": "text/css"}
VIEWER_KEY = web.AppKey("viewer", Viewer)
STATE_KEY = web.AppKey("state", dict)
MAX_REQUEST_BODY = 64 << 10  # the viewer takes no bodies (GET only)
#: the page: its own script and style files only (inline styles for the charts' colours)
PAGE_CSP = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
            "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; "
            "frame-ancestors 'none'")
#: everything else (JSON, static files, the export download): no script, no frames
DATA_CSP = "default-src 'none'; frame-ancestors 'none'; sandbox"


class Indexer(threading.Thread):
    """Keeps every run's index up to date: new lines of known files (at most ``chunk`` bytes
    per file and pass, so a large first build publishes progress), new files every
    ``rescan_s``; sleeps ``poll_s`` when nothing is pending."""

    def __init__(self, viewer: Viewer, poll_s: float = 1.0, rescan_s: float = 5.0,
                 chunk: int = 64 << 20):
        super().__init__(name="viewer-indexer", daemon=True)
        self.viewer, self.poll_s, self.rescan_s, self.chunk = viewer, poll_s, rescan_s, chunk
        self.stop_event = threading.Event()
        self.passes = 0
        self.error: str | None = None

    def run(self) -> None:
        last_scan = 0.0
        while not self.stop_event.is_set():
            busy = False
            try:
                if time.monotonic() - last_scan >= self.rescan_s:
                    for r in self.viewer.runs:
                        r.index.rescan()
                    last_scan = time.monotonic()
                for r in self.viewer.runs:
                    r.index.update(self.chunk)
                    busy = busy or r.index.pending_bytes > 0
                self.error = None
            except Exception as e:  # keep serving what is indexed; report it in /api/status
                log.exception("indexing failed")
                self.error = f"{type(e).__name__}: {e}"
            self.passes += 1
            if not busy:
                self.stop_event.wait(self.poll_s)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=_dumps)


def _dumps(data: Any) -> str:
    """Strict JSON (browsers reject NaN / Infinity): non-finite numbers become null."""
    import json
    try:
        return json.dumps(data, allow_nan=False, default=_default)
    except ValueError:
        return json.dumps(_finite(data), allow_nan=False, default=_default)


def _finite(x: Any) -> Any:
    import math
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def _default(x: Any) -> Any:
    import numpy as np
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


@web.middleware
async def _errors(request: web.Request, handler: Callable[[web.Request], Awaitable]) -> Any:
    """ViewerError -> its 4xx with ``{"error": ...}``; aiohttp's own HTTP errors (404 of an
    unknown path, 405) as JSON too."""
    try:
        return await handler(request)
    except ViewerError as e:
        return _json({"error": str(e)}, e.status)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        return _json({"error": e.reason or e.text or str(e.status)}, e.status)


def _refused(status: int, message: str, headers: dict[str, str]) -> web.Response:
    """The answer to a request the guards refuse: ``{"error": message}`` with ``status``."""
    response = _json({"error": message}, status)
    response.headers.update(headers)
    return response


def _api_key_middleware(api_key: str) -> Callable:
    """401 for an ``/api/`` request without ``Authorization: Bearer <api_key>`` (the page and
    its static files hold no run data; the page asks the user for the key)."""
    @web.middleware
    async def check_api_key(request: web.Request,
                            handler: Callable[[web.Request], Awaitable]) -> Any:
        if request.path.startswith("/api/") and not authorized(
                request.headers.get("Authorization"), api_key):
            response = _refused(401, "this viewer needs its API key: send 'Authorization: "
                                     "Bearer <key>' (the page asks for it)",
                                {"WWW-Authenticate": "Bearer"})
            response.force_close()
            return response
        return await handler(request)
    return check_api_key


async def _security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """``nosniff`` and the Content-Security-Policy (the page's, or none-at-all) on every
    answer, refusals and errors included."""
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    response.headers["Content-Security-Policy"] = PAGE_CSP if request.path == "/" else DATA_CSP


def _handler(allowed: tuple[str, ...], blocking: bool = True):
    """Wrap ``fn(viewer, params) -> data``: check parameter names, run it in the worker pool
    (``blocking``), answer JSON (or a ready Response)."""
    def wrap(fn: Callable[[Viewer, Any], Any]):
        @functools.wraps(fn)
        async def handle(request: web.Request) -> web.StreamResponse:
            params = request.rel_url.query
            P.check_names(params, allowed)
            viewer = request.app[VIEWER_KEY]
            if blocking:
                pool = request.app[STATE_KEY]["pool"]
                result = await asyncio.get_running_loop().run_in_executor(
                    pool, fn, viewer, params)
            else:
                result = fn(viewer, params)
            return result if isinstance(result, web.StreamResponse) else _json(result)
        return handle
    return wrap


def _run_id(viewer: Viewer, params: Any) -> int:
    run = P.get_int(params, "run", required=True, hi=10**6)
    viewer.run(run)  # 404 when unknown
    return run


@_handler(())
def api_runs(viewer: Viewer, params: Any) -> Any:
    return {"runs": viewer.runs_info()}


@_handler(("run",))
def api_metrics(viewer: Viewer, params: Any) -> Any:
    return viewer.metrics(_run_id(viewer, params))


async def api_status(request: web.Request) -> web.StreamResponse:
    P.check_names(request.rel_url.query, ())
    state = request.app[STATE_KEY]
    data = await asyncio.get_running_loop().run_in_executor(state["pool"],
                                                            request.app[VIEWER_KEY].status)
    indexer = state.get("indexer")
    data["indexer"] = ({"running": indexer.is_alive(), "passes": indexer.passes,
                        "error": indexer.error} if indexer is not None else None)
    return _json(data)


@_handler(("run",))
def api_facets(viewer: Viewer, params: Any) -> Any:
    return viewer.facets(_run_id(viewer, params))


@_handler(("run",) + P.QUERY_PARAMS)
def api_episodes(viewer: Viewer, params: Any) -> Any:
    run = _run_id(viewer, params)
    return viewer.episodes(run, P.parse_query(params))


@_handler(("run", "file", "row", "tokens"))
def api_episode(viewer: Viewer, params: Any) -> Any:
    run = _run_id(viewer, params)
    file = P.get_int(params, "file", required=True)
    row = P.get_int(params, "row", required=True)
    return viewer.episode(run, file, row, tokens=bool(P.get_bool(params, "tokens", True)))


@_handler(("run",))
def api_compare(viewer: Viewer, params: Any) -> Any:
    return viewer.compare(_run_id(viewer, params))


@_handler(("run", "tokens") + P.QUERY_PARAMS)
def api_export(viewer: Viewer, params: Any) -> Any:
    run = _run_id(viewer, params)
    q = P.parse_query(params)
    if q.limit > export_mod.MAX_EPISODES:
        raise ViewerError(f"an export holds at most {export_mod.MAX_EPISODES} episodes "
                          f"(limit={q.limit})")
    html = export_mod.export_html(viewer, run, q, tokens=bool(P.get_bool(params, "tokens",
                                                                            True)))
    name = f"{export_mod.file_name(viewer.run(run).name)}-episodes.html"
    return web.Response(text=html, content_type="text/html", headers={
        "Content-Disposition": f'attachment; filename="{name}"'})


async def page(request: web.Request) -> web.StreamResponse:
    if request.rel_url.query:
        P.check_names(request.rel_url.query, ())
    return web.FileResponse(os.path.join(STATIC_DIR, "index.html"),
                            headers={"Cache-Control": "no-cache"})


async def static(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    if name not in STATIC_FILES:
        raise ViewerError(f"no static file {name[:60]!r}", 404)
    return web.FileResponse(os.path.join(STATIC_DIR, name),
                            headers={"Content-Type": STATIC_FILES[name],
                                     "Cache-Control": "no-cache"})


def make_app(viewer: Viewer, index_in_background: bool = True, poll_s: float = 1.0,
             host: str = "127.0.0.1", allowed_hosts: tuple[str, ...] = (),
             api_key: str | None = None) -> web.Application:
    """The aiohttp application for ``viewer`` served on ``host`` (whose names ``Host`` headers
    may use, with ``allowed_hosts``: ``httpguard.allowed_hosts``). ``api_key``: required on
    ``/api/`` routes. ``index_in_background``: start the indexer thread with the app
    (otherwise call ``viewer.update()`` yourself)."""
    middlewares: list[Callable] = [request_guard_middleware(hosts_for(host, allowed_hosts),
                                                            _refused)]
    if api_key:
        middlewares.append(_api_key_middleware(api_key))
    app = web.Application(middlewares=[*middlewares, _errors],
                          client_max_size=MAX_REQUEST_BODY)
    app.on_response_prepare.append(_security_headers)
    app[VIEWER_KEY] = viewer
    app[STATE_KEY] = {}

    async def start(app: web.Application) -> None:
        app[STATE_KEY]["pool"] = ThreadPoolExecutor(4, thread_name_prefix="viewer")
        if index_in_background:
            indexer = Indexer(viewer, poll_s=poll_s)
            indexer.start()
            app[STATE_KEY]["indexer"] = indexer
        # load the tokenizers now (seconds each) so the first token view does not wait
        threading.Thread(target=lambda: [r.tokenizer() for r in viewer.runs],
                         name="viewer-tokenizers", daemon=True).start()

    async def stop(app: web.Application) -> None:
        indexer = app[STATE_KEY].get("indexer")
        if indexer is not None:
            indexer.stop_event.set()
            await asyncio.get_running_loop().run_in_executor(None, indexer.join, 30)
        app[STATE_KEY]["pool"].shutdown(wait=False, cancel_futures=True)

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    app.router.add_get("/", page)
    app.router.add_get("/static/{name}", static)
    app.router.add_get("/api/runs", api_runs)
    app.router.add_get("/api/metrics", api_metrics)
    app.router.add_get("/api/status", api_status)
    app.router.add_get("/api/facets", api_facets)
    app.router.add_get("/api/episodes", api_episodes)
    app.router.add_get("/api/episode", api_episode)
    app.router.add_get("/api/compare", api_compare)
    app.router.add_get("/api/export", api_export)
    return app


async def start_site(app: web.Application, host: str, port: int, api_key: str | None
                     ) -> tuple[web.AppRunner, GuardedSite]:
    """Serve ``app`` on ``host:port`` with the other servers' limits (``httpguard``: header
    and body read timeouts, a connection limit, one line per malformed request); refuses a
    non-loopback ``host`` without ``api_key`` (``ValueError``)."""
    require_key_off_loopback(host, api_key)
    limits = Limits(max_body=MAX_REQUEST_BODY, api_key=api_key)
    runner = web.AppRunner(app, access_log=None, **limits.runner_kwargs())
    await runner.setup()
    site = GuardedSite(runner, host, port, max_connections=limits.max_connections,
                       refusal_body=b'{"error": "too many connections; retry later"}')
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner, site


class BackgroundServer:
    """The viewer served from a thread of this process (tests, notebooks, scripts):

        with BackgroundServer(viewer) as url:   # http://127.0.0.1:<free port>/
            ...
    """

    def __init__(self, viewer: Viewer, host: str = "127.0.0.1", port: int = 0,
                 poll_s: float = 1.0, api_key: str | None = None,
                 allowed_hosts: tuple[str, ...] = ()):
        require_key_off_loopback(host, api_key)
        self.viewer, self.host, self.port, self.poll_s = viewer, host, port, poll_s
        self.api_key, self.allowed_hosts = api_key, tuple(allowed_hosts)
        self.url: str | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="viewer-http",
                                        daemon=True)
        self._runner: web.AppRunner | None = None

    async def _start(self) -> str:
        self._runner, site = await start_site(
            make_app(self.viewer, poll_s=self.poll_s, host=self.host,
                     allowed_hosts=self.allowed_hosts, api_key=self.api_key),
            self.host, self.port, self.api_key)
        return f"http://{self.host}:{site.port}/"

    def start(self) -> str:
        self._thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(60)
        return self.url

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(60)
            self._runner = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
