"""The SGLang client backend against our own server (same HTTP API; SGLang itself cannot be
installed on a CPU machine): routing, stickiness, retries, errors, weight sync via disk."""

from __future__ import annotations

import asyncio
import socket

import jax
import numpy as np
import pytest

from agentrl_jax.rollout.contract import (BackendUnavailableError, InvalidRequestError,
                                      SamplingParams, create_backend)
from agentrl_jax.rollout.backends.sglang import SGLangBackend
from agentrl_jax.rollout.servers.sglang_launch import launch_sglang_server
from rollout_helpers import (TINY, byte_tokenizer, full_logprobs, make_engine, random_prompt,
                             reference_greedy, start_server, tiny_model)

GREEDY = dict(temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=0)


@pytest.fixture(scope="module")
def servers(model, tmp_path_factory):
    tok = byte_tokenizer(TINY.vocab_size)
    engines = [make_engine(model, tok) for _ in range(2)]
    # the servers load weights only from allowed directories: every test's tmp_path
    threads = [start_server(e, weights_dirs=[str(tmp_path_factory.getbasetemp())]) for e in engines]
    yield [t.url for t in threads], engines
    for t in threads:
        t.stop()
    for e in engines:
        e.close()


def one_token_reply(body: dict) -> "web.Response":
    """A stub server's answer to ``/generate``: one token (7) with its logprob."""
    from aiohttp import web

    return web.json_response({"output_ids": [7], "text": "x", "meta_info": {
        "id": body["rid"], "finish_reason": {"type": "length"}, "prompt_tokens": 3,
        "output_token_logprobs": [[-0.5, 7, None]]}})


async def serve_stub(generate) -> tuple["web.AppRunner", str]:
    """Serve ``generate`` as ``POST /generate`` on a free localhost port -> (runner, url)."""
    from aiohttp import web

    app = web.Application()
    app.router.add_post("/generate", generate)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


def dead_url() -> str:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


async def test_generate_and_logprobs(servers, model):
    urls, _ = servers
    async with SGLangBackend(urls) as backend:
        assert await backend.health()
        prompt = random_prompt(np.random.default_rng(0), 10)
        res = await backend.generate(prompt, SamplingParams(max_new_tokens=7, **GREEDY))
        assert res.output_ids == reference_greedy(model, prompt, 7)
        ref = full_logprobs(model, prompt + res.output_ids)
        expected = [ref[len(prompt) - 1 + i, t] for i, t in enumerate(res.output_ids)]
        np.testing.assert_allclose(res.output_logprobs, expected, atol=1e-4)
        assert res.finish_reason == "length" and res.prompt_tokens == 10
        many = await backend.generate_n(prompt, SamplingParams(max_new_tokens=3, n=3, seed=5))
        assert len(many) == 3


async def test_sticky_sessions_hit_prefix_cache(servers, model):
    urls, engines = servers
    async with SGLangBackend(urls) as backend:
        rng = np.random.default_rng(1)
        sp = SamplingParams(max_new_tokens=4, **GREEDY)
        sessions = {f"ep-{i}": random_prompt(rng, 12) for i in range(6)}
        first = await asyncio.gather(*[backend.generate(h, sp, session_id=s)
                                       for s, h in sessions.items()])
        assert {backend._sticky[s] for s in sessions} == {0, 1}  # spread over both servers
        homes = dict(backend._sticky)
        turn2 = {s: h + r.output_ids + [7, 8] for (s, h), r in zip(sessions.items(), first)}
        second = await asyncio.gather(*[backend.generate(h, sp, session_id=s)
                                        for s, h in turn2.items()])
        assert dict(backend._sticky) == homes
        for (s, h), r in zip(turn2.items(), second):
            assert r.cached_tokens == len(h) - 3  # the session's own server had its prefix
            assert r.output_ids == reference_greedy(model, h, 4)


