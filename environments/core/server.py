"""The HTTP server core: serves any environment family over the shared JSON protocol.

Endpoints (all bodies and answers are JSON; see docs/ENVIRONMENTS.md):

* ``POST /create {"task_id"} | {"split", "index"} [+ "seed"] [+ "list_actions"] [+ "action_text"]``
  -> ``{"env_id", "observation", "info"}``; ``list_actions`` N (0..``MAX_LISTED_ACTIONS``): every
  observation of the session ends with up to N of the environment's valid actions (families that
  have them), also given as ``info["listed_actions"]``; ``"action_text": false``: no action list
  in the observation text at all (neither that line nor a family's own, e.g. BabyAI's), the
  actions in ``info`` only (``listed_actions``, or the family's ``available_actions``)
* ``POST /step {"env_id", "action"}`` -> ``{"observation", "reward", "done", "truncated", "info"}``
* ``POST /reset {"env_id" [, "task_id" | "split"+"index"] [, "seed"] [, "list_actions"] [, "action_text"]}`` -> like
  ``/create``
* ``POST /close {"env_id"}`` -> ``{"closed": true}``
* ``POST /batch {"calls": [{"op": "step", "env_id", "action"}, ...]}`` -> ``{"results": [{"status",
  "body"}, ...]}``: several of the calls above in one request (``EnvServer.batch``)
* ``GET /health``, ``GET /tasks?split=train|test[&offset=&limit=]``, ``GET /stats``

Errors are ``{"error": message}`` with a 4xx/5xx status, never a 200: unknown env id or task 404,
malformed JSON or missing / wrongly typed fields 400, oversized body 413, a step after the episode
ended 409, no free session slot 503 (with ``Retry-After``). An exception inside an environment is
a 500 with its message. Requests a web page could send are refused
(``httpguard.request_guard_middleware``): a POST without ``Content-Type: application/json`` 415,
a foreign ``Origin`` 403, a ``Host`` that is not one of the server's names 421 (on loopback, or
with ``allowed_hosts``); a GET on a POST route is 405 (``Allow: POST``).

Concurrency: calls on one instance are serialized by a per-session ``asyncio.Lock``; different
instances run concurrently on a thread pool, except for families declared ``inline`` (cheap,
non-blocking steps), which are called directly on the event loop. Idle sessions are closed after
``idle_timeout`` seconds; every instance is closed on shutdown.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
from typing import Any, Callable, Sequence, TypeVar

from aiohttp import web

from agentrl_common.httpguard import (DEFAULT_READ_TIMEOUT_S, GuardError, Limits, allowed_hosts as hosts_for,
                                         api_key_middleware, exit_with_parent, request_guard_middleware)
from environments.core.base import InvalidTaskError, ResetResult, StepResult, TaskCatalog, TextEnvironment
from environments.core.listing import R, wants_list, with_action_list
from environments.core.requests import (ProtocolError, action_text_field, error_response, json_response,
                                        list_actions_field, optional, query_int, read_json, required,
                                        task_id_field)
from environments.core.sessions import CapacityError, Session, SessionTable, Stats
from environments.core.spares import SpareInstances
from environments.registry import Family

log = logging.getLogger("environments.server")

T = TypeVar("T")

DEFAULT_MAX_BODY = 1 << 20  # 1 MiB: far above any action, far below what could hurt the server
RETRY_AFTER_S = "1"
MAX_BATCH_CALLS = 1024  # calls in one POST /batch

SERVER_KEY = web.AppKey("env_server", object)


# ---------------------------------------------------------------------------------------- server


class EnvServer:
    """Sessions of one family, and the handlers that serve them."""

    def __init__(
        self,
        family: Family,
        *,
        max_sessions: int = 1024,
        idle_timeout: float = 600.0,
        workers: int = 32,
        parent_pid: int | None = None,
        limits: Limits | None = None,
        reuse_instances: bool | None = None,
    ) -> None:
        self.family = family
        self.parent_pid = parent_pid
        self.limits = limits or Limits(max_body=DEFAULT_MAX_BODY)
        self.idle_timeout = idle_timeout
        self.sessions = SessionTable(max_sessions)
        # closed sessions' instances, for families that reuse them (environments/core/spares.py)
        # (``reuse_instances``: None = the family's Family.reuse_instances)
        reuse = family.reuse_instances if reuse_instances is None else reuse_instances
        self.spares = SpareInstances(max_sessions if reuse else 0)
        self.stats = Stats()
        self.catalog: TaskCatalog | None = None
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix=f"env-{family.name}"
        )

    # -- running environment code

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` inline for cheap families, else on the thread pool."""
        if self.family.inline:
            return fn(*args)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args))

    # -- lifecycle (aiohttp cleanup context)

    async def lifespan(self, app: web.Application):
        self.catalog = await self.call(self.family.catalog_factory)
        background = [asyncio.create_task(self._reap_forever())]
        if self.parent_pid is not None:
            background.append(asyncio.create_task(exit_with_parent(self.parent_pid)))
        log.info("serving family %s", self.family.name)
        yield
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        sessions = self.sessions.pop_all()
        await asyncio.gather(*(self._close_session(s, reuse=False) for s in sessions))
        await asyncio.gather(*(self._close_instance(env) for env in self.spares.drain()))
        self._executor.shutdown(wait=True, cancel_futures=True)
        log.info("closed %d sessions on shutdown", len(sessions))

    async def _reap_forever(self) -> None:
        interval = max(0.05, min(self.idle_timeout / 4, 5.0))
        while True:
            await asyncio.sleep(interval)
            for session in self.sessions.idle(self.idle_timeout):
                if self.sessions.pop(session.env_id) is session:
                    self.stats.sessions_reaped += 1
                    await self._close_session(session, reuse=False)
            for env in self.spares.expired(self.idle_timeout):
                await self._close_instance(env)

    async def _close_session(self, session: Session, reuse: bool = True) -> None:
        """End a session: its instance goes to the spares (``reuse``, a family that reuses
        instances, none of the instance's calls failed, room left) or is closed."""
        if session.closed:
            return
        session.closed = True
        self.stats.sessions_closed += 1
        if reuse and not session.failed and self.spares.offer(session.env):
            return
        await self._close_instance(session.env, session.env_id)

    async def _close_instance(self, env: TextEnvironment, label: str = "a spare instance") -> None:
        try:
            await self.call(env.close)
        except Exception:  # a failing close must not stop the others
            log.exception("closing %s (%s) failed", label, self.family.name)

    # -- helpers

    def _task_from(self, data: dict[str, Any], needed: bool) -> str | None:
        """The task id named by ``task_id`` or ``split``+``index`` (404 for unknown ones)."""
        task_id = task_id_field(data)
        split = optional(data, "split", str)
        index = optional(data, "index", int)
        if task_id is not None:
            if split is not None or index is not None:
                raise ProtocolError(400, "give either 'task_id' or 'split' and 'index', not both")
            return task_id
        if split is not None or index is not None:
            if split is None or index is None:
                raise ProtocolError(400, "'split' and 'index' must be given together")
            assert self.catalog is not None
            return self.catalog.resolve(split, index)  # InvalidTaskError -> 404
        if needed:
            raise ProtocolError(400, "missing field 'task_id' (or 'split' and 'index')")
        return None

    def _session(self, data: dict[str, Any]) -> Session:
        env_id = required(data, "env_id", str)
        session = self.sessions.get(env_id)
        if session is None:
            raise ProtocolError(404, f"unknown env_id {env_id!r}")
        return session

    @staticmethod
    def _reset_payload(session: Session, result: ResetResult) -> dict[str, Any]:
        info = dict(result.info)
        info.setdefault("task_id", session.task_id)
        return {"env_id": session.env_id, "observation": result.observation, "info": info}

    # -- handlers

    async def create(self, request: web.Request) -> web.Response:
        return json_response(await self.op_create(await read_json(request, self.limits)))

    async def reset(self, request: web.Request) -> web.Response:
        return json_response(await self.op_reset(await read_json(request, self.limits)))

    async def step(self, request: web.Request) -> web.Response:
        return json_response(await self.op_step(await read_json(request, self.limits)))

    async def close(self, request: web.Request) -> web.Response:
        return json_response(await self.op_close(await read_json(request, self.limits)))

    # -- operations (a request body in, an answer body out; errors raise)

    async def op_create(self, data: dict[str, Any]) -> dict[str, Any]:
        seed = optional(data, "seed", int)
        list_actions = list_actions_field(data) or 0
        action_text = action_text_field(data)
        action_text = True if action_text is None else action_text
        task_id = self._task_from(data, needed=True)
        try:
            self.sessions.reserve()
        except CapacityError as error:
            raise ProtocolError(503, str(error), headers={"Retry-After": RETRY_AFTER_S}) from None
        try:
            env, result, reused = await self._reset_an_instance(task_id, seed, action_text)
            self.stats.sessions_reused += reused
            session = self.sessions.add(env, task_id, seed)
            session.list_actions, session.action_text = list_actions, action_text
            try:
                result = await self._listing_actions(session, result)
            except BaseException:  # the client gets an error, not this session: close it
                self.sessions.pop(session.env_id)
                await self._close_session(session)
                raise
        finally:
            self.sessions.release()
        self.stats.sessions_created += 1
        return self._reset_payload(session, result)

    async def _reset_an_instance(self, task_id: str, seed: int | None, action_text: bool = True,
                                 ) -> tuple[TextEnvironment, ResetResult, bool]:
        """A spare instance (or a new one) reset onto ``task_id``, its ``action_text`` set first:
        (instance, reset result, reused).

        A spare whose reset fails is closed. When the request itself is bad (an unknown task) the
        error goes to the client; any other failure means the spare broke while idle (a browser
        that died), so a new instance gets the same reset and the client never sees the dead one.
        """
        spare = self.spares.take()
        if spare is not None:
            try:
                spare.action_text = action_text
                return spare, await self.call(spare.reset, task_id, seed), True
            except BaseException as error:
                await self.call(spare.close)
                if isinstance(error, InvalidTaskError) or not isinstance(error, Exception):
                    raise  # a bad request, or a cancellation: nothing to retry
                log.warning("a spare %s instance failed its reset (%s: %s); starting a new one",
                            self.family.name, type(error).__name__, error)
                self.stats.spares_replaced += 1
        env = await self.call(self.family.env_factory)
        try:
            env.action_text = action_text
            return env, await self.call(env.reset, task_id, seed), False
        except BaseException:
            await self.call(env.close)
            raise

    async def op_reset(self, data: dict[str, Any]) -> dict[str, Any]:
        required(data, "env_id", str)
        seed = optional(data, "seed", int)
        list_actions = list_actions_field(data)
        action_text = action_text_field(data)
        task_id = self._task_from(data, needed=False)
        session = self._session(data)
        async with session.lock:
            if session.closed:
                raise ProtocolError(404, f"unknown env_id {session.env_id!r}")
            task_id = task_id if task_id is not None else session.task_id
            seed = seed if "seed" in data else session.seed
            if action_text is not None:
                session.action_text = action_text
            session.env.action_text = session.action_text
            result = await self._env_call(session, session.env.reset, task_id, seed)
            session.task_id, session.seed = task_id, seed
            session.finished, session.steps = False, 0
            if list_actions is not None:
                session.list_actions = list_actions
            result = await self._listing_actions(session, result)
            session.touch()
        self.stats.resets += 1
        return self._reset_payload(session, result)

    async def op_step(self, data: dict[str, Any]) -> dict[str, Any]:
        action = required(data, "action", str)
        session = self._session(data)
        if self.family.inline:  # no await in between: calls on one session cannot interleave
            self._check_steppable(session)
            result = self._record_step(session, session.env.step(action))
            if wants_list(session):
                result = with_action_list(result, session.env.valid_actions(), session.list_actions,
                                          session.action_text)
        else:
            async with session.lock:
                self._check_steppable(session)
                result = self._record_step(session, await self._env_call(session, session.env.step,
                                                                         action))
                result = await self._listing_actions(session, result)
        return {
            "observation": result.observation,
            "reward": float(result.reward),
            "done": bool(result.done),
            "truncated": bool(result.truncated),
            "info": result.info,
        }

    async def _env_call(self, session: Session, fn: Callable[..., T], *args: Any) -> T:
        """``self.call(fn, *args)`` on the session's instance; an exception marks the session
        failed, so its instance is closed rather than kept for reuse."""
        try:
            return await self.call(fn, *args)
        except BaseException:
            session.failed = True
            raise

    async def _listing_actions(self, session: Session, result: R) -> R:
        """``result`` with the session's action list appended (``list_actions``), while the
        episode runs and the family has a list that its observations do not show already."""
        if not wants_list(session):
            return result
        env = session.env
        actions = env.valid_actions() if self.family.inline else await self.call(env.valid_actions)
        return with_action_list(result, actions, session.list_actions, session.action_text)

    def _check_steppable(self, session: Session) -> None:
        if session.closed:
            raise ProtocolError(404, f"unknown env_id {session.env_id!r}")
        if session.finished:
            raise ProtocolError(409, "the episode has ended; reset or close this environment")

    def _record_step(self, session: Session, result: StepResult) -> StepResult:
        session.steps += 1
        session.finished = bool(result.done or result.truncated)
        session.touch()
        self.stats.steps += 1
        if result.info.get("invalid_action"):
            self.stats.invalid_actions += 1
        return result

    async def op_close(self, data: dict[str, Any]) -> dict[str, Any]:
        session = self._session(data)
        self.sessions.pop(session.env_id)
        async with session.lock:  # let a call in progress finish first
            await self._close_session(session)
        return {"closed": True, "env_id": session.env_id}

    async def batch(self, request: web.Request) -> web.Response:
        """``POST /batch {"calls": [{"op": "create"|"reset"|"step"|"close", ...body}, ...]}``:
        several calls in one request (the client's way to save the per-request HTTP cost of
        small steps). Each call is answered as if it were its own request: ``{"results":
        [{"status": 200, "body": answer} | {"status": 4xx/5xx, "body": {"error": message}
        [, "retry_after": s]}, ...]}`` in call order. Calls run one after the other for inline
        families and concurrently otherwise (calls on one instance stay serialized by its lock)."""
        data = await read_json(request, self.limits)
        calls = data.get("calls")
        if not isinstance(calls, list):
            raise ProtocolError(400, "field 'calls' must be a list")
        if len(calls) > MAX_BATCH_CALLS:
            raise ProtocolError(400, f"at most {MAX_BATCH_CALLS} calls per batch, got {len(calls)}")
        if self.family.inline:
            results = [await self._batch_call(call) for call in calls]
        else:
            results = list(await asyncio.gather(*(self._batch_call(call) for call in calls)))
        self.stats.batches += 1
        return json_response({"results": results})

    async def _batch_call(self, call: Any) -> dict[str, Any]:
        op = call.get("op") if isinstance(call, dict) else None
        try:
            if not isinstance(call, dict):
                raise ProtocolError(400, "each call must be a JSON object")
            handler = self._ops.get(op) if isinstance(op, str) else None
            if handler is None:
                raise ProtocolError(400, f"field 'op' must be one of {sorted(self._ops)}, got {op!r}")
            return {"status": 200, "body": await handler(call)}
        except ProtocolError as error:
            status, message, headers = error.status, error.message, error.headers
        except InvalidTaskError as error:
            status, message, headers = 404, str(error), None
        except Exception as error:  # a bug in an environment: report it, keep serving
            log.exception("batched %s failed", op)
            status, message, headers = 500, f"{type(error).__name__}: {error}", None
        self.stats.errors[status] += 1
        entry: dict[str, Any] = {"status": status, "body": {"error": message}}
        if headers and "Retry-After" in headers:
            entry["retry_after"] = float(headers["Retry-After"])
        return entry

    @property
    def _ops(self) -> dict[str, Callable[[dict[str, Any]], Any]]:
        return {"create": self.op_create, "reset": self.op_reset, "step": self.op_step, "close": self.op_close}

    async def health(self, request: web.Request) -> web.Response:
        # "batch": whether clients should group calls into POST /batch (cheap inline steps;
        # slow families answer a batch only when its slowest call is done, so they are not)
        return json_response(
            {"status": "ok", "family": self.family.name, "live_sessions": len(self.sessions), "batch": bool(self.family.inline)}
        )

    async def tasks(self, request: web.Request) -> web.Response:
        split = request.query.get("split", "train")
        offset = query_int(request, "offset", 0)
        limit = query_int(request, "limit", None)
        assert self.catalog is not None and offset is not None
        ids = self.catalog.task_ids(split)  # InvalidTaskError -> 404
        end = len(ids) if limit is None else min(len(ids), offset + limit)
        page = [ids[i] for i in range(min(offset, end), end)]
        return json_response({"split": split, "count": len(ids), "offset": offset, "task_ids": page})

    async def stats_handler(self, request: web.Request) -> web.Response:
        payload = {
            "family": self.family.name,
            "live_sessions": len(self.sessions),
            "pending_creates": self.sessions.pending,
            "max_sessions": self.sessions.max_sessions,
            "idle_timeout_s": self.idle_timeout,
            **self.stats.as_dict(),
        }
        return json_response(payload)

    # -- error mapping

    @web.middleware
    async def errors(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        try:
            return await handler(request)
        except ProtocolError as error:
            status, message, headers = error.status, error.message, error.headers
        except GuardError as error:  # body too large or too slow: answer and close the connection
            self.stats.errors[error.status] += 1
            response = error_response(error.status, error.message, error.headers)
            response.force_close()
            return response
        except InvalidTaskError as error:
            status, message, headers = 404, str(error), None
        except web.HTTPException as error:  # unknown route 404, wrong method 405, body too large 413
            if error.status < 400:
                raise
            status, message, headers = error.status, error.text or error.reason, None
            if error.status == 405 and "Allow" in error.headers:
                headers = {"Allow": error.headers["Allow"]}
        except Exception as error:  # a bug in an environment: report it, keep serving
            log.exception("%s %s failed", request.method, request.path)
            status, message, headers = 500, f"{type(error).__name__}: {error}", None
        self.stats.errors[status] += 1
        return error_response(status, message, headers)


def build_app(
    family: Family,
    *,
    max_sessions: int = 1024,
    idle_timeout: float = 600.0,
    max_body: int = DEFAULT_MAX_BODY,
    workers: int = 32,
    parent_pid: int | None = None,
    read_timeout: float = DEFAULT_READ_TIMEOUT_S,
    api_key: str | None = None,
    host: str = "127.0.0.1",
    allowed_hosts: Sequence[str] = (),
    reuse_instances: bool | None = None,
) -> web.Application:
    """The aiohttp application serving ``family`` (``parent_pid``: exit when that process is gone;
    ``read_timeout``: seconds allowed for a request body; ``api_key``: required as
    ``Authorization: Bearer <key>`` on every route but ``/health``; ``host``: the address the
    server binds, whose names ``Host`` headers may use, with ``allowed_hosts``: see
    ``httpguard.allowed_hosts``; ``reuse_instances``: keep closed sessions' instances for later
    creates, None: the family's ``Family.reuse_instances``)."""
    limits = Limits(max_body=max_body, read_timeout=read_timeout, api_key=api_key)
    server = EnvServer(family, max_sessions=max_sessions, idle_timeout=idle_timeout, workers=workers, parent_pid=parent_pid,
                       limits=limits, reuse_instances=reuse_instances)

    def reject(status: int, message: str, headers: dict[str, str]) -> web.Response:
        server.stats.errors[status] += 1
        return error_response(status, message, headers)

    middlewares: list[Callable] = [request_guard_middleware(hosts_for(host, allowed_hosts), reject)]
    if api_key:
        middlewares.append(api_key_middleware(api_key, reject))
    middlewares.append(server.errors)
    app = web.Application(client_max_size=max_body, middlewares=middlewares)
    app[SERVER_KEY] = server
    app.cleanup_ctx.append(server.lifespan)
    app.router.add_post("/create", server.create)
    app.router.add_post("/step", server.step)
    app.router.add_post("/reset", server.reset)
    app.router.add_post("/close", server.close)
    app.router.add_post("/batch", server.batch)
    app.router.add_get("/health", server.health)
    app.router.add_get("/tasks", server.tasks)
    app.router.add_get("/stats", server.stats_handler)
    return app
