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
    ) -> None:
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

    # -- lifecycle

    async def __aenter__(self) -> EnvClient:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool (the server-side sessions are left alone)."""
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

    # -- protocol

    async def create(
        self, task_id: str | None = None, split: str | None = None, index: int | None = None, seed: int | None = None
    ) -> CreateResult:
        """Start an episode on a new instance: give ``task_id``, or ``split`` and ``index``."""
        payload = _task_payload(task_id, split, index, seed)

        async def attempt() -> CreateResult:
            replica = self._pick_replica()  # _call counts it in flight before its first await
            data = await self._call(replica, "POST", "/create", payload)
            self._live[replica] += 1
            return CreateResult(self._encode(replica, data["env_id"]), data["observation"], data.get("info", {}))

        return await self._retrying(attempt, retry_capacity=True)

    async def step(self, env_id: str, action: str) -> StepResult:
        """Apply one action (never retried)."""
        replica, server_id = self._decode(env_id)
        data = await self._call(replica, "POST", "/step", {"env_id": server_id, "action": action})
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
        data = await self._call(replica, "POST", "/reset", payload)
        return ResetResult(observation=data["observation"], info=data.get("info", {}))

    async def close(self, env_id: str) -> bool:
        """Close an instance; ``False`` if the server did not know it (already closed or reaped)."""
        replica, server_id = self._decode(env_id)
        try:
            await self._call(replica, "POST", "/close", {"env_id": server_id})
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


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
