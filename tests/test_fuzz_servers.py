"""Bounded fuzz campaigns against the HTTP servers ("nothing lost, nobody let in").

Each campaign is seeded, sends a few hundred requests to one server on 127.0.0.1 (mutated valid
requests: wrong types, huge integers, odd strings, lone surrogates, unknown fields, raw bytes
that are not JSON, odd headers, unknown routes and methods), a few at a time, and counts the
answers by class. Any 5xx (other than a route's documented 501), a dropped connection or a
request that does not finish within ``REQUEST_TIMEOUT_S`` fails the campaign; the server must be
healthy afterwards. Servers: BabyAI, TextCraft and deep search (subprocesses, as deployed) and
the inference server over a tiny random model (in-process, as in test_rollout_server.py).

``pytest -s tests/test_fuzz_servers.py`` prints each campaign's tally (docs/RELIABILITY.md).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import random
import time
from typing import Any, Callable

import aiohttp
import pytest

from agentrl_common.processes import start_env_server

pytestmark = pytest.mark.timeout(180)

SEED = 12
ENV_REQUESTS = 500
INFERENCE_REQUESTS = 400
CONCURRENCY = 6
REQUEST_TIMEOUT_S = 30.0
MAX_LIVE_SESSIONS = 40

# ------------------------------------------------------------------------------ random values

WEIRD_STRINGS = [
    "", " ", "\n", "\t\r\n", "\x00", "\u0667\u0668", "\u00e9t\u00e9", "\U0001f600", "a" * 10_000, "9" * 5000,
    "-1", "1e400", "NaN", "null", "true", "../../etc/passwd", "/etc/passwd", "%s%n", "{{ 7*7 }}", "<script>",
    "\u202e", "\ufeff", "\ud800", "a\udfffb",  # lone surrogates: json.dumps writes them as escapes
]  # fmt: skip


def fuzz_value(rng: random.Random, depth: int = 0) -> Any:
    """A random JSON value, biased to the ones that broke servers before."""
    kind = rng.randrange(12 if depth < 2 else 9)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, 1, -1, 2**31, 2**63 - 1, 2**63, -(2**63), 10**18, 10**30, rng.randrange(-5, 5000)])
    if kind == 3:
        return rng.choice([0.5, -0.0, 1e308, -1e-308, 3.0, 1e18])
    if kind in (4, 5, 6):
        return rng.choice(WEIRD_STRINGS)
    if kind == 7:
        return "".join(chr(rng.randrange(0x20, 0x2FFF)) for _ in range(rng.randrange(1, 40)))
    if kind == 8:
        return rng.choice(["a", "go to red ball 1", "inventory", "abc"]) * rng.randrange(1, 3000)
    if kind == 9:
        return [fuzz_value(rng, depth + 1) for _ in range(rng.randrange(0, 5))]
    if kind == 10:
        return {rng.choice(["a", "env_id", "x" * 50, ""]): fuzz_value(rng, depth + 1) for _ in range(rng.randrange(0, 4))}
    return rng.choice([[1] * 5000, list(range(300)), [[1, 2]] * 100])


RAW_BODIES = [
    b"", b"{", b"[", b"{not json", b'"a string"', b"[1, 2]", b"null", b"123", b"\xff\xfe\xfd", b'{"a": NaN}',
    b'{"a": Infinity}', b"[" * 5000 + b"]" * 5000, b'{"a":' * 3000 + b"1" + b"}" * 3000, b'{"task_id": "\\ud800"}',
    b'{"action": "\\udfff", "env_id": "x"}', b'{"text": "\\ud800"}', b'{"a": 1, "a": 2}', b"\x00" * 64,
    b'{"index": ' + b"9" * 5000 + b', "split": "train"}', b'{"task_id": "x"}' + b" " * 100_000, b"{}" * 1000,
    b'{"action": "' + b"a" * (1 << 20) + b'", "env_id": "x"}',
]  # fmt: skip


def mutate(rng: random.Random, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` with one to three fields replaced, dropped or added."""
    body = dict(body)
    for _ in range(rng.randrange(1, 4)):
        op = rng.randrange(4)
        if op == 0 and body:
            body[rng.choice(list(body))] = fuzz_value(rng)
        elif op == 1 and body:
            body.pop(rng.choice(list(body)))
        elif op == 2:
            body[rng.choice(["bogus", "seed", "index", "split", "extra", "stream", "n"])] = fuzz_value(rng)
        else:
            key = rng.choice(list(body)) if body else "x"
            if isinstance(body.get(key), str):
                body[key] = rng.choice([" ", "", "\n", body[key]]) + body[key] + rng.choice(["", "\n", " ", "\u0667", "0" * 300])
    return body