async def test_kv_cache_released_on_every_server_and_resumed(servers, model):
    """release_kv_cache posts SGLang's /release_memory_occupation (tags ["kv_cache"]) to each
    server: both engines drop their caches (the bytes they report are summed) and the pins
    go; resume_kv_cache allocates them again; generation is unchanged."""
    urls, engines = servers
    async with SGLangBackend(urls) as backend:
        sp = SamplingParams(max_new_tokens=4, **GREEDY)
        prompt = random_prompt(np.random.default_rng(2), 9)
        await asyncio.gather(*[backend.generate(prompt, sp, session_id=f"kv-{i}")
                               for i in range(2)])
        assert backend._sticky
        kv = [sum(int(x.nbytes) for x in jax.tree.leaves(e.kv.cache)) for e in engines]
        assert await backend.release_kv_cache() == sum(kv)
        assert all(e.kv.cache is None for e in engines) and not backend._sticky
        assert await backend.resume_kv_cache() == sum(kv)
        assert all(e.kv.cache is not None for e in engines)
        res = await backend.generate(prompt, sp)
        assert res.output_ids == reference_greedy(model, prompt, 4) and res.cached_tokens == 0


async def test_least_loaded_spreads_requests(servers):
    urls, _ = servers
    async with SGLangBackend(urls) as backend:
        await asyncio.gather(*[backend.generate([5, 6, 7], SamplingParams(max_new_tokens=6))
                               for _ in range(8)])
        assert all(s.served >= 2 for s in backend.servers), backend.load()


async def test_retries_and_errors(servers, model):
    urls, _ = servers
    dead = dead_url()
    async with SGLangBackend([dead, urls[0]], backoff_s=0.01, max_backoff_s=0.05) as backend:
        for _ in range(3):
            res = await backend.generate([5, 6, 7], SamplingParams(max_new_tokens=2, **GREEDY))
            assert res.output_ids == reference_greedy(model, [5, 6, 7], 2)
        assert not backend.servers[0].healthy and backend.servers[1].healthy
        with pytest.raises(InvalidRequestError, match="vocabulary"):
            await backend.generate([TINY.vocab_size + 1], SamplingParams(max_new_tokens=2))
    async with SGLangBackend([dead], max_retries=2, backoff_s=0.01) as backend:
        assert not await backend.health()
        with pytest.raises(BackendUnavailableError):
            await backend.generate([5, 6], SamplingParams(max_new_tokens=2))


async def test_update_weights_via_disk(servers, model, tmp_path):
    urls, engines = servers
    other = tiny_model(seed=1)
    prompt = random_prompt(np.random.default_rng(2), 8)
    sp = SamplingParams(max_new_tokens=6, **GREEDY)
    backend = create_backend("sglang", urls=urls, export_dir=str(tmp_path),
                             export_dtype="float32")
    async with backend:
        cached = random_prompt(np.random.default_rng(4), 12)
        await backend.generate(cached, sp, session_id="cached")
        again = await backend.generate(cached, sp, session_id="cached")
        assert again.cached_tokens > 0
        path = await backend.update_weights(other, version="step-1")
        # the servers dropped their prefix caches while loading, the client its session pins
        assert backend.pinned_sessions() == [0, 0]
        after = await backend.generate(cached, sp, session_id="cached")
        assert after.cached_tokens == 0
        assert path.startswith(str(tmp_path))
        for i in range(2):  # every server now serves the new weights
            res = await backend.generate(prompt, sp, session_id=f"s{i}")
            assert res.output_ids == reference_greedy(other, prompt, 6)
            assert res.weight_version == "step-1"
        assert all(e.weight_version == "step-1" for e in engines)
        await backend.update_weights(model)  # back to the original
        res = await backend.generate(prompt, sp)
        assert res.output_ids == reference_greedy(model, prompt, 6)
        with pytest.raises(Exception, match="update_weights_from_disk failed"):
            await backend.update_weights(path=str(tmp_path / "nothing-here"))


