"""Rollout backend over one or several SGLang-API servers (real SGLang, or our own server).

* Routing: a request of a known ``session_id`` goes to the server that served the session
  before (sticky, so that server's prefix / radix cache hits); a new session to the healthy
  server with the fewest sessions pinned (then the fewest requests in flight), so no server
  holds more sessions than its cache has rows while another has room; a request without a
  session to the healthy server with the fewest requests in flight.
* Robustness: connection errors, 502/503/504 answers and timeouts are retried with exponential
  backoff (honouring ``Retry-After``), on another server when the first one is marked down;
  a request whose connection the server dropped is first sent again at once (a stale keep-alive
  connection); a 4xx answer raises ``InvalidRequestError`` at once.
* Weight sync from the JAX learner: SGLang (PyTorch) can only receive JAX weights through disk,
  so ``update_weights(model)`` exports a HF safetensors directory
  (``agentrl_jax.models.safetensors_io.save_hf_directory``) that every server can read (a shared
  filesystem when they run elsewhere), then calls ``POST /update_weights_from_disk`` and
  ``/flush_cache`` on each server.
* Authentication: ``api_key`` (default: the ``AGENTRL_ROLLOUT_API_KEY`` environment variable,
  which our server's ``--api-key`` also reads) is sent as ``Authorization: Bearer <key>`` on every
  request (generation, weight updates, cache flushes, aborts, health), as SGLang's ``--api-key``
  expects.
* ``launch_sglang_server`` starts ``python -m sglang.launch_server`` when SGLang is installed.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import os
import random
import subprocess
import time
import uuid
from typing import Any

import aiohttp

from agentrl_jax.rollout.contract import (BackendBuild, BackendUnavailableError,
                                               BatchedSamplesBackend, GenerateResult,
                                               InvalidRequestError, OverloadedError, RolloutError,
                                               SamplingParams)
from agentrl_jax.rollout.backends.disk_sync import DiskWeightSync
from agentrl_jax.rollout.servers.sglang_launch import launch_sglang_server

log = logging.getLogger(__name__)

_RETRY_STATUS = (502, 503, 504)
API_KEY_ENV = "AGENTRL_ROLLOUT_API_KEY"  # also the default of our server's --api-key


@dataclasses.dataclass
class _Server:
    url: str
    inflight: int = 0
    healthy: bool = True
    failures: int = 0
    down_until: float = 0.0
    served: int = 0


class SGLangBackend(DiskWeightSync, BatchedSamplesBackend):
    """Client of SGLang ``/generate`` servers (registry name ``sglang``).

    urls: base URLs (``http://host:port``). timeout: seconds per request (generation included).
    max_retries: attempts after the first on connection errors / 5xx overload. export_dir: where
    ``update_weights(params)`` writes the safetensors export (default: a temporary directory);
    it must be readable by every server. send_session_id: also send ``session_id`` in the body
    (our server uses it for its prefix cache; SGLang ignores unknown fields). api_key: sent as
    ``Authorization: Bearer <key>`` on every request (servers started with ``--api-key``);
    default: the ``AGENTRL_ROLLOUT_API_KEY`` environment variable, else none.
    max_connections: requests in flight at once over all servers (0: no limit; every
    concurrent episode's request reaches a server's scheduler at once). close_sessions:
    ``end_session`` also posts ``/close_session`` to the session's server (our rollout
    server frees the episode's cached prefix; SGLang's own sessions API means something else,
    so off by default; ``EngineServers`` turns it on). takes_option_count: the servers apply
    ``SamplingParams.option_count`` (per-turn option limits: our rollout servers do; SGLang
    has no such parameter, so off by default and a request with one is refused;
    ``EngineServers`` turns it on).
    """

    external_servers = True  # shared by every process; they outlive the trainer

    name = "sglang"

    def __init__(self, urls: str | list[str], *, timeout: float = 3600.0,
                 connect_timeout: float = 10.0, max_retries: int = 5, backoff_s: float = 0.5,
                 max_backoff_s: float = 16.0, export_dir: str | None = None,
                 export_dtype: str | None = "bfloat16", tokenizer: Any = None,
                 send_session_id: bool = True, max_sessions: int = 100_000,
                 down_time_s: float = 5.0, launched: list[subprocess.Popen] | None = None,
                 api_key: str | None = None, max_connections: int = 0,
                 close_sessions: bool = False, takes_option_count: bool = False):
        if isinstance(urls, str):
            urls = [u for u in urls.split(",") if u]
        if not urls:
            raise ValueError("SGLangBackend needs at least one server URL")
        self.servers = [_Server(u.rstrip("/")) for u in urls]
        self.timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=connect_timeout)
        self.max_retries = max_retries
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.export_dir = export_dir
        self.export_dtype = export_dtype
        self.tokenizer = tokenizer
        self.send_session_id = send_session_id
        self.max_sessions = max_sessions
        self.down_time_s = down_time_s
        if max_connections < 0:
            raise ValueError(f"max_connections must be >= 0 (0: no limit), got {max_connections}")
        self.max_connections = max_connections
        self.close_sessions = close_sessions
        self.takes_option_count = takes_option_count
        self._closing: set[asyncio.Task] = set()
        api_key = api_key if api_key is not None else os.environ.get(API_KEY_ENV) or None
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client_kwargs = dict(
            urls=[s.url for s in self.servers], timeout=timeout, connect_timeout=connect_timeout,
            max_retries=max_retries, backoff_s=backoff_s, max_backoff_s=max_backoff_s,
            send_session_id=send_session_id, max_sessions=max_sessions, down_time_s=down_time_s,
            api_key=api_key or "", max_connections=max_connections,
            close_sessions=close_sessions, takes_option_count=takes_option_count)
        self.weight_version: str | None = None
        self._sticky: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._pinned = [0] * len(self.servers)  # sessions in _sticky per server
        self._placed = [0] * len(self.servers)  # sessions ever pinned to each server
        self._session: aiohttp.ClientSession | None = None
        self._session_loop: asyncio.AbstractEventLoop | None = None
        self._launched = list(launched or [])
        self._rr = 0

    @classmethod
    def from_config(cls, urls: str | list[str] | None = None, launch: dict[str, Any] | None = None,
                    **kwargs: Any) -> "SGLangBackend":
        """Registry factory. ``launch={"model_path": ..., "port": ..., ...}`` starts an SGLang
        server first (``launch_sglang_server``)."""
        launched = []
        if launch:
            proc, url = launch_sglang_server(**launch)
            launched.append(proc)
            urls = list(urls or []) + [url] if not isinstance(urls, str) else [urls, url]
        if not urls:
            raise ValueError("sglang backend needs 'urls' (or 'launch')")
        return cls(urls, launched=launched, **kwargs)

    @classmethod
    def from_run(cls, build: BackendBuild) -> "SGLangBackend":
        """A client of the run's servers (``rollout.urls``; ``rollout.api_key`` or
        ``$AGENTRL_ROLLOUT_API_KEY`` for servers started with ``--api-key``)."""
        if not build.urls:
            raise ValueError("rollout.backend='sglang' needs rollout.urls (comma-separated)")
        return cls.from_config(urls=list(build.urls), api_key=build.api_key)

    def client_spec(self) -> dict[str, Any]:
        """Keyword arguments for an ``SGLangBackend`` that reaches the same servers the same
        way (no weight export, no launched servers): actor worker processes build one each and
        send their episodes' requests straight to the servers (agentrl_jax/agent/workers.py)."""
        return dict(self._client_kwargs)

    # ------------------------------------------------------------------------- plumbing
    def _http(self) -> aiohttp.ClientSession:
        """The HTTP session of the running event loop (a new one when the backend is used
        from another loop, e.g. successive ``asyncio.run`` calls)."""
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._session_loop is not loop:
            # aiohttp's default connector allows 100 connections in all: 256 concurrent
            # episodes would reach the servers 100 at a time (half-empty decode batches)
            connector = aiohttp.TCPConnector(limit=self.max_connections)
            self._session = aiohttp.ClientSession(timeout=self.timeout, headers=self._headers,
                                                  connector=connector)
            self._session_loop = loop
        return self._session

    def _pick(self, session_id: str | None, exclude: set[int]) -> int:
        now = time.monotonic()
        if session_id is not None and session_id in self._sticky:
            i = self._sticky[session_id]
            s = self.servers[i]
            if i not in exclude and (s.healthy or now >= s.down_until):
                self._sticky.move_to_end(session_id)
                return i
        candidates = [i for i, s in enumerate(self.servers)
                      if i not in exclude and (s.healthy or now >= s.down_until)]
        if not candidates:
            candidates = [i for i in range(len(self.servers)) if i not in exclude] or \
                list(range(len(self.servers)))
        # a new session goes where the fewest sessions are pinned (each server caches one KV
        # prefix per session: more sessions than slots evict each other's prefixes), then to
        # the fewest requests in flight; a request without a session by load alone
        def load(i: int) -> tuple[int, int]:
            pinned = self._pinned[i] if session_id is not None else 0
            return pinned, self.servers[i].inflight

        least = min(load(i) for i in candidates)
        ties = [i for i in candidates if load(i) == least]
        self._rr += 1
        choice = ties[self._rr % len(ties)]
        if session_id is not None:
            self._pin(session_id, choice)
        return choice

    def _pin(self, session_id: str, server: int) -> None:
        """Pin ``session_id`` to ``server`` (the least recently used pin beyond
        ``max_sessions`` is forgotten)."""
        self._unpin(session_id)
        self._sticky[session_id] = server
        self._pinned[server] += 1
        self._placed[server] += 1
        while len(self._sticky) > self.max_sessions:
            _, old = self._sticky.popitem(last=False)
            self._pinned[old] -= 1

    def _unpin(self, session_id: str) -> None:
        server = self._sticky.pop(session_id, None)
        if server is not None:
            self._pinned[server] -= 1

    def end_session(self, session_id: str) -> None:
        """Forget a finished session's pin; with ``close_sessions`` also tell its server (in
        the background, errors ignored) that the cached prefix may go."""
        server = self._sticky.get(session_id)
        self._unpin(session_id)
        if self.close_sessions and server is not None:
            try:
                task = asyncio.get_running_loop().create_task(self._close_session(server,
                                                                                   session_id))
            except RuntimeError:  # no running loop: the prefix ages out by LRU instead
                return
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def _close_session(self, server: int, session_id: str) -> None:
        try:
            await self._post_one(server, "/close_session", {"session_id": session_id})
        except Exception as error:  # noqa: BLE001 -- only a cache hint
            log.debug("close_session %s on %s: %r", session_id, self.servers[server].url, error)

    def pinned_sessions(self) -> list[int]:
        """Live sessions pinned to each server (not ended, seen in the last ``max_sessions``)."""
        return list(self._pinned)

    def sessions_placed(self) -> list[int]:
        """Sessions pinned to each server since the start (a failed-over one counts again)."""
        return list(self._placed)

    def _mark_down(self, i: int) -> None:
        s = self.servers[i]
        s.healthy = False
        s.failures += 1
        s.down_until = time.monotonic() + self.down_time_s

    def _mark_up(self, i: int) -> None:
        s = self.servers[i]
        s.healthy, s.failures = True, 0

    async def _post(self, path: str, body: dict[str, Any], session_id: str | None = None,
                    server: int | None = None) -> tuple[int, Any]:
        """POST with retries; returns ``(server index, decoded JSON)``."""
        delay = self.backoff_s
        tried: set[int] = set()
        last_error: str = "no attempt made"
        stale_retry = True  # one immediate retry after a dropped keep-alive connection
        attempt = 0
        while True:
            i = server if server is not None else self._pick(
                session_id, tried if len(tried) < len(self.servers) else set())
            s = self.servers[i]
            s.inflight += 1
            retry_after = None
            try:
                async with self._http().post(s.url + path, json=body) as resp:
                    if resp.status in _RETRY_STATUS:
                        retry_after = resp.headers.get("Retry-After")
                        last_error = f"{s.url}{path}: HTTP {resp.status} {await resp.text()}"
                        if resp.status != 503:
                            self._mark_down(i)
                    elif resp.status >= 400:
                        text = await resp.text()
                        raise InvalidRequestError(f"{s.url}{path}: HTTP {resp.status}: "
                                                  f"{_error_message(text)}")
                    else:
                        data = await resp.json(content_type=None)
                        self._mark_up(i)
                        s.served += 1
                        return i, data
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError,
                    asyncio.TimeoutError) as e:
                last_error = f"{s.url}{path}: {type(e).__name__}: {e}"
                if isinstance(e, aiohttp.ServerDisconnectedError) and stale_retry:
                    # most often a pooled connection the server closed while it sat idle
                    # (uvicorn, which SGLang runs on, drops idle ones after 5 s; aiohttp keeps
                    # them 15 s): send it again at once on a new connection, the server not
                    # marked down; a second drop is handled as any connection error
                    stale_retry = False
                    continue
                self._mark_down(i)
                tried.add(i)
                if session_id is not None:
                    self._unpin(session_id)
            finally:
                s.inflight -= 1
            if attempt == self.max_retries:
                break
            attempt += 1
            wait = delay
            if retry_after is not None:
                try:
                    wait = max(wait, float(retry_after))
                except ValueError:
                    pass
            log.warning("retrying %s after %.1fs (%s)", path, wait, last_error)
            await asyncio.sleep(min(wait, self.max_backoff_s) * (0.8 + 0.4 * random.random()))
            delay = min(delay * 2, self.max_backoff_s)
        if "HTTP 503" in last_error:
            raise OverloadedError(f"every attempt was refused: {last_error}")
        raise BackendUnavailableError(f"request failed after {self.max_retries + 1} attempts: "
                                      f"{last_error}")

    async def _get(self, i: int, path: str) -> tuple[int, str]:
        async with self._http().get(self.servers[i].url + path) as resp:
            return resp.status, await resp.text()

    # --------------------------------------------------------------------------- API
    def _payload(self, input_ids: list[int], sampling: SamplingParams, rid: str,
                 session_id: str | None) -> dict[str, Any]:
        body: dict[str, Any] = {"input_ids": list(map(int, input_ids)),
                                "sampling_params": sampling.to_sglang(),
                                "return_logprob": True, "rid": rid}
        if session_id is not None and self.send_session_id:
            body["session_id"] = session_id
        return body

    async def generate_n(self, input_ids: list[int], sampling: SamplingParams | None = None,
                         session_id: str | None = None, rid: str | None = None
                         ) -> list[GenerateResult]:
        sampling = sampling or SamplingParams()
        sampling.validate()
        if sampling.option_count is not None and not self.takes_option_count:
            raise InvalidRequestError(
                "sampling_params: option_count (a per-turn option limit) is ours only: SGLang "
                "has no such parameter; use the embedded or engine_servers backend")
        if not input_ids:
            raise InvalidRequestError("input_ids must be a non-empty list of integers")
        rid = rid or uuid.uuid4().hex
        t0 = time.perf_counter()
        _, data = await self._post("/generate", self._payload(input_ids, sampling, rid,
                                                              session_id), session_id)
        items = data if isinstance(data, list) else [data]
        if len(items) != sampling.n:
            raise RolloutError(f"server returned {len(items)} samples, expected {sampling.n}")
        return [self._parse(item, rid, time.perf_counter() - t0) for item in items]

    @staticmethod
    def _parse(item: dict[str, Any], rid: str, latency: float) -> GenerateResult:
        meta = item.get("meta_info", {})
        finish = meta.get("finish_reason") or {}
        ftype = finish.get("type", "abort") if isinstance(finish, dict) else str(finish)
        output_ids = item.get("output_ids")
        lps = meta.get("output_token_logprobs") or []
        if output_ids is None:  # older servers: the ids only inside the logprob triples
            output_ids = [int(t[1]) for t in lps]
        logprobs = [float(t[0]) if t[0] is not None else float("nan") for t in lps]
        if len(logprobs) != len(output_ids):
            raise RolloutError(f"server returned {len(output_ids)} output ids but "
                               f"{len(logprobs)} logprobs")
        raw = meta.get("output_token_logprobs_raw")
        return GenerateResult(
            output_ids=list(map(int, output_ids)), output_logprobs=logprobs,
            finish_reason=ftype if ftype in ("stop", "length", "abort") else "abort",
            matched_stop=finish.get("matched") if isinstance(finish, dict) else None,
            prompt_tokens=int(meta.get("prompt_tokens", 0)),
            cached_tokens=int(meta.get("cached_tokens", 0)),
            output_logprobs_raw=list(raw) if raw is not None else None, text=item.get("text"),
            rid=meta.get("id", rid), weight_version=meta.get("weight_version"),
            latency_s=latency)

    async def abort(self, rid: str) -> None:
        await asyncio.gather(*[self._post_one(i, "/abort_request", {"rid": rid})
                               for i in range(len(self.servers))], return_exceptions=True)

    async def _post_one(self, i: int, path: str, body: dict[str, Any]) -> Any:
        async with self._http().post(self.servers[i].url + path, json=body) as resp:
            text = await resp.text()
            if resp.status >= 400:
                raise RolloutError(f"{self.servers[i].url}{path}: HTTP {resp.status}: "
                                   f"{_error_message(text)}")
            try:
                import json
                return json.loads(text)
            except ValueError:
                return text

    async def flush_cache(self) -> None:
        await asyncio.gather(*[self._post_one(i, "/flush_cache", {})
                               for i in range(len(self.servers))])
        self._forget_sessions()

    def _forget_sessions(self) -> None:
        """The servers' cached prefixes are gone: drop every session's routing pin."""
        self._sticky.clear()
        self._pinned = [0] * len(self.servers)

    async def release_kv_cache(self) -> int:
        """``POST /release_memory_occupation {"tags": ["kv_cache"]}`` on every server (a real
        SGLang server frees memory only when started with ``--enable-memory-saver``); cached
        prefixes go, so do the pins. Returns the bytes the servers report freed (SGLang
        reports none: 0)."""
        freed = await self._kv_cache_call("/release_memory_occupation")
        self._forget_sessions()
        return freed

    async def resume_kv_cache(self) -> int:
        """``POST /resume_memory_occupation {"tags": ["kv_cache"]}`` on every server."""
        return await self._kv_cache_call("/resume_memory_occupation")

    async def _kv_cache_call(self, path: str) -> int:
        """``path`` with tags ``["kv_cache"]`` on every server; the bytes they report, summed."""
        out = await asyncio.gather(*[self._post_one(i, path, {"tags": ["kv_cache"]})
                                     for i in range(len(self.servers))])
        return sum(int(o.get("bytes", 0)) if isinstance(o, dict) else 0 for o in out)

    async def health(self) -> bool:
        """True if at least one server answers ``/health`` with 200 (updates the marks)."""
        async def check(i: int) -> bool:
            try:
                status, _ = await self._get(i, "/health")
            except (aiohttp.ClientError, asyncio.TimeoutError):
                status = 0
            (self._mark_up if status == 200 else self._mark_down)(i)
            return status == 200

        return any(await asyncio.gather(*[check(i) for i in range(len(self.servers))]))

    async def wait_healthy(self, timeout: float = 600.0, interval: float = 1.0) -> None:
        deadline = time.monotonic() + timeout
        while not await self.health():
            if time.monotonic() > deadline:
                raise BackendUnavailableError(f"no server became healthy within {timeout}s: "
                                              f"{[s.url for s in self.servers]}")
            await asyncio.sleep(interval)

    def load(self) -> list[dict[str, Any]]:
        return [dataclasses.asdict(s) for s in self.servers]

    async def close_http(self) -> None:
        """Close this event loop's HTTP session (call it before the loop ends when the backend
        will be used from another loop; the next request opens a new session)."""
        if (self._session is not None and not self._session.closed
                and self._session_loop is asyncio.get_running_loop()):
            await self._session.close()
        self._session = None

    async def aclose(self) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.gather(*[t for t in self._closing if t.get_loop() is loop],
                             return_exceptions=True)  # the last sessions' close requests
        await self.close_http()
        for proc in self._launched:
            if proc.poll() is None:
                proc.terminate()
                try:
                    await asyncio.to_thread(proc.wait, 30)
                except subprocess.TimeoutExpired:
                    proc.kill()
        self._launched = []


def _error_message(text: str) -> str:
    try:
        import json
        data = json.loads(text)
        if isinstance(data, dict):
            err = data.get("error")
            if isinstance(err, dict) and "message" in err:
                return str(err["message"])
            if "message" in data:
                return str(data["message"])
    except ValueError:
        pass
    return text[:500]


__all__ = ["SGLangBackend"]