# --------------------------------------------------------------------------------- the driver


@dataclasses.dataclass
class Request:
    method: str
    path: str
    body: bytes | None = None
    content_type: str | None = "application/json"
    allowed: frozenset[int] = frozenset()  # 5xx statuses this route may answer (e.g. a 501)


@dataclasses.dataclass
class Tally:
    """Answers by status class; the failures, kept for the assertion message."""

    name: str
    statuses: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    failures: list[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    @property
    def classes(self) -> dict[str, int]:
        out: collections.Counter = collections.Counter()
        for status, n in self.statuses.items():
            out[f"{status // 100}xx" if isinstance(status, int) else status] += n
        return dict(sorted(out.items()))

    def line(self) -> str:
        return (f"{self.name}: {sum(self.statuses.values())} requests in {self.seconds:.1f} s, {self.classes}, "
                f"statuses {dict(sorted(self.statuses.items(), key=str))}")


def encode(body: Any) -> bytes:
    return json.dumps(body).encode()


async def send(http: aiohttp.ClientSession, base: str, request: Request, tally: Tally) -> tuple[int | None, Any]:
    """Send one request; record its status (or the failure); return (status, parsed JSON)."""
    headers = {"Content-Type": request.content_type} if request.content_type else {}
    try:
        async with http.request(request.method, base + request.path, data=request.body, headers=headers,
                                timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)) as response:
            raw = await response.read()
            status = response.status
    except (aiohttp.ClientError, asyncio.TimeoutError) as error:
        tally.statuses["no answer"] += 1
        tally.failures.append(f"{request.method} {request.path} {request.body[:200] if request.body else b''!r}: {type(error).__name__} {error}")
        return None, None
    tally.statuses[status] += 1
    if status >= 500 and status not in request.allowed:
        tally.failures.append(f"{status} for {request.method} {request.path} {request.body[:300] if request.body else b''!r}: {raw[:300]!r}")
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, None


async def campaign(name: str, base: str, make: Callable[[random.Random], Request], count: int,
                   after: Callable[[Request, int | None, Any], None] | None = None,
                   exclusive: Callable[[Request], bool] = lambda r: False,
                   follow_up: Callable[[Request], Request | None] = lambda r: None) -> Tally:
    """``count`` requests from ``make`` (seeded), ``CONCURRENCY`` at a time; ``exclusive``
    requests run alone, followed by ``follow_up`` (e.g. continue after a pause)."""
    rng = random.Random(f"{SEED}:{name}")
    tally = Tally(name)
    started = time.monotonic()
    async with aiohttp.ClientSession() as http:
        sent = 0
        while sent < count:
            batch = [make(rng) for _ in range(min(CONCURRENCY, count - sent))]
            solo = [r for r in batch if exclusive(r)]
            batch = [r for r in batch if not exclusive(r)]
            answers = await asyncio.gather(*(send(http, base, r, tally) for r in batch))
            for request, (status, data) in zip(batch, answers):
                if after is not None:
                    after(request, status, data)
            for request in solo:
                await send(http, base, request, tally)
                if (extra := follow_up(request)) is not None:
                    await send(http, base, extra, tally)
            sent += len(batch) + len(solo)
        async with http.get(base + "/health") as response:
            assert response.status == 200, f"{name}: unhealthy after the campaign"
    tally.seconds = time.monotonic() - started
    return tally


def check(tally: Tally, count: int) -> None:
    print("\n" + tally.line())
    assert not tally.failures, f"{len(tally.failures)} failures, e.g.:\n" + "\n".join(tally.failures[:10])
    assert sum(tally.statuses.values()) >= count, f"{tally.name}: only {sum(tally.statuses.values())} answered requests"