def test_launcher_without_sglang():
    pytest.importorskip("aiohttp")
    try:
        import sglang  # noqa: F401
        pytest.skip("SGLang is installed here")
    except ImportError:
        pass
    with pytest.raises(RuntimeError, match="SGLang is not installed"):
        launch_sglang_server("/tmp/model", port=1)


async def test_api_key_on_generation_and_weight_updates(model, tmp_path, monkeypatch):
    """Before: a server started with --api-key answers 401 to the backend unless it sends
    ``Authorization: Bearer <key>`` (config ``rollout.api_key`` or $AGENTRL_ROLLOUT_API_KEY),
    on generation and on ``update_weights`` (``/update_weights_from_disk``)."""
    from ml_collections import ConfigDict

    from agentrl_jax.rollout.backends.sglang import API_KEY_ENV
    from agentrl_jax.training.config.experiment import to_run_config
    from agentrl_jax.training.runtime import services

    tok = byte_tokenizer(TINY.vocab_size)
    engine = make_engine(model, tok)
    thread = start_server(engine, api_key="sesame", weights_dirs=[str(tmp_path)])
    other = tiny_model(seed=1)
    prompt = random_prompt(np.random.default_rng(3), 8)
    sp = SamplingParams(max_new_tokens=5, **GREEDY)
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    try:
        async with SGLangBackend([thread.url], max_retries=0) as anonymous:
            with pytest.raises(InvalidRequestError, match="HTTP 401"):
                await anonymous.generate(prompt, sp)
        async with SGLangBackend([thread.url], api_key="wrong", max_retries=0,
                                 export_dir=str(tmp_path), export_dtype="float32") as wrong:
            with pytest.raises(Exception, match="401"):
                await wrong.update_weights(other, version="1")
        assert engine.weight_version == "0"  # nothing was loaded

        config = ConfigDict({"rollout": {"backend": "sglang", "urls": thread.url,
                                         "api_key": "sesame"}})
        backend = services.make_backend(to_run_config(config), None, None, None)
        backend.export_dir, backend.export_dtype = str(tmp_path), "float32"
        async with backend:
            res = await backend.generate(prompt, sp)
            assert res.output_ids == reference_greedy(model, prompt, 5)
            await backend.update_weights(other, version="7")
            res = await backend.generate(prompt, sp)
            assert res.output_ids == reference_greedy(other, prompt, 5)
            assert res.weight_version == "7" and engine.weight_version == "7"

        monkeypatch.setenv(API_KEY_ENV, "sesame")  # the environment variable, no config key
        async with SGLangBackend([thread.url], max_retries=0) as from_env:
            res = await from_env.generate(prompt, sp)
            assert res.output_ids == reference_greedy(other, prompt, 5)
    finally:
        thread.stop()
        engine.close()


async def test_many_concurrent_requests_reach_the_server_at_once():
    """256 concurrent episodes must put 256 requests in the servers' schedulers, not
    aiohttp's default 100 at a time (half-empty decode batches). The stub server answers only
    once ``wanted`` requests are open at the same time."""
    from aiohttp import web

    wanted = 150
    arrived = asyncio.Event()
    open_now, most = 0, 0

    async def generate(request: web.Request) -> web.Response:
        nonlocal open_now, most
        body = await request.json()
        open_now += 1
        most = max(most, open_now)
        if open_now >= wanted:
            arrived.set()
        try:
            await asyncio.wait_for(arrived.wait(), 5.0)
        except asyncio.TimeoutError:
            return web.json_response({"error": {"message": "never all open"}}, status=400)
        finally:
            open_now -= 1
        return one_token_reply(body)

    runner, url = await serve_stub(generate)
    try:
        async with SGLangBackend([url], max_retries=0) as backend:
            results = await asyncio.gather(*[backend.generate([1, 2, 3], SamplingParams(
                max_new_tokens=1), session_id=f"s{i}") for i in range(wanted)])
        assert most == wanted and all(r.output_ids == [7] for r in results)
        with pytest.raises(ValueError, match="max_connections"):
            SGLangBackend([url], max_connections=-1)
    finally:
        await runner.cleanup()


