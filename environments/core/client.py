"""The async client of the environment protocol, used by the RL actor pool.

One ``EnvClient`` talks to one or more replicas of a family server. ``create`` picks the replica
with the fewest live sessions and requests in flight (round-robin among ties, skipping replicas
that just failed to connect); the env id it returns names that replica (``"<replica>:<server id>"``
when there are several; the server's own id when there is one), so ``step``/``reset``/``close``
always go back to the replica that holds the instance.

Retries: ``create``, ``health``, ``tasks`` and ``stats`` are retried with exponential backoff on
connection failures (``create`` also on 503, capacity reached). ``step``, ``reset`` and ``close``
are never retried: a step that timed out may have been applied, so the caller decides.

Errors: an answer with a 4xx/5xx status raises ``EnvServerError(status, message)``; a connection
failure or timeout raises ``EnvConnectionError``.

Batching: ``create``, ``step`` and ``close`` calls made in the same event-loop iteration for one replica are
sent as one ``POST /batch`` (each call still gets its own answer or error) when the replica says
so in ``/health`` (``"batch": true``: families with cheap inline steps) and ``batch`` is not
False. Under many concurrent episodes that turns dozens of small HTTP exchanges into one, on
both sides (docs/PERFORMANCE.md, "Host cost of a turn"). A replica without ``/batch`` (an older
server) is asked call by call.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from typing import Any, Awaitable, Callable, NamedTuple, Sequence, TypeVar

import aiohttp

from environments.core import jsonio
from environments.core.base import ResetResult, StepResult

T = TypeVar("T")

_JSON_HEADERS = {"Content-Type": "application/json"}
_DOWN_COOLDOWN_S = 5.0
# calls per POST /batch (the server takes up to 1024): enough to spread the HTTP cost, few enough
# that the first answers of a burst are not held back long (docs/PERFORMANCE.md)
_BATCH_MAX_CALLS = 32
_BATCH_MAX_BYTES = 256 << 10  # request body bytes per batch (servers refuse > 1 MiB by default)
API_KEY_ENV = "AGENTRL_ENV_API_KEY"  # the servers' --api-key default reads the same variable


class EnvServerError(Exception):
    """The server answered with an error status (4xx/5xx)."""

    def __init__(self, status: int, message: str, retry_after: float | None = None) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message
        self.retry_after = retry_after


class EnvConnectionError(Exception):
    """The server could not be reached, dropped the connection, or did not answer in time."""


class CreateResult(NamedTuple):
    """What ``create`` returns; unpacks as ``env_id, observation, info``."""

    env_id: str
    observation: str
    info: dict[str, Any]


class EnvClient:
    """Async client for one family served by one or more server replicas.

    urls: one base URL (``"http://127.0.0.1:8001"``) or a list of replicas of the same family.
    timeout: seconds allowed for one HTTP call.
    retries: extra attempts for the calls that are safe to repeat.
    backoff: first retry delay in seconds (doubled on each attempt).
    max_connections: pooled keep-alive connections across all replicas.
    api_key: sent as ``Authorization: Bearer <key>`` (servers started with ``--api-key``);
      default: the ``AGENTRL_ENV_API_KEY`` environment variable, else none.
    batch: group the ``create`` / ``step`` / ``close`` calls of one loop iteration into ``POST /batch``:
      None (default) where the replica's ``/health`` asks for it, False never, True always.
    """

    def __init__(
        self,
        urls: Sequence[str] | str,
        *,
        timeout: float = 60.0,
        retries: int = 3,
        backoff: float = 0.2,
        max_connections: int = 256,
        api_key: str | None = None,
        batch: bool | None = None,
        list_actions: int = 0,
        action_text: bool = True,
    ) -> None:
        """``list_actions``: > 0 asks the server, at every create and reset, to end each
        observation with up to this many of the environment's valid actions (families that have
        them; the server's ``list_actions`` field). ``action_text`` False asks for no action list
        in the observation text at all (the server's ``action_text`` field): the actions come in
        ``info`` only, for an agent that shows them its own way (lettered options)."""
        if isinstance(list_actions, bool) or not isinstance(list_actions, int) or list_actions < 0:
            raise ValueError(f"list_actions must be an integer >= 0 (got {list_actions!r})")
        if not isinstance(action_text, bool):
            raise ValueError(f"action_text must be True or False (got {action_text!r})")
        self.list_actions = list_actions
        self.action_text = action_text
        self.urls = [urls.rstrip("/")] if isinstance(urls, str) else [u.rstrip("/") for u in urls]
        if not self.urls:
            raise ValueError("EnvClient needs at least one server URL")
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_connections = max_connections
        api_key = api_key if api_key is not None else os.environ.get(API_KEY_ENV) or None
        self._auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http: aiohttp.ClientSession | None = None
        self._in_flight = [0] * len(self.urls)
        self._live = [0] * len(self.urls)  # sessions this client created and has not closed
        self._down_until = [0.0] * len(self.urls)
        self._round_robin = itertools.count()
        self.batch = batch
        # per replica: None = not known yet (asked with the first create), then True / False
        self._batch_ok: list[bool | None] = [None if batch is None else batch] * len(self.urls)
        self._batch_probe: list[asyncio.Future | None] = [None] * len(self.urls)
        self._queued: list[list[tuple[dict[str, Any], asyncio.Future]]] = [[] for _ in self.urls]
        self._flush_pending = [False] * len(self.urls)
        self._batch_tasks: set[asyncio.Task] = set()
        self.batches_sent = 0  # POST /batch requests sent (tests, benchmarks)

    def config(self) -> dict[str, Any]:
        """Keyword arguments that build an equivalent client (e.g. in another process)."""
        api_key = self._auth.get("Authorization", "")[len("Bearer "):] or None
        return {"urls": list(self.urls), "timeout": self.timeout, "retries": self.retries,
                "backoff": self.backoff, "max_connections": self.max_connections,
                "api_key": api_key, "batch": self.batch, "list_actions": self.list_actions,
                "action_text": self.action_text}

    # -- lifecycle

    async def __aenter__(self) -> EnvClient:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool (the server-side sessions are left alone)."""
        if self._batch_tasks:
            await asyncio.gather(*list(self._batch_tasks), return_exceptions=True)
        if self._http is not None:
            await self._http.close()
            self._http = None

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            connector = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=0)
            timeout = aiohttp.ClientTimeout(total=self.timeout, connect=min(self.timeout, 10.0))
            self._http = aiohttp.ClientSession(connector=connector, timeout=timeout, headers=self._auth)
        return self._http

    # -- env ids and replica choice

    def _encode(self, replica: int, server_id: str) -> str:
        return server_id if len(self.urls) == 1 else f"{replica}:{server_id}"

    def _decode(self, env_id: str) -> tuple[int, str]:
        if len(self.urls) == 1:
            return 0, env_id
        head, sep, server_id = env_id.partition(":")
        if not sep or not head.isdigit() or int(head) >= len(self.urls):
            raise ValueError(f"env id {env_id!r} was not made by this client")
        return int(head), server_id

    def replica_of(self, env_id: str) -> str:
        """The URL of the replica that holds ``env_id``."""
        return self.urls[self._decode(env_id)[0]]

    def _pick_replica(self) -> int:
        now = time.monotonic()
        candidates = [i for i in range(len(self.urls)) if self._down_until[i] <= now] or list(range(len(self.urls)))
        start = next(self._round_robin)
        order = sorted(candidates, key=lambda i: (self._live[i] + self._in_flight[i], (i - start) % len(self.urls)))
        return order[0]

    # -- HTTP

    async def _call(
        self, replica: int, method: str, path: str, payload: dict[str, Any] | None = None, params: dict[str, Any] | None = None
    ) -> Any:
        url = self.urls[replica] + path
        body = None if payload is None else jsonio.dumps(payload)
        self._in_flight[replica] += 1
        try:
            async with self._session().request(
                method, url, data=body, params=params, headers=_JSON_HEADERS if body is not None else None
            ) as response:
                raw = await response.read()
                status = response.status
                retry_after = response.headers.get("Retry-After")
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as error:
            self._down_until[replica] = time.monotonic() + _DOWN_COOLDOWN_S
            raise EnvConnectionError(f"{method} {url} failed: {type(error).__name__}: {error}") from error
        finally:
            self._in_flight[replica] -= 1
        try:
            data = jsonio.loads(raw) if raw else None
        except ValueError:
            data = None
        if status >= 400:
            message = data.get("error") if isinstance(data, dict) else None
            raise EnvServerError(status, str(message or raw[:200].decode(errors="replace")), _seconds(retry_after))
        if not isinstance(data, dict):
            raise EnvServerError(status, f"non-JSON answer from {url}: {raw[:200]!r}")
        return data

    async def _retrying(self, attempt: Callable[[], Awaitable[T]], retry_capacity: bool = False) -> T:
        for n in itertools.count():
            try:
                return await attempt()
            except EnvConnectionError:
                if n >= self.retries:
                    raise
                delay = self.backoff * 2**n
            except EnvServerError as error:
                if not (retry_capacity and error.status == 503) or n >= self.retries:
                    raise
                delay = min(error.retry_after or self.backoff * 2**n, self.backoff * 2**n * 4)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    # -- batching

    async def _learn_batching(self, replica: int) -> None:
        """Ask ``/health`` once whether the replica wants batched calls (False if it cannot
        say)."""
        if self._batch_ok[replica] is not None:
            return
        probe = self._batch_probe[replica]
        if probe is None:
            probe = self._batch_probe[replica] = asyncio.ensure_future(self._call(replica, "GET", "/health"))
        try:
            health = await asyncio.shield(probe)
        except (EnvConnectionError, EnvServerError):
            self._batch_probe[replica] = None  # ask again with the next create
            return
        self._batch_ok[replica] = bool(health.get("batch", False))

    async def _queue(self, replica: int, op: str, payload: dict[str, Any], path: str) -> dict[str, Any]:
        """``payload`` for ``path``, sent alone or in this loop iteration's batch."""
        if not self._batch_ok[replica]:
            return await self._call(replica, "POST", path, payload)
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._queued[replica].append(({"op": op, **payload}, future))
        if not self._flush_pending[replica]:
            self._flush_pending[replica] = True
            asyncio.get_running_loop().call_soon(self._flush, replica)
        self._in_flight[replica] += 1  # replica choice counts queued calls as in flight
        try:
            return await future
        finally:
            self._in_flight[replica] -= 1

    def _flush(self, replica: int) -> None:
        self._flush_pending[replica] = False
        queued, self._queued[replica] = self._queued[replica], []
        chunk: list[tuple[dict[str, Any], asyncio.Future]] = []
        size = 0
        for item in queued:
            encoded = len(item[0].get("action", "")) * 6 + 96  # an upper bound of its JSON bytes
            if chunk and (len(chunk) >= _BATCH_MAX_CALLS or size + encoded > _BATCH_MAX_BYTES):
                self._send(replica, chunk)
                chunk, size = [], 0
            chunk.append(item)
            size += encoded
        if chunk:
            self._send(replica, chunk)

    def _send(self, replica: int, chunk: list[tuple[dict[str, Any], asyncio.Future]]) -> None:
        task = asyncio.ensure_future(self._send_batch(replica, chunk))
        self._batch_tasks.add(task)
        task.add_done_callback(self._batch_tasks.discard)

    async def _send_batch(self, replica: int, chunk: list[tuple[dict[str, Any], asyncio.Future]]) -> None:
        paths = {"create": "/create", "step": "/step", "close": "/close"}
        try:
            if len(chunk) == 1:  # alone: the plain call (no batch envelope)
                call, future = chunk[0]
                payload = {k: v for k, v in call.items() if k != "op"}
                try:
                    result = await self._call(replica, "POST", paths[call["op"]], payload)
                except (EnvConnectionError, EnvServerError) as error:
                    _settle(future, error=error)
                else:
                    _settle(future, result=result)
                return
            try:
                self.batches_sent += 1
                answer = await self._call(replica, "POST", "/batch", {"calls": [call for call, _ in chunk]})
                results = answer.get("results")
                if not isinstance(results, list) or len(results) != len(chunk):
                    raise EnvServerError(200, f"malformed /batch answer from {self.urls[replica]}")
            except EnvServerError as error:
                if error.status in (404, 405):  # an older server without /batch: nothing was applied
                    self._batch_ok[replica] = False
                    await asyncio.gather(*(self._send_batch(replica, [item]) for item in chunk))
                    return
                for _, future in chunk:
                    _settle(future, error=EnvServerError(error.status, error.message, error.retry_after))
                return
            except EnvConnectionError as error:
                for _, future in chunk:
                    _settle(future, error=EnvConnectionError(str(error)))
                return
            for (_, future), entry in zip(chunk, results):
                status = entry.get("status") if isinstance(entry, dict) else None
                body = entry.get("body") if isinstance(entry, dict) else None
                if status == 200 and isinstance(body, dict):
                    _settle(future, result=body)
                else:
                    message = body.get("error") if isinstance(body, dict) else None
                    _settle(future, error=EnvServerError(int(status or 500), str(message or entry), entry.get("retry_after") if isinstance(entry, dict) else None))
        except BaseException as error:  # cancelled or a bug: never leave a caller waiting
            for _, future in chunk:
                _settle(future, error=EnvConnectionError(f"batch to {self.urls[replica]} failed: {error!r}"))
            if not isinstance(error, Exception):
                raise

    # -- protocol

    def _listing_fields(self, payload: dict[str, Any]) -> None:
        """Add the session's action-listing fields to a create / reset body (only those that
        differ from the server's defaults, so an older server sees the same requests)."""
        if self.list_actions:
            payload["list_actions"] = self.list_actions
        if not self.action_text:
            payload["action_text"] = False

    async def create(
        self, task_id: str | None = None, split: str | None = None, index: int | None = None, seed: int | None = None
    ) -> CreateResult:
        """Start an episode on a new instance: give ``task_id``, or ``split`` and ``index``."""
        payload = _task_payload(task_id, split, index, seed)
        self._listing_fields(payload)

        async def attempt() -> CreateResult:
            replica = self._pick_replica()  # _call counts it in flight before its first await
            if self._batch_ok[replica] is None:
                self._in_flight[replica] += 1  # hold the pick while /health is asked
                try:
                    await self._learn_batching(replica)
                finally:
                    self._in_flight[replica] -= 1
            data = await self._queue(replica, "create", payload, "/create")
            self._live[replica] += 1
            return CreateResult(self._encode(replica, data["env_id"]), data["observation"], data.get("info", {}))

        return await self._retrying(attempt, retry_capacity=True)

    async def step(self, env_id: str, action: str) -> StepResult:
        """Apply one action (never retried)."""
        replica, server_id = self._decode(env_id)
        data = await self._queue(replica, "step", {"env_id": server_id, "action": action}, "/step")
        return StepResult(
            observation=data["observation"],
            reward=float(data["reward"]),
            done=bool(data["done"]),
            truncated=bool(data.get("truncated", False)),
            info=data.get("info", {}),
        )

    async def reset(
        self,
        env_id: str,
        task_id: str | None = None,
        split: str | None = None,
        index: int | None = None,
        seed: int | None = None,
    ) -> ResetResult:
        """Start a new episode on the same instance (same task unless another is named)."""
        replica, server_id = self._decode(env_id)
        payload = {"env_id": server_id, **_task_payload(task_id, split, index, seed, needed=False)}
        self._listing_fields(payload)
        data = await self._call(replica, "POST", "/reset", payload)
        return ResetResult(observation=data["observation"], info=data.get("info", {}))

    async def close(self, env_id: str) -> bool:
        """Close an instance; ``False`` if the server did not know it (already closed or reaped)."""
        replica, server_id = self._decode(env_id)
        try:
            await self._queue(replica, "close", {"env_id": server_id}, "/close")
        except EnvServerError as error:
            if error.status != 404:
                raise
            closed = False
        else:
            closed = True
        self._live[replica] = max(0, self._live[replica] - 1)
        return closed

    async def health(self, replica: int = 0) -> dict[str, Any]:
        """``GET /health`` of one replica."""
        return await self._retrying(lambda: self._call(replica, "GET", "/health"))

    async def health_all(self) -> list[dict[str, Any] | None]:
        """``GET /health`` of every replica (``None`` for those that cannot be reached)."""

        async def one(replica: int) -> dict[str, Any] | None:
            try:
                return await self._call(replica, "GET", "/health")
            except (EnvConnectionError, EnvServerError):
                return None

        return list(await asyncio.gather(*(one(i) for i in range(len(self.urls)))))

    async def tasks(self, split: str = "train", replica: int = 0) -> list[str]:
        """All task ids of ``split`` (replicas of one family serve the same catalog)."""
        data = await self._retrying(lambda: self._call(replica, "GET", "/tasks", params={"split": split}))
        return list(data["task_ids"])

    async def stats(self, replica: int = 0) -> dict[str, Any]:
        """``GET /stats`` of one replica."""
        return await self._retrying(lambda: self._call(replica, "GET", "/stats"))


def _task_payload(
    task_id: str | None, split: str | None, index: int | None, seed: int | None, needed: bool = True
) -> dict[str, Any]:
    payload: dict[str, Any] = {}
    if task_id is not None:
        payload["task_id"] = task_id
    if split is not None or index is not None:
        payload["split"], payload["index"] = split, index
    if needed and not payload:
        raise ValueError("give task_id, or split and index")
    if seed is not None:
        payload["seed"] = seed
    return payload


def _settle(future: asyncio.Future, result: Any = None, error: BaseException | None = None) -> None:
    if future.done():  # the caller was cancelled
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