# ------------------------------------------------------------------------ environment servers


class EnvFuzzer:
    """Requests for one family server: valid-looking ones around live sessions, mutated ones."""

    def __init__(self, task_ids: list[str], actions: list[str]) -> None:
        self.task_ids, self.actions = task_ids, actions
        self.live: list[str] = []

    def task_id(self, rng: random.Random) -> str:
        task = rng.choice(self.task_ids)
        if rng.random() < 0.3:  # the malformed ids of docs/RELIABILITY.md
            task = rng.choice([task + "\n", " " + task, task + " ", task.upper(), task.replace("1", "\u0661"), task + "9" * 5000,
                               task + "9" * 200, task.replace("=", "=0"), task.replace("_", " "), task[:-1]])  # fmt: skip
        return task

    def env_id(self, rng: random.Random) -> Any:
        if self.live and rng.random() < 0.85:
            return rng.choice(self.live)
        return rng.choice(["nope", "", "0" * 16, 12, None, "\u0000", "a" * 5000])

    def make(self, rng: random.Random) -> Request:
        r = rng.random()
        if r < 0.06:
            return Request("POST", rng.choice(["/create", "/step", "/reset", "/close"]), rng.choice(RAW_BODIES),
                           rng.choice(["application/json", "text/plain", None]))  # fmt: skip
        if r < 0.12:
            query = "&".join(f"{k}={v}" for k, v in [("split", rng.choice(["train", "test", "dev", "", "%00", "train%0A"])),
                                                     ("offset", rng.choice(["0", "5", "-1", "9" * 30, "1e3", "%2B3", "\u0663", "999999"])),
                                                     ("limit", rng.choice(["1", "3", "0", "9" * 5000, "x", "2.5"]))] if rng.random() < 0.7)  # fmt: skip
            return Request("GET", "/tasks?" + query, None, None)
        if r < 0.16:
            return Request(rng.choice(["GET", "PUT", "DELETE", "POST"]), rng.choice(["/health", "/stats", "/nope", "/step", "/", "/create/x"]), None, None)
        if r < 0.34 or not self.live:
            if len(self.live) >= MAX_LIVE_SESSIONS:
                return Request("POST", "/close", encode({"env_id": self.live.pop(0)}))
            body: dict[str, Any] = {"task_id": self.task_id(rng)} if rng.random() < 0.6 else {
                "split": rng.choice(["train", "test"]), "index": rng.randrange(0, 60)}
            return Request("POST", "/create", encode(mutate(rng, body) if rng.random() < 0.4 else body))
        if r < 0.85:
            body = {"env_id": self.env_id(rng), "action": rng.choice(self.actions) if rng.random() < 0.6 else fuzz_value(rng)}
            return Request("POST", "/step", encode(mutate(rng, body) if rng.random() < 0.3 else body))
        if r < 0.93:
            body = {"env_id": self.env_id(rng)}
            if rng.random() < 0.5:
                body["task_id"] = self.task_id(rng)
            return Request("POST", "/reset", encode(mutate(rng, body) if rng.random() < 0.4 else body))
        return Request("POST", "/close", encode({"env_id": self.env_id(rng)}))

    def after(self, request: Request, status: int | None, data: Any) -> None:
        """Track live sessions (created / closed) so later requests reach real instances."""
        if status == 200 and request.path == "/create" and isinstance(data, dict):
            self.live.append(data["env_id"])
        if request.path == "/close" and request.body and status in (200, 404):
            try:
                closed = json.loads(request.body).get("env_id")
            except (ValueError, AttributeError):
                return
            if closed in self.live:
                self.live.remove(closed)


BABYAI_ACTIONS = ["turn left", "turn right", "move forward", "pickup", "drop", "toggle", "check available actions", "go to red ball",
                  "pick up blue key 2", "go through yellow door", "go to red ball 99999999999", "go to red ball \u0661", "GO TO  Red Ball",
                  "jump", "", "\n", "go to red ball 1\n", "go to red ball " + "9" * 5000]  # fmt: skip