async def test_new_sessions_spread_by_count_even_when_one_server_is_faster():
    """Sticky sessions fill each server's cache: a server that answers faster must not collect
    more new sessions (with least-in-flight routing alone the fast stub gets most of them)."""
    from aiohttp import web

    delays = [0.001, 0.05]  # the first stub answers 50x faster

    def stub(delay: float):
        async def generate(request: web.Request) -> web.Response:
            body = await request.json()
            await asyncio.sleep(delay)
            return one_token_reply(body)
        return generate

    served = [await serve_stub(stub(delay)) for delay in delays]
    runners, urls = [r for r, _ in served], [u for _, u in served]
    try:
        async with SGLangBackend(urls, max_retries=0) as backend:
            async def episode(i: int) -> None:
                await asyncio.sleep(0.002 * i)  # episodes start one after another
                for _ in range(3):
                    await backend.generate([1, 2, 3], SamplingParams(max_new_tokens=1),
                                           session_id=f"ep{i}")
            await asyncio.gather(*[episode(i) for i in range(60)])
            assert backend.pinned_sessions() == [30, 30]
            assert backend.sessions_placed() == [30, 30]
            assert [s.served for s in backend.servers] == [90, 90]  # each session stayed put
            backend.end_session("ep0")
            assert sum(backend.pinned_sessions()) == 59
            assert backend.sessions_placed() == [30, 30]
    finally:
        for runner in runners:
            await runner.cleanup()


async def test_a_dropped_keep_alive_connection_is_retried_at_once():
    """SGLang's uvicorn closes idle keep-alive connections after 5 s, aiohttp reuses them for
    15 s: a request sent on one fails with ``ServerDisconnectedError`` (89 times in one BabyAI
    rollout against SGLang 0.5.16). The stub drops the connection of its first request; the
    client must send it again at once (not after its back-off, 5 s here) and keep the server
    up. A second drop in a row is a connection failure, retried after the back-off. The
    back-off sleeps of the client are recorded (and cut short), not timed."""
    from aiohttp import web

    from agentrl_jax.rollout.backends import sglang as sglang_module

    backoffs: list[float] = []
    real_sleep = asyncio.sleep

    async def recorded_sleep(seconds, *args, **kwargs):
        if seconds >= 1.0:  # the client's back-off (its other waits are short polls)
            backoffs.append(seconds)
            seconds = 0.0
        return await real_sleep(seconds, *args, **kwargs)

    calls = {"n": 0}
    drop = {1}

    async def generate(request: web.Request) -> web.Response:
        body = await request.json()
        calls["n"] += 1
        if calls["n"] in drop:
            request.transport.close()  # as a server closing an idle keep-alive connection
            return web.Response()
        return one_token_reply(body)

    runner, url = await serve_stub(generate)
    try:
        async with SGLangBackend([url], max_retries=1, backoff_s=5.0,
                                 max_backoff_s=5.0) as backend:
            sglang_module.asyncio.sleep = recorded_sleep
            res = await backend.generate([1, 2, 3], SamplingParams(max_new_tokens=1))
            assert res.output_ids == [7] and calls["n"] == 2
            assert backoffs == []  # no back-off sleep
            assert backend.servers[0].healthy and backend.servers[0].failures == 0

            calls["n"], drop = 0, {1, 2}  # dropped twice: the second waits out the back-off
            res = await backend.generate([1, 2, 3], SamplingParams(max_new_tokens=1))
            assert res.output_ids == [7] and calls["n"] == 3
            assert len(backoffs) == 1 and 0.8 * 5.0 <= backoffs[0] <= 1.2 * 5.0, backoffs
    finally:
        sglang_module.asyncio.sleep = real_sleep
        await runner.cleanup()
