"""Requests a web page could send to a local server are refused; malformed HTTP is one line.

A page the user visits can make the browser send requests to 127.0.0.1, but only "simple" ones
(``text/plain`` or form bodies, or none) unless the server grants a CORS preflight, and it
cannot hide where it comes from (``Origin``, ``Sec-Fetch-Site``); a page whose DNS name was
rebound to 127.0.0.1 sends its own name as ``Host``. Both kinds of server
(``agentrl_common.httpguard.request_guard_middleware``) answer state-changing routes on POST
only (405), take JSON bodies only (415), refuse a foreign ``Origin`` (403) and a ``Host`` that is
not one of their names (421), and these tests check that each refused request changed nothing.
The environment server runs as deployed (a subprocess); the inference server in-process over a
tiny random model (as in test_rollout_server.py). Also here: the inference server's
backend-sized engine defaults.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time

import aiohttp
import pytest

from environments.core.client import EnvClient
from agentrl_common.httpguard import LOOPBACK_NAMES, allowed_hosts, host_name
from rollout_helpers import TINY, byte_tokenizer, make_engine, start_server, tiny_model

pytestmark = pytest.mark.timeout(120)

BABYAI_TASK = "BabyAI-GoToLocal-v0/seed=7"
ENV_MUTATING = ("/create", "/step", "/reset", "/close", "/batch")
INFERENCE_MUTATING = ("/generate", "/flush_cache", "/update_weights_from_disk", "/abort_request",
                      "/close_session", "/pause_generation", "/continue_generation",
                      "/release_memory_occupation", "/resume_memory_occupation",
                      "/v1/completions", "/v1/chat/completions")
# what a page can send without a CORS preflight, as aiohttp sends it
SIMPLE_BODIES = [
    {"data": '{"abort_all": true, "task_id": "%s"}' % BABYAI_TASK, "headers": {"Content-Type": "text/plain"}},
    {"data": {"abort_all": "true", "task_id": BABYAI_TASK}},  # application/x-www-form-urlencoded
    {"data": aiohttp.FormData({"abort_all": "true"}, default_to_multipart=True)},  # multipart/form-data
    {"data": b'{"abort_all": true}'},  # no Content-Type: aiohttp sends application/octet-stream
    {"data": b'{"abort_all": true}', "skip_auto_headers": ["Content-Type"]},  # none at all
]


# ------------------------------------------------------------------------------ unit: names


def test_host_names_and_the_names_a_server_answers_to():
    assert host_name("127.0.0.1:8000") == "127.0.0.1" and host_name("LocalHost.") == "localhost"
    assert host_name("[::1]:30000") == "::1" and host_name("[::1]") == "::1"
    assert host_name("evil.example:80:81") is None and host_name("[::1") is None and host_name(":80") is None
    assert host_name("localhost:http") is None
    loopback = allowed_hosts("127.0.0.1")
    assert loopback == frozenset(LOOPBACK_NAMES)
    assert allowed_hosts("localhost") == frozenset(LOOPBACK_NAMES)
    # another interface needs an API key; Host is checked there only against listed names
    assert allowed_hosts("0.0.0.0") is None and allowed_hosts("10.1.2.3") is None
    assert allowed_hosts("0.0.0.0", ["Node7.cluster:30000"]) == frozenset({*LOOPBACK_NAMES, "node7.cluster"})
    assert allowed_hosts("10.1.2.3", ["node7"]) == frozenset({*LOOPBACK_NAMES, "node7", "10.1.2.3"})


# ------------------------------------------------------------------------ environment server


async def _env_request(method: str, url: str, **kwargs) -> tuple[int, dict, dict]:
    async with aiohttp.ClientSession() as http:
        async with http.request(method, url, **kwargs) as response:
            assert response.content_type == "application/json", await response.text()
            return response.status, await response.json(), dict(response.headers)


async def _live_sessions(url: str) -> int:
    return (await _env_request("GET", url + "/stats"))[1]["live_sessions"]


async def test_env_server_mutating_routes_are_post_only(babyai):
    for path in ENV_MUTATING:
        status, data, headers = await _env_request("GET", babyai.url + path)
        assert status == 405 and "error" in data and headers.get("Allow") == "POST", (path, data)
    for path in ("/health", "/tasks", "/stats"):  # read-only routes stay GET
        assert (await _env_request("GET", babyai.url + path))[0] == 200


async def test_env_server_takes_json_bodies_only(babyai):
    before = await _live_sessions(babyai.url)
    for kwargs in SIMPLE_BODIES:
        for path in ENV_MUTATING:
            status, data, headers = await _env_request("POST", babyai.url + path, **kwargs)
            assert status == 415 and "application/json" in data["error"], (path, kwargs, data)
            assert headers.get("Accept") == "application/json"
    assert await _live_sessions(babyai.url) == before  # nothing was created
    # the same body as JSON (with a charset parameter too) is served
    body = json.dumps({"task_id": BABYAI_TASK})
    for content_type in ("application/json", "application/json; charset=utf-8"):
        status, data, _ = await _env_request("POST", babyai.url + "/create", data=body, headers={"Content-Type": content_type})
        assert status == 200, data
        assert (await _env_request("POST", babyai.url + "/close", json={"env_id": data["env_id"]}))[0] == 200


async def test_env_server_refuses_foreign_hosts_and_origins(babyai):
    before = await _live_sessions(babyai.url)
    create = {"json": {"task_id": BABYAI_TASK}}
    port = babyai.port
    refused = [
        ({"Host": f"evil.example:{port}"}, 421),  # DNS rebinding: the page's own name
        ({"Host": "evil.example"}, 421),
        ({"Host": f"127.0.0.1.evil.example:{port}"}, 421),
        ({"Origin": "http://evil.example"}, 403),
        ({"Origin": "null"}, 403),  # a sandboxed frame or a file:// page
        ({"Origin": f"http://localhost:{port + 1}"}, 403),  # another local port is another origin
        ({"Sec-Fetch-Site": "cross-site"}, 403),
        ({"Sec-Fetch-Site": "same-site"}, 403),
    ]
    for headers, expected in refused:
        status, data, _ = await _env_request("POST", babyai.url + "/create", headers=headers, **create)
        assert status == expected and "error" in data, (headers, data)
        status, data, _ = await _env_request("GET", babyai.url + "/tasks", headers=headers)
        assert status == expected, (headers, data)  # reading is refused too
    assert await _live_sessions(babyai.url) == before
    # its own names and its own origin are served
    for headers in ({"Host": f"localhost:{port}"}, {"Host": f"[::1]:{port}"}, {"Host": "127.0.0.1"},
                    {"Origin": babyai.url}, {"Sec-Fetch-Site": "same-origin"}, {"Sec-Fetch-Site": "none"}):
        status, data, _ = await _env_request("POST", babyai.url + "/create", headers=headers, **create)
        assert status == 200, (headers, data)
        assert (await _env_request("POST", babyai.url + "/close", json={"env_id": data["env_id"]}))[0] == 200
    async with EnvClient(babyai.url) as client:  # our own client: JSON, no Origin
        env_id, _, _ = await client.create(task_id=BABYAI_TASK)
        assert (await client.step(env_id, "turn left")).observation
        await client.close(env_id)


async def _raw(port: int, payload: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(payload)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


MALFORMED = [
    b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nbad header line\r\n\r\n",
    b"GARBAGE\r\n\r\n",  # not HTTP (what TLS to an HTTP port looks like to the parser)
    b"POST /create HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: -5\r\n\r\n",
    b"GET /\x01 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
]


async def test_env_server_logs_malformed_http_in_one_line(babyai):
    before = babyai.log_tail(1 << 24)
    for payload in MALFORMED:
        assert (await _raw(babyai.port, payload)).startswith(b"HTTP/1.0 400"), payload
    new = babyai.log_tail(1 << 24)[len(before):]
    lines = [line for line in new.splitlines() if line.strip()]
    assert len(lines) == len(MALFORMED), new
    assert all(" WARNING malformed HTTP request from 127.0.0.1: " in line for line in lines), new
    assert "Traceback" not in new and "ERROR" not in new
    assert (await _env_request("GET", babyai.url + "/health"))[0] == 200


# --------------------------------------------------------------------------- inference server


@pytest.fixture(scope="module")
def served():
    engine = make_engine(tiny_model(seed=0), byte_tokenizer(TINY.vocab_size), max_queue=64)
    thread = start_server(engine, model_path="tiny-random")
    yield thread.url, engine
    thread.stop()
    engine.close()


async def _request(method: str, url: str, **kwargs) -> tuple[int, object, dict]:
    async with aiohttp.ClientSession() as http:
        async with http.request(method, url, **kwargs) as response:
            text = await response.text()
            try:
                return response.status, json.loads(text), dict(response.headers)
            except ValueError:
                return response.status, text, dict(response.headers)


async def _settled_stats(engine, timeout: float = 10.0) -> dict:
    """The engine's counters once its thread has finished the step that answered the last
    request: the answer reaches the client inside the step, and the step's time is added to
    ``step_time_s`` after it (a snapshot taken at once raced it on a loaded 2-core box). Settled
    = no request running or waiting and the same counters twice, 50 ms apart."""
    deadline = time.monotonic() + timeout
    before = engine.stats.as_dict()
    while True:
        await asyncio.sleep(0.05)
        now = engine.stats.as_dict()
        load = engine.load()
        if now == before and load["running"] == 0 and load["waiting"] == 0:
            return now
        assert time.monotonic() < deadline, ("the engine never went idle", load)
        before = now


async def test_inference_server_mutating_routes_are_post_only(served):
    url, engine = served
    for path in INFERENCE_MUTATING:
        status, out, headers = await _request("GET", url + path)
        assert status == 405 and headers.get("Allow") == "POST", (path, out)
        assert out["error"]["code"] == 405
    for path in ("/health", "/get_model_info", "/get_server_info", "/v1/models"):
        assert (await _request("GET", url + path))[0] == 200, path


async def test_inference_server_takes_json_bodies_only(served):
    url, engine = served
    status, out, _ = await _request("POST", url + "/generate", json={
        "input_ids": [7, 8, 9], "session_id": "kept", "sampling_params": {"max_new_tokens": 1}})
    assert status == 200, out
    cached, stats = engine.load()["cached_slots"], await _settled_stats(engine)
    assert cached >= 1  # what a flush would drop
    for kwargs in SIMPLE_BODIES:
        for path in INFERENCE_MUTATING:
            status, out, headers = await _request("POST", url + path, **kwargs)
            assert status == 415, (path, kwargs, out)
            assert "application/json" in out["error"]["message"] and out["error"]["code"] == 415
    assert not engine.paused and engine.load()["cached_slots"] == cached  # nothing ran
    assert engine.stats.as_dict() == stats
    status, out, _ = await _request("POST", url + "/generate", data=json.dumps({
        "input_ids": [5, 6], "sampling_params": {"max_new_tokens": 2}}),
        headers={"Content-Type": "application/json; charset=utf-8"})
    assert status == 200 and len(out["output_ids"]) == 2, out


async def test_inference_server_refuses_foreign_hosts_and_origins(served):
    url, engine = served
    port = int(url.rsplit(":", 1)[1])
    refused = [({"Host": f"evil.example:{port}"}, 421), ({"Host": "localhost.evil.example"}, 421),
               ({"Origin": "http://evil.example"}, 403), ({"Origin": "null"}, 403),
               ({"Origin": f"http://127.0.0.1:{port + 1}"}, 403),
               ({"Sec-Fetch-Site": "cross-site"}, 403)]
    for headers, expected in refused:
        for path, body in (("/pause_generation", {}), ("/abort_request", {"abort_all": True}), ("/flush_cache", {})):
            status, out, _ = await _request("POST", url + path, json=body, headers=headers)
            assert status == expected and out["error"]["code"] == expected, (headers, path, out)
        assert (await _request("GET", url + "/get_server_info", headers=headers))[0] == expected
        assert not engine.paused
    for headers in ({}, {"Host": f"localhost:{port}"}, {"Origin": url}):
        status, out, _ = await _request("POST", url + "/pause_generation", json={}, headers=headers)
        assert status == 200 and engine.paused, (headers, out)
        status, out, _ = await _request("POST", url + "/continue_generation", json={}, headers=headers)
        assert status == 200 and not engine.paused, (headers, out)


async def test_inference_server_openai_client_still_works(served):
    openai = pytest.importorskip("openai")
    url, _ = served
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    try:
        comp = await client.completions.create(model="tiny-random", prompt="abc", max_tokens=3, temperature=0)
        assert comp.usage.completion_tokens <= 3 and comp.choices[0].finish_reason in ("stop", "length")
    finally:
        await client.close()


async def test_inference_server_logs_malformed_http_in_one_line(served, caplog):
    url, _ = served
    port = int(url.rsplit(":", 1)[1])
    caplog.set_level(logging.DEBUG, logger="aiohttp")
    for payload in MALFORMED:
        assert (await _raw(port, payload)).startswith(b"HTTP/1.0 400"), payload
    records = [r for r in caplog.records if r.name.startswith("aiohttp")]
    assert [r.levelno for r in records] == [logging.WARNING] * len(MALFORMED), [r.getMessage() for r in records]
    assert all(r.exc_info is None and r.getMessage().startswith("malformed HTTP request from 127.0.0.1: ")
               and "\n" not in r.getMessage() for r in records)


async def test_a_server_off_loopback_checks_host_only_against_listed_names(served):
    """Bound to every interface (an API key is required there) any ``Host`` is served, since
    the names clients use are not knowable; ``--allowed-host`` lists them. (The application
    built for 0.0.0.0 is served on 127.0.0.1 here.)"""
    from aiohttp import web

    from agentrl_jax.rollout.servers.app import RolloutServer

    _, engine = served
    key = {"Authorization": "Bearer sesame"}
    for allowed, hosts in (((), {"node7.cluster": 200, "10.1.2.3:30000": 200}),
                           (("node7.cluster",), {"node7.cluster:30000": 200, "localhost": 200, "node8.cluster": 421})):
        runner = web.AppRunner(RolloutServer(engine, api_key="sesame", allowed_hosts=allowed).app("0.0.0.0"))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            port = site._server.sockets[0].getsockname()[1]
            for host, expected in hosts.items():
                status, out, _ = await _request("GET", f"http://127.0.0.1:{port}/get_server_info", headers={**key, "Host": host})
                assert status == expected, (allowed, host, out)
            status, _, _ = await _request("POST", f"http://127.0.0.1:{port}/pause_generation", json={},
                                          headers={**key, "Origin": "http://evil.example"})
            assert status == 403 and not engine.paused
        finally:
            await runner.cleanup()


# --------------------------------------------------------------------- backend-sized defaults


def test_standalone_server_defaults_are_sized_like_the_trainers_engine():
    from agentrl_jax.models.config import ModelConfig
    from agentrl_jax.rollout.engine.engine import EngineConfig
    from agentrl_jax.rollout.engine.resolution import resolve_engine_config
    from agentrl_jax.rollout.servers.engine_flags import engine_config_from_args
    from agentrl_jax.rollout.servers.server import parse_args
    from agentrl_jax.rollout.engine.sizing import CPU_KV_RAM_FRACTION, engine_prefill, fit_engine_slots
    from agentrl_jax.training.config.sections import RunConfig

    smol = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
                       num_heads=9, num_kv_heads=3, head_dim=64)  # SmolLM2-135M's KV shape, f32
    args = parse_args([])
    # the server's defaults are the section's, which are the run config's
    assert engine_config_from_args(args) == EngineConfig()
    rollout = RunConfig().rollout
    assert (args.max_batch, args.max_length, args.decode_steps, args.prefill_kv_buckets) == (
        rollout.max_batch, rollout.max_context, rollout.decode_steps, rollout.prefill_kv_buckets)
    cpu = resolve_engine_config(engine_config_from_args(args), "cpu", 1, smol)
    # the trainer's own sizing functions
    assert cpu.max_batch == fit_engine_slots(args.max_batch, smol, args.max_length, None, backend="cpu")
    prefill = engine_prefill("cpu")
    assert (cpu.prefill_chunks, cpu.prefill_tokens, cpu.prefill_kv_buckets) == (
        prefill["prefill_chunks"], prefill["prefill_tokens"], prefill["prefill_kv_buckets"])
    # and by hand: 2 x 30 layers x 3 heads x 64 x 4096 positions x 4 bytes per slot
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    per_slot = 2 * 30 * 3 * 64 * 4096 * 4
    assert cpu.max_batch == min(64, max(1, int(ram * CPU_KV_RAM_FRACTION // per_slot)))
    assert cpu.prefill_tokens == min(cpu.prefill_chunks) < 4096
    assert (cpu.dtype, cpu.decode_attention, cpu.prefill_attention) == ("float32", "dense", "dense")
    # on an accelerator: every slot, chunks up to 1024, 4096 tokens a call, KV buckets 512..2048
    gpu = resolve_engine_config(engine_config_from_args(parse_args(["--prefill-attention", "dense"])),
                                "gpu", 1, smol)
    assert (gpu.max_batch, gpu.prefill_chunks, gpu.prefill_tokens, gpu.prefill_kv_buckets) == (
        64, (64, 256, 1024), 4096, (512, 1024, 2048))
    # flags given on the command line win, on CPU too
    given = resolve_engine_config(engine_config_from_args(parse_args([
        "--prefill-chunks", "64,256,1024", "--prefill-tokens", "2048",
        "--prefill-kv-buckets", "512,1024", "--max-batch", "2"])), "cpu", 1, smol)
    assert (given.max_batch, given.prefill_chunks, given.prefill_tokens, given.prefill_kv_buckets) == (
        2, (64, 256, 1024), 2048, (512, 1024))