TEXTCRAFT_ACTIONS = ["inventory", "get 1 acacia logs", "craft 4 acacia planks using 1 acacia logs", "get 99999999999999999999 stick",
                     "get -1 stick", "get 1e3 stick", "craft 1 x using", "craft using ,,,", "get \u0663 stick", "craft 1 stick using 9" + "9" * 40 + " planks",
                     "get " + "9" * 5000 + " stick"]  # fmt: skip
DEEPSEARCH_ACTIONS = ["<search>capital of France</search>", "<search></search>", "<answer>Paris</answer>", "<answer></answer>",
                      "<search>" + "word " * 2000 + "</search>", "<SEARCH>x", "<search><answer>a</answer></search>", "no tool call",
                      "<answer>" + "\u00e9" * 500 + "</answer>"]  # fmt: skip


async def run_env_campaign(family: str, actions: list[str], split_size: int = 60) -> Tally:
    with start_env_server(family, extra_args=["--max-sessions", "64"]) as server:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{server.url}/tasks?split=train&limit={split_size}") as response:
                train = (await response.json())["task_ids"]
            async with http.get(f"{server.url}/tasks?split=test&limit=20") as response:
                test = (await response.json())["task_ids"]
        fuzzer = EnvFuzzer(train + test, actions)
        tally = await campaign(family, server.url, fuzzer.make, ENV_REQUESTS, after=fuzzer.after)
        assert server.alive()
        log = server.log_tail(1 << 20)
    assert "Traceback" not in log, log[-3000:]
    return tally


async def test_fuzz_babyai_server():
    check(await run_env_campaign("babyai", BABYAI_ACTIONS), ENV_REQUESTS)


async def test_fuzz_textcraft_server():
    check(await run_env_campaign("textcraft", TEXTCRAFT_ACTIONS), ENV_REQUESTS)


async def test_fuzz_deepsearch_server():
    pytest.importorskip("bm25s", reason="deep search needs bm25s")
    # the lookup task set: the same server code, without the search set's first build (1-2 min)
    check(await run_env_campaign("deepsearch_lookup", DEEPSEARCH_ACTIONS), ENV_REQUESTS)


# --------------------------------------------------------------------------- inference server


