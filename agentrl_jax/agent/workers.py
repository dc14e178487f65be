"""Episodes in worker processes: the actor pool's host work spread over CPU cores.

One Python process's host work per agent turn (chat formatting, tokenising, environment HTTP,
bookkeeping) caps its turn rate below what several GPUs' engines consume (docs/PERFORMANCE.md,
"Actor workers"), which starves them. With
``ActorPool(workers=N)`` the episodes of a ``collect`` run in ``N`` spawned processes; the
rollout backend (the embedded engine, weights in memory) stays in this process. A worker plays
its episodes exactly as ``ActorPool`` does in-process (the same ``Episode`` code, its own
``ChatFormatter`` and ``EnvClient``s) and sends each generation request here over a Unix socket:

* worker -> here: ``("gen", request, job, session, start, new_ids, sampling)``: the episode's token
  ids are ``ids[:start] + new_ids`` (``start``: the length of the common prefix with its
  previous request, so only the new ids travel; this side keeps each session's ids; with a
  history window a prompt is not always an extension of the previous one);
  ``("done", index, trajectory)`` when an episode ends.
* here -> worker: ``("run", [(index, task, group, sample), ...], horizon, policy_version,
  seed, version)``; ``("res", request, result, version)`` / ``("err", request, message)``;
  ``("ver", job, version)``.

``version`` is ``version_fn()`` read here right before ``backend.generate`` (what the in-process
episode reads right before its call), so ``turn_versions`` mean the same.

**Direct mode.** When the backend is an HTTP client of rollout servers (``SGLangBackend``,
``EngineServers``: it has ``client_spec()``), relaying every request through this process would
make it the bottleneck (one event loop doing every turn's HTTP request kept the servers' decode
batches less than half full: docs/PERFORMANCE.md, "Actor workers"). Each worker
then builds its own client from ``client_spec()`` and posts to the servers itself (sticky
sessions per worker; its sessions end in its own client). Turn versions: the ``run`` message
carries ``version_fn()`` as read when the job starts, and while the job runs this side reads
``version_fn()`` every ``VERSION_POLL_S`` and sends each change as ``("ver", job, version)``; a
worker stamps a turn with the version it knows right before its request (in relay mode the
version is read here when the request arrives: both up to a message hop from the exact
moment).

Trajectories are the in-process ones, field for field (tests/test_actor_fast_path.py; in direct
mode too, turn versions aside). Starting the processes takes seconds (each imports the episode
code and the tokenizer); ``WorkerGroup.spawn()`` starts them ahead, before the setup is known
(the trainer does it beside the model load): they wait for the group's socket, which the first
``collect`` opens, and then read the setup. Without ``spawn()`` the first ``collect`` starts
them. They live until ``close()`` or this process ends.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import multiprocessing
import os
import pickle
import struct
import tempfile
from array import array
from typing import Any, Callable

from agentrl_jax.rollout.contract import GenerateResult, RolloutError

_HEADER = struct.Struct("!I")
VERSION_POLL_S = 0.005  # direct mode: how often version_fn is read while a job runs


def worker_shares(count: int, workers: int) -> list[range]:
    """Which of ``count`` episodes each of ``workers`` workers plays: contiguous runs of sizes
    that differ by at most one, ``range(w * count // workers, (w + 1) * count // workers)``.
    A collect lists a group's samples next to each other, so a group's episodes start in one
    worker and their first requests, which share one prompt, reach the engine together (dealt
    round-robin, a group's samples came from every worker at different moments and fewer of
    them shared the prefill: docs/PERFORMANCE.md, "The 20-turn rollout on the fixed tree")."""
    return [range(w * count // workers, (w + 1) * count // workers) for w in range(workers)]


async def _read(reader: asyncio.StreamReader) -> Any:
    size = _HEADER.unpack(await reader.readexactly(_HEADER.size))[0]
    return pickle.loads(await reader.readexactly(size))


def _common_prefix(a: list[int], b: list[int]) -> int:
    """The length of the longest common prefix of ``a`` and ``b``."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # the usual case: ``b`` extends ``a``
        return n
    i = 0
    while a[i] == b[i]:
        i += 1
    return i


def _write(writer: asyncio.StreamWriter, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    writer.write(_HEADER.pack(len(data)) + data)


@dataclasses.dataclass
class WorkerSetup:
    """What a worker needs to build its own pool (pickled once at start)."""

    tokenizer: Any
    eos_token_ids: tuple[int, ...]
    fast_format: bool
    env_clients: dict[str, dict[str, Any]]  # name -> EnvClient keyword arguments
    sampling: Any
    max_context: int
    max_concurrency: int
    parser: Callable
    prompt_style: str
    response_prefix: str
    history_turns: int  # agent.history_turns (episode.py, "History window")
    history_stride: int  # agent.history_stride (the same)
    option_limits: bool  # agent.option_limits (episode.py: per-turn option limits)
    shuffle_options: bool  # agent.shuffle_options (episode.py: options in a seeded order)
    direct: dict[str, Any] | None = None  # SGLangBackend kwargs: post to the servers directly


class _RemoteBackend:
    """The worker's backend: forwards ``generate`` to the parent process."""

    def __init__(self, writer: asyncio.StreamWriter):
        self.writer = writer
        self.pending: dict[int, asyncio.Future] = {}
        self.sent: dict[str, list[int]] = {}  # session -> the ids the parent holds for it
        self.versions: dict[str, list[int]] = {}  # session -> version of each answered turn
        self.jobs: dict[str, int] = {}  # session -> the parent's job (its version_fn)
        self._next = 0

    async def generate(self, input_ids, sampling=None, session_id=None, rid=None):
        ids = list(input_ids)
        start = _common_prefix(self.sent.get(session_id, []), ids)
        request = self._next
        self._next += 1
        future = asyncio.get_running_loop().create_future()
        self.pending[request] = future
        _write(self.writer, ("gen", request, self.jobs.get(session_id, -1), session_id, start,
                             ids[start:], sampling))
        self.sent[session_id] = ids
        result, version = await future
        if result.finish_reason != "abort":
            self.versions.setdefault(session_id, []).append(version)
        return result

    def forget(self, session: str) -> list[int]:
        """An ended episode's turn versions; its bookkeeping is dropped."""
        self.sent.pop(session, None)
        self.jobs.pop(session, None)
        return self.versions.pop(session, [])


class _DirectBackend:
    """The worker's backend in direct mode: its own HTTP client of the rollout servers."""

    def __init__(self, client: Any):
        self.client = client
        self.versions: dict[str, list[int]] = {}
        self.jobs: dict[str, int] = {}
        self.job_versions: dict[int, int] = {}  # job -> the version served now (from "ver")

    async def generate(self, input_ids, sampling=None, session_id=None, rid=None):
        version = self.job_versions.get(self.jobs.get(session_id, -1), -1)
        result = await self.client.generate(input_ids, sampling, session_id=session_id, rid=rid)
        if result.finish_reason != "abort":
            self.versions.setdefault(session_id, []).append(version)
        return result

    def end_session(self, session_id: str) -> None:
        self.client.end_session(session_id)

    def forget(self, session: str) -> list[int]:
        self.jobs.pop(session, None)
        return self.versions.pop(session, [])


CONNECT_POLL_S = 0.02  # a worker spawned ahead: how often it looks for the group's socket


async def _connect(path: str, parent: int | None) -> tuple[asyncio.StreamReader,
                                                            asyncio.StreamWriter] | None:
    """The group's socket at ``path``, once it listens; ``None`` when the parent process
    (pid ``parent``) is gone first (this process then has a new parent)."""
    while True:
        try:
            return await asyncio.open_unix_connection(path)
        except (FileNotFoundError, ConnectionRefusedError):
            if parent is not None and os.getppid() != parent:
                return None
            await asyncio.sleep(CONNECT_POLL_S)


def _import_tokenizer_modules() -> None:
    """Import what unpickling the setup's tokenizer (a ``transformers`` fast tokenizer:
    ``models/tokenizer.py``) imports: ``transformers`` takes seconds to import, which a worker
    spawned ahead spends while it waits for the socket instead of in the first collect."""
    from transformers import PreTrainedTokenizerFast  # noqa: F401  (its module with it)


async def _worker(path: str, parent: int | None = None) -> None:
    from agentrl_jax.agent.chat import ChatFormatter
    from agentrl_jax.agent.episode import start_episode
    from environments.core.client import (EnvClient, EnvConnectionError, EnvServerError)

    _import_tokenizer_modules()
    connection = await _connect(path, parent)
    if connection is None:
        return
    reader, writer = connection
    setup: WorkerSetup = await _read(reader)
    if setup.direct is not None:
        from agentrl_jax.rollout.backends.sglang import SGLangBackend
        backend: Any = _DirectBackend(SGLangBackend(**setup.direct))
    else:
        backend = _RemoteBackend(writer)
    clients = {name: EnvClient(**kw) for name, kw in setup.env_clients.items()}
    formatter = ChatFormatter(setup.tokenizer, setup.eos_token_ids or None,
                              fast=setup.fast_format)
    # the actor pool's default: what ends an episode as an environment error
    env_errors = (EnvConnectionError, EnvServerError, OSError, asyncio.TimeoutError)
    jobs: set[asyncio.Task] = set()

    async def run(specs, horizon: int, policy_version: int, seed: int | None) -> None:
        """Play one job's episodes (its start version was recorded on receipt)."""
        gate = asyncio.Semaphore(setup.max_concurrency)
        job = specs[0][0] >> 32

        async def one(index, task, group, sample) -> None:
            episode = start_episode(task, group, sample, horizon, policy_version, seed,
                                    env_clients=clients, backend=backend, formatter=formatter,
                                    parser=setup.parser, sampling=setup.sampling,
                                    max_context=setup.max_context, env_errors=env_errors,
                                    prompt_style=setup.prompt_style,
                                    response_prefix=setup.response_prefix,
                                    history_turns=setup.history_turns,
                                    history_stride=setup.history_stride,
                                    option_limits=setup.option_limits,
                                    shuffle_options=setup.shuffle_options)
            session = episode.session_id
            backend.jobs[session] = index >> 32
            try:
                async with gate:
                    await episode.run()
            finally:
                traj = episode.trajectory
                traj.turn_versions = backend.forget(session)[:traj.num_turns]
            _write(writer, ("done", index, traj))

        try:
            await asyncio.gather(*(one(*s) for s in specs))
        finally:
            if isinstance(backend, _DirectBackend):
                backend.job_versions.pop(job, None)

    try:
        while True:
            message = await _read(reader)
            kind = message[0]
            if kind == "res":
                future = backend.pending.pop(message[1], None)
                if future is not None and not future.done():
                    future.set_result((message[2], message[3]))
            elif kind == "err":
                future = backend.pending.pop(message[1], None)
                if future is not None and not future.done():
                    future.set_exception(RolloutError(message[2]))
            elif kind == "run":
                if isinstance(backend, _DirectBackend):  # before any "ver" of this job
                    backend.job_versions[message[1][0][0] >> 32] = message[-1]
                task = asyncio.ensure_future(run(*message[1:5]))
                jobs.add(task)
                task.add_done_callback(jobs.discard)
            elif kind == "ver" and isinstance(backend, _DirectBackend):
                if message[1] in backend.job_versions:  # not a job that has finished here
                    backend.job_versions[message[1]] = message[2]
            elif kind == "stop":
                break
    except (asyncio.IncompleteReadError, ConnectionError):
        pass  # the parent is gone
    finally:
        for task in jobs:
            task.cancel()
        for client in clients.values():
            await client.aclose()
        if isinstance(backend, _DirectBackend):
            await backend.client.aclose()


def worker_main(path: str, parent: int | None = None) -> None:
    """Entry point of a spawned worker process: it serves the group whose socket is (or will
    be) at ``path``; ``parent``: the spawning process's pid (it gives up waiting for the socket
    when that process is gone)."""
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    asyncio.run(_worker(path, parent))


class WorkerGroup:
    """``n`` worker processes and the parent side of their protocol (one per ``ActorPool``).
    ``setup`` may be given after construction (before the first ``collect``), so that the
    processes can be spawned before what they need is known (``spawn``)."""

    def __init__(self, n: int, setup: WorkerSetup | None = None):
        if n < 1:
            raise ValueError("workers must be >= 1")
        self.n, self.setup = n, setup
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._processes: list[Any] = []
        self._dir: tempfile.TemporaryDirectory | None = None
        self._path: str | None = None  # the socket the processes connect to
        self._ids: dict[str, Any] = {}  # session -> its ids (a list, or array("i"))
        self._jobs: dict[int, tuple[list, asyncio.Future, int, Callable | None,
                                    Callable | None]] = {}
        self._next_job = 0
        self._tasks: set[asyncio.Task] = set()
        self._serving: set[asyncio.Task] = set()
        self.backend: Any = None
        self._id_arrays = False  # the backend takes id arrays (set with it in collect)

    def spawn(self) -> None:
        """Start the ``n`` processes now (if they are not running): they import what they need
        and wait for the socket the first ``collect`` opens. Without it ``collect`` spawns
        them and waits for their start-up."""
        if self._processes:
            return
        self._dir = tempfile.TemporaryDirectory(prefix="agentrl-actors-")
        self._path = os.path.join(self._dir.name, "sock")
        ctx = multiprocessing.get_context("spawn")
        for _ in range(self.n):
            process = ctx.Process(target=worker_main, args=(self._path, os.getpid()),
                                  daemon=True)
            process.start()
            self._processes.append(process)

    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is loop and self._writers:
            return
        if self.setup is None:
            raise RuntimeError("WorkerGroup: no setup given before the first collect")
        if self._server is not None:  # serving another event loop: start afresh
            self.close()
        self._loop = loop
        self.spawn()  # nothing to do when spawned ahead
        path = self._path
        connected: asyncio.Queue = asyncio.Queue()

        async def accept(reader, writer) -> None:
            self._serving.add(asyncio.current_task())
            _write(writer, self.setup)
            await connected.put(writer)
            await self._serve(reader, writer)

        # started in an empty context: the parent's generations for the workers are no task of
        # the round that happened to start the group (its context variables, e.g. the progress
        # bar's turn count, are not inherited)
        self._server = await contextvars.Context().run(
            asyncio.ensure_future, asyncio.start_unix_server(accept, path=path))
        for _ in range(self.n):
            self._writers.append(await asyncio.wait_for(connected.get(), timeout=300))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                message = await _read(reader)
                if message[0] == "gen":
                    task = asyncio.ensure_future(self._generate(writer, *message[1:]))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                elif message[0] == "done":
                    self._finish(message[1], message[2])
        except asyncio.CancelledError:
            return
        except (asyncio.IncompleteReadError, ConnectionError) as error:
            for _, future, *_ in self._jobs.values():
                if not future.done():
                    future.set_exception(RolloutError(f"an actor worker died: {error!r}"))

    async def _generate(self, writer, request: int, job: int, session: str, start: int,
                        new_ids: list[int], sampling: Any) -> None:
        # a backend that takes id arrays gets this side's array itself (it keeps nothing of
        # it past the call: RolloutBackend.takes_id_arrays), so only the new ids are converted
        arrays = self._id_arrays
        ids = self._ids.setdefault(session, array("i") if arrays else [])
        del ids[start:]
        ids.extend(new_ids)
        try:
            _, _, policy_version, _, version_fn = self._jobs[job]
            version = version_fn() if version_fn is not None else policy_version
            result: GenerateResult = await self.backend.generate(
                ids if arrays else list(ids), sampling, session_id=session)
        except Exception as error:  # noqa: BLE001 -- the episode turns it into engine_error
            _write(writer, ("err", request, f"{type(error).__name__}: {error}"))
            return
        _write(writer, ("res", request, result, version))

    def _finish(self, index: int, trajectory: Any) -> None:
        job = self._jobs.get(index >> 32)
        if job is None:
            return
        slots, future, _, progress, _ = job
        slots[index & 0xFFFFFFFF] = trajectory
        self._ids.pop(trajectory.episode_id, None)
        end_session = getattr(self.backend, "end_session", None)
        if end_session is not None:
            end_session(trajectory.episode_id)
        if progress is not None:
            progress(trajectory)
        if all(t is not None for t in slots) and not future.done():
            future.set_result(slots)

    async def collect(self, backend: Any, specs: list[tuple], horizon: int,
                      policy_version: int, seed: int | None,
                      progress: Callable | None, version_fn: Callable | None) -> list:
        """Run episodes ``specs`` ((task, group, sample) each) over the workers; the
        trajectories in ``specs`` order."""
        await self._start()
        self.backend = backend
        self._id_arrays = bool(getattr(backend, "takes_id_arrays", False))
        job = self._next_job
        self._next_job += 1
        future = asyncio.get_running_loop().create_future()
        slots: list = [None] * len(specs)
        self._jobs[job] = (slots, future, policy_version, progress, version_fn)
        poll = None
        try:
            if not specs:
                return []
            version = version_fn() if version_fn is not None else policy_version
            for writer, share in zip(self._writers, worker_shares(len(specs), self.n)):
                mine = [((job << 32) | i, *specs[i]) for i in share]
                if mine:
                    _write(writer, ("run", mine, horizon, policy_version, seed, version))
            if self.setup.direct is not None and version_fn is not None:
                poll = asyncio.ensure_future(self._send_versions(job, version_fn, version))
            return await future
        finally:
            if poll is not None:
                poll.cancel()
            del self._jobs[job]

    async def _send_versions(self, job: int, version_fn: Callable[[], int], last: int) -> None:
        """Direct mode: every change of ``version_fn()`` while ``job`` runs, to every worker."""
        while True:
            await asyncio.sleep(VERSION_POLL_S)
            version = version_fn()
            if version != last:
                last = version
                for writer in self._writers:
                    _write(writer, ("ver", job, version))

    def close(self) -> None:
        """Stop the processes (asked to, or terminated after 5 s; spawned ahead and never
        connected: terminated at once)."""
        stopping = bool(self._writers)
        for writer in self._writers:
            try:
                _write(writer, ("stop",))
                writer.close()
            except Exception:  # noqa: BLE001 -- the loop may be gone
                pass
        for process in self._processes:
            if stopping:
                process.join(timeout=5)
            if process.is_alive():
                process.terminate()
                process.join(timeout=5)
        for task in self._serving:
            task.cancel()
        self._serving = set()
        if self._server is not None:
            self._server.close()
        if self._dir is not None:
            self._dir.cleanup()
        self._writers, self._processes, self._server = [], [], None
        self._dir = self._path = None