class InferenceFuzzer:
    """Requests for the SGLang-API server: generation (cheap: few tokens), admin, weights."""

    def __init__(self, weight_paths: list[str]) -> None:
        self.weight_paths = weight_paths

    def sampling(self, rng: random.Random) -> dict[str, Any]:
        sp: dict[str, Any] = {"max_new_tokens": rng.randrange(0, 4)}
        if rng.random() < 0.5:
            sp["temperature"] = rng.choice([0, 0.7, 1.0])
        if rng.random() < 0.3:
            sp.update(top_k=rng.choice([-1, 5]), top_p=rng.choice([0.9, 1.0]), n=rng.choice([1, 2]))
        if rng.random() < 0.2:
            sp["stop"] = rng.choice(["a", ["x", "\n"], "\u00e9"])
        return mutate(rng, sp) if rng.random() < 0.3 else sp

    def make(self, rng: random.Random) -> Request:
        r = rng.random()
        if r < 0.06:
            return Request("POST", rng.choice(["/generate", "/v1/completions", "/v1/chat/completions", "/update_weights_from_disk",
                                               "/abort_request", "/pause_generation", "/close_session"]),
                           rng.choice(RAW_BODIES), rng.choice(["application/json", "text/plain", None]))  # fmt: skip
        if r < 0.12:
            path = rng.choice(["/health", "/health_generate", "/get_model_info", "/get_server_info", "/v1/models", "/flush_cache",
                               "/nope", "/generate", "/release_memory_occupation"])  # fmt: skip
            return Request(rng.choice(["GET", "POST", "DELETE"]), path, b"{}", allowed=frozenset({501}))
        if r < 0.45:
            body: dict[str, Any] = {"sampling_params": self.sampling(rng)}
            if rng.random() < 0.5:
                body["text"] = rng.choice(["hello", "", "\u00e9t\u00e9 \U0001f600", ["a", "b"], "x" * 300, 5, "\ud800", ["ok", "\udc00"]])
            else:
                body["input_ids"] = rng.choice([[5, 6, 7], [[5], [6, 7]], [1] * 200, [511, 512], [-1], [3.5], [], [True]])
            if rng.random() < 0.3:
                body.update(return_logprob=rng.choice([True, False, "yes"]), rid=rng.choice(["r1", ["a"], 3]),
                            session_id=rng.choice(["s", None, 7]))  # fmt: skip
            return Request("POST", "/generate", encode(mutate(rng, body) if rng.random() < 0.4 else body))
        if r < 0.6:
            body = {"prompt": rng.choice(["abc", ["a", "b"], [5, 6], [[5], [6]], "", [], "\ud800"]), "max_tokens": rng.randrange(0, 4),
                    "temperature": rng.choice([0, 1]), "logprobs": rng.choice([None, 0, 1, 5])}  # fmt: skip
            return Request("POST", "/v1/completions", encode(mutate(rng, body) if rng.random() < 0.4 else body))
        if r < 0.72:
            kwargs = rng.choice([{}, {"enable_thinking": False}, {"chat_template": "{{ 1 }}"}, {"tokenize": True}, "x", {"return_dict": True}])
            body = {"messages": rng.choice([[{"role": "user", "content": "hi"}], [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "t"}]}],
                                            [], [{"role": 3}], [{"role": "user", "content": [{"type": "image_url"}]}], [{"role": "user", "content": "\udfff"}]]),
                    "max_tokens": rng.randrange(1, 4), "chat_template_kwargs": kwargs}  # fmt: skip
            return Request("POST", "/v1/chat/completions", encode(mutate(rng, body) if rng.random() < 0.4 else body))
        if r < 0.86:
            body = {"model_path": rng.choice(self.weight_paths), "flush_cache": rng.choice([True, False, "false"]),
                    "weight_version": rng.choice(["v1", 3, None])}  # fmt: skip
            return Request("POST", "/update_weights_from_disk", encode(mutate(rng, body) if rng.random() < 0.25 else body))
        if r < 0.93:
            body = rng.choice([{"rid": "r1"}, {"abort_all": True}, {"abort_all": "no"}, {"rid": 5}, {}])
            return Request("POST", "/abort_request", encode(body))
        body = rng.choice([{"mode": "in_place"}, {"mode": "abort"}, {"mode": "retract"}, {"mode": "x"}, {"mode": 3}, {}])
        return Request("POST", "/pause_generation", encode(body))


async def test_fuzz_inference_server(tmp_path):
    from agentrl_jax.models.safetensors_io import save_hf_directory
    from rollout_helpers import TINY, byte_tokenizer, make_engine, start_server, tiny_model

    model = tiny_model(seed=0)
    allowed = tmp_path / "weights"
    save_hf_directory(model, str(allowed / "good"))
    save_hf_directory(model, str(allowed / "list-config"))
    (allowed / "list-config" / "config.json").write_text("[1]")
    save_hf_directory(model, str(allowed / "bad-index"))
    (allowed / "bad-index" / "model.safetensors.index.json").write_text('{"weight_map": {"a": "/etc/passwd"}}')
    save_hf_directory(tiny_model(seed=0, cfg=TINY.replace(num_layers=1)), str(allowed / "other-shape"))
    paths = [str(allowed / p) for p in ("good", "list-config", "bad-index", "other-shape", "missing", "good/../good", "good/../../..")]
    paths += ["/etc", "/", "", "relative", "/nonexistent/x", "\u0000", "a" * 5000, str(tmp_path)]
    engine = make_engine(model, byte_tokenizer(TINY.vocab_size), max_queue=64)
    thread = start_server(engine, model_path="tiny-random", max_body_bytes=256 * 1024, weights_dirs=[str(allowed)])
    fuzzer = InferenceFuzzer(paths)
    try:
        tally = await campaign("inference", thread.url, fuzzer.make, INFERENCE_REQUESTS,
                               exclusive=lambda r: r.path == "/pause_generation",
                               follow_up=lambda r: Request("POST", "/continue_generation", b"{}"))
        assert not engine.paused
    finally:
        thread.stop()
        engine.close()
    check(tally, INFERENCE_REQUESTS)
