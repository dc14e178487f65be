"""The SGLang-compatible HTTP server: /generate, admin endpoints, errors, OpenAI client."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import aiohttp
import jax
import numpy as np
import pytest

from agentrl_jax.models.safetensors_io import save_hf_directory
from agentrl_jax.rollout.servers import app as server_app
from agentrl_jax.rollout.servers.protocol import INLINE_BYTES
from rollout_helpers import (TINY, byte_tokenizer, make_engine, random_prompt, reference_greedy,
                             smollm2_engine, start_server, tiny_model)

GREEDY = {"temperature": 0.0}


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=0)


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer(TINY.vocab_size)


@pytest.fixture(scope="module")
def served(model, tokenizer, tmp_path_factory):
    engine = make_engine(model, tokenizer, max_queue=64)
    # weights load only from allowed directories: here every test's tmp_path
    thread = start_server(engine, model_path="tiny-random", max_body_bytes=256 * 1024,
                          weights_dirs=[str(tmp_path_factory.getbasetemp())])
    yield thread.url, engine, thread.server
    thread.stop()
    engine.close()


@pytest.fixture
async def http():
    async with aiohttp.ClientSession() as session:
        yield session


async def post(http, url, body=None, raw: bytes | None = None):
    data = raw if raw is not None else json.dumps(body).encode()
    async with http.post(url, data=data, headers={"Content-Type": "application/json"}) as r:
        text = await r.text()
        try:
            return r.status, json.loads(text), r.headers
        except ValueError:
            return r.status, text, r.headers


async def get(http, url):
    async with http.get(url) as r:
        text = await r.text()
        try:
            return r.status, json.loads(text)
        except ValueError:
            return r.status, text


async def test_generate_input_ids_with_logprobs(served, http, model):
    url, _, _ = served
    prompt = random_prompt(np.random.default_rng(0), 11)
    status, out, _ = await post(http, url + "/generate", {
        "input_ids": prompt, "return_logprob": True, "return_text_in_logprobs": True,
        "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True},
        "rid": "req-1"})
    assert status == 200, out
    assert out["output_ids"] == reference_greedy(model, prompt, 8)
    meta = out["meta_info"]
    assert meta["id"] == "req-1" and meta["prompt_tokens"] == 11
    assert meta["completion_tokens"] == 8 and meta["cached_tokens"] == 0
    assert meta["finish_reason"] == {"type": "length", "length": 8}
    triples = meta["output_token_logprobs"]
    assert [t[1] for t in triples] == out["output_ids"]
    assert all(isinstance(t[0], float) and t[0] <= 0 and isinstance(t[2], str) for t in triples)
    assert isinstance(out["text"], str)


async def test_generate_text_batch_n_and_session(served, http, tokenizer):
    url, _, _ = served
    status, out, _ = await post(http, url + "/generate", {
        "text": ["hello", "world!"], "sampling_params": {"max_new_tokens": 3, "n": 2}})
    assert status == 200 and isinstance(out, list) and len(out) == 4, out
    assert all(len(o["output_ids"]) <= 3 for o in out)
    assert "output_token_logprobs" not in out[0]["meta_info"]
    status, out, _ = await post(http, url + "/generate", {
        "input_ids": [[5, 6, 7], [8, 9]], "sampling_params": [{"max_new_tokens": 2},
                                                              {"max_new_tokens": 1}]})
    assert status == 200 and [len(o["output_ids"]) for o in out] == [2, 1]
    # Prefix reuse across turns of a session.
    prompt = random_prompt(np.random.default_rng(1), 20)
    sp = {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True}
    _, first, _ = await post(http, url + "/generate", {"input_ids": prompt, "session_id": "ep",
                                                       "sampling_params": sp})
    turn2 = prompt + first["output_ids"] + [10, 11, 12]
    _, second, _ = await post(http, url + "/generate", {"input_ids": turn2, "session_id": "ep",
                                                        "sampling_params": sp})
    assert second["meta_info"]["cached_tokens"] == len(prompt) + 5 - 1
    # Stop strings are honoured (finish_reason matched is the string).
    status, out, _ = await post(http, url + "/generate", {
        "text": "abc", "sampling_params": {"max_new_tokens": 4, "stop": "zzz"}})
    assert status == 200


@pytest.mark.parametrize("body,fragment", [
    ({"input_ids": "abc"}, "input_ids"),
    ({"input_ids": []}, "input_ids"),
    ({"input_ids": [1, 2], "text": "x"}, "exactly one"),
    ({}, "exactly one"),
    ({"input_ids": [1, TINY.vocab_size + 5]}, "vocabulary"),
    ({"input_ids": [3] * 200}, "context length"),
    ({"input_ids": [1], "bogus": 1}, "unknown field"),
    ({"input_ids": [1], "sampling_params": {"temprature": 1}}, "unknown field"),
    ({"input_ids": [1], "sampling_params": {"temperature": "hot"}}, "temperature"),
    ({"input_ids": [1], "sampling_params": {"max_new_tokens": -3}}, "max_new_tokens"),
    ({"input_ids": [1], "sampling_params": {"frequency_penalty": 0.5}}, "not supported"),
    ({"input_ids": [1], "sampling_params": []}, "entries"),
    ({"input_ids": [1], "stream": True}, "not supported"),
    ({"input_ids": [1], "return_logprob": "yes"}, "boolean"),
    ({"input_ids": [[1], [2]], "rid": "one"}, "rid"),
])
async def test_generate_bad_requests(served, http, body, fragment):
    url, _, _ = served
    status, out, _ = await post(http, url + "/generate", body)
    assert status == 400, out
    assert fragment in out["error"]["message"], out


async def test_http_errors(served, http):
    url, _, _ = served
    status, out, _ = await post(http, url + "/generate", raw=b"{not json")
    assert status == 400 and "JSON" in out["error"]["message"]
    status, out, _ = await post(http, url + "/generate", raw=b"[1, 2]")
    assert status == 400 and "object" in out["error"]["message"]
    status, out, _ = await post(http, url + "/generate", raw=b"")
    assert status == 400
    status, out, _ = await post(http, url + "/generate", {"input_ids": [1] * 100_000})
    assert status == 413 and "too large" in out["error"]["message"]
    status, out = await get(http, url + "/no/such/route")
    assert status == 404 and "error" in out
    status, out = await get(http, url + "/generate")
    assert status == 405
    status, out, _ = await post(http, url + "/update_weights_from_disk", {"model_path": 3})
    assert status == 400


async def test_admin_endpoints(served, http):
    url, engine, _ = served
    assert (await get(http, url + "/health"))[0] == 200
    assert (await get(http, url + "/health_generate"))[0] == 200
    status, info = await get(http, url + "/get_model_info")
    assert status == 200 and info["is_generation"] is True
    assert info["model_path"] == "tiny-random" and "tokenizer_path" in info
    status, info = await get(http, url + "/get_server_info")
    assert status == 200 and info["max_running_requests"] == engine.config.max_batch
    assert "SGLang 0.5" in info["version"]
    status, text, _ = await post(http, url + "/flush_cache", {})
    assert status == 200
    status, models = await get(http, url + "/v1/models")
    assert status == 200 and models["data"][0]["id"] == "tiny-random"
    # SGLang's memory saver, for the KV cache only: frees it (a second time: nothing left),
    # re-allocates it; other tags and bad bodies are 400
    kv_bytes = sum(int(x.nbytes) for x in jax.tree.leaves(engine.kv.cache))
    status, out, _ = await post(http, url + "/release_memory_occupation", {"tags": ["kv_cache"]})
    assert status == 200 and out == {"success": True, "released": ["kv_cache"],
                                     "bytes": kv_bytes}
    assert engine.kv.cache is None
    status, out, _ = await post(http, url + "/release_memory_occupation", {})
    assert status == 200 and out["bytes"] == 0
    status, out, _ = await post(http, url + "/resume_memory_occupation", {"tags": None})
    assert status == 200 and out["bytes"] == kv_bytes and engine.kv.cache is not None
    for body, message in (({"tags": ["weights"]}, "releases only its KV cache"),
                          ({"tags": ["vram"]}, "unknown tag 'vram'"),
                          ({"tags": "kv_cache"}, "tags"), ({"nope": 1}, "nope")):
        status, out, _ = await post(http, url + "/release_memory_occupation", body)
        assert status == 400 and message in out["error"]["message"], (body, out)
    assert engine.kv.cache is not None


async def test_abort_and_pause(served, http):
    url, engine, _ = served
    status, _, _ = await post(http, url + "/pause_generation", {"mode": "in_place"})
    assert status == 200 and engine.paused
    task = asyncio.create_task(post(http, url + "/generate", {
        "input_ids": [5, 6, 7], "rid": "abort-me",
        "sampling_params": {"max_new_tokens": 50, "ignore_eos": True}}))
    for _ in range(200):
        if engine.inbox.is_running("abort-me"):
            break
        await asyncio.sleep(0.01)
    # a queued request: the KV cache cannot be released under it
    status, out, _ = await post(http, url + "/release_memory_occupation", {})
    assert status == 409 and "requests are running" in out["error"]["message"]
    assert engine.kv.cache is not None
    status, out, _ = await post(http, url + "/abort_request", {"rid": "abort-me"})
    assert status == 200 and out["aborted"] == 1
    status, out, _ = await task
    assert status == 200 and out["meta_info"]["finish_reason"]["type"] == "abort"
    status, _, _ = await post(http, url + "/continue_generation", {})
    assert status == 200 and not engine.paused
    status, out, _ = await post(http, url + "/pause_generation", {"mode": "sideways"})
    assert status == 400


async def test_overload_returns_503(model, tokenizer, http):
    engine = make_engine(model, tokenizer, max_queue=2)
    thread = start_server(engine)
    try:
        engine.pause("in_place")
        body = {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 2}}
        pending = [asyncio.create_task(post(http, thread.url + "/generate", body))
                   for _ in range(2)]
        for _ in range(200):
            if engine.load()["waiting"] >= 2:
                break
            await asyncio.sleep(0.01)
        status, out, headers = await post(http, thread.url + "/generate", body)
        assert status == 503 and "Retry-After" in headers, out
        engine.resume()
        assert all(r[0] == 200 for r in await asyncio.gather(*pending))
    finally:
        thread.stop()
        engine.close()


async def test_update_weights_from_disk_round_trip(served, http, model, tmp_path):
    url, engine, _ = served
    other = tiny_model(seed=1)
    prompt = random_prompt(np.random.default_rng(2), 9)
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 6, "temperature": 0,
                                                     "ignore_eos": True}}
    _, before, _ = await post(http, url + "/generate", body)
    assert before["output_ids"] == reference_greedy(model, prompt, 6)
    save_hf_directory(other, str(tmp_path / "new"))
    save_hf_directory(model, str(tmp_path / "orig"))
    status, out, _ = await post(http, url + "/update_weights_from_disk", {
        "model_path": str(tmp_path / "new"), "load_format": "auto", "weight_version": "v7"})
    assert status == 200 and out["success"] is True and out["num_paused_requests"] == 0, out
    _, after, _ = await post(http, url + "/generate", body)
    assert after["output_ids"] == reference_greedy(other, prompt, 6)
    assert after["meta_info"]["weight_version"] == "v7"
    status, out, _ = await post(http, url + "/update_weights_from_disk",
                                {"model_path": str(tmp_path / "missing")})
    assert status == 400 and out["success"] is False
    wrong = tiny_model(seed=0, cfg=TINY.replace(num_layers=1))
    save_hf_directory(wrong, str(tmp_path / "wrong"))
    status, out, _ = await post(http, url + "/update_weights_from_disk",
                                {"model_path": str(tmp_path / "wrong")})
    assert status == 400 and out["success"] is False and "num_layers" in out["message"]
    status, out, _ = await post(http, url + "/update_weights_from_disk",
                                {"model_path": str(tmp_path / "orig")})
    assert status == 200 and out["success"]
    _, restored, _ = await post(http, url + "/generate", body)
    assert restored["output_ids"] == before["output_ids"]


async def test_openai_client_tiny(served):
    openai = pytest.importorskip("openai")
    url, _, _ = served
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    try:
        chat = await client.chat.completions.create(
            model="tiny-random", messages=[{"role": "user", "content": "hi"}], max_tokens=5,
            temperature=0, logprobs=True)
        choice = chat.choices[0]
        assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
        assert choice.finish_reason in ("stop", "length")
        assert len(choice.logprobs.content) == chat.usage.completion_tokens
        comp = await client.completions.create(model="tiny-random", prompt="abc", max_tokens=4,
                                               temperature=0, n=2)
        assert len(comp.choices) == 2 and comp.usage.completion_tokens <= 8
        with pytest.raises(openai.BadRequestError):
            await client.chat.completions.create(
                model="tiny-random", messages=[{"role": "user", "content": "hi"}],
                stream=False, frequency_penalty=1.0)
        models = await client.models.list()
        assert models.data[0].id == "tiny-random"
    finally:
        await client.close()


async def test_openai_chat_smollm2():
    """The real SmolLM2 behind the server, through the official openai client."""
    openai = pytest.importorskip("openai")
    engine = smollm2_engine()
    thread = start_server(engine, served_model_name="smollm2")
    client = openai.AsyncOpenAI(base_url=thread.url + "/v1", api_key="none", max_retries=0)
    try:
        chat = await client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content":
                                        "What is the capital of France?"}],
            max_tokens=24, temperature=0)
        assert "Paris" in chat.choices[0].message.content
        assert chat.choices[0].finish_reason == "stop"
    finally:
        await client.close()
        thread.stop()


async def test_client_disconnect_aborts(served):
    """A client that goes away cancels its handler, which aborts the engine request."""
    url, engine, _ = served
    engine.pause("in_place")
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.5)) as session:
            with pytest.raises(asyncio.TimeoutError):
                await session.post(url + "/generate", json={
                    "input_ids": [5, 6], "rid": "gone", "sampling_params": {"max_new_tokens": 50}})
        for _ in range(300):
            if not engine.inbox.is_running("gone"):
                break
            await asyncio.sleep(0.01)
        assert not engine.inbox.is_running("gone")
    finally:
        engine.resume()
    status, out, _ = await post_json(url + "/generate", {"input_ids": [1] * 3, "sampling_params":
                                                         {"max_new_tokens": 1}})
    assert status == 200
    status, out, _ = await post_json(url + "/generate", raw=b"[" * 100_000 + b"]" * 100_000)
    assert status in (400, 413)


async def post_json(url, body=None, raw=None):
    async with aiohttp.ClientSession() as session:
        return await post(session, url, body, raw)


# ---------------------------------------------------------------------------- limits and access
def _checkpoint(model, path, config=None, index=None, tensors=True):
    """A HF directory of ``model`` at ``path``, then optionally a replaced config.json / index."""
    save_hf_directory(model, str(path))
    if config is not None:
        (path / "config.json").write_text(config)
    if index is not None:
        (path / "model.safetensors").rename(path / "shard.safetensors")
        (path / "model.safetensors.index.json").write_text(index)
    return str(path)


async def test_weights_load_only_from_allowed_dirs_and_errors_reveal_nothing(model, tokenizer,
                                                                              tmp_path, http):
    """Before: any client could load weights from any path, and the error said whether a
    path existed; now only --weights-dir directories (+ the model's own) are loadable."""
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    allowed.mkdir()
    _checkpoint(model, outside / "ckpt")
    (allowed / "escape").symlink_to(outside / "ckpt")
    engine = make_engine(model, tokenizer)
    thread = start_server(engine, weights_dirs=[str(allowed)])
    try:
        url = thread.url + "/update_weights_from_disk"
        answers = []
        for path in [outside / "ckpt", outside / "missing", "/etc", allowed / "escape",
                     allowed / ".." / "outside" / "ckpt"]:
            status, out, _ = await post(http, url, {"model_path": str(path)})
            assert status == 400 and out["success"] is False, (path, out)
            answers.append(out["message"].replace(repr(str(path)), "<path>"))
        assert len(set(answers)) == 1 and "--weights-dir" in answers[0], answers
        status, out, _ = await post(http, url, {"model_path": str(allowed / "missing")})
        assert status == 400 and "not a directory" in out["message"]  # inside: may say so
        status, out, _ = await post(http, url, {"model_path": _checkpoint(model, allowed / "ok")})
        assert status == 200 and out["success"], out
    finally:
        thread.stop()
        engine.close()


@pytest.mark.parametrize("config,index,fragment", [
    ("[1, 2]", None, "must be a JSON object"),
    ('{"model_type": "llama", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, '
     '"num_hidden_layers": 2, "num_attention_heads": 0}', None, "invalid model config"),
    ('{"model_type": "llama", "rope_scaling": [1], "vocab_size": 512, "hidden_size": 64, '
     '"intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}', None,
     "invalid model config"),
    (None, "[1, 2]", "must be a JSON object"),
    (None, "{not json", "not valid JSON"),
    (None, '{"weight_map": ["shard.safetensors"]}', "weight_map"),
    (None, '{"weight_map": {"model.embed_tokens.weight": 5}}', "file names"),
    (None, '{"weight_map": {"model.embed_tokens.weight": "/etc/passwd"}}', "relative path"),
    (None, '{"weight_map": {"model.embed_tokens.weight": "../outside.safetensors"}}',
     "relative path"),
    (None, '{"weight_map": {"model.embed_tokens.weight": "link.safetensors"}}', "outside"),
])
async def test_malformed_checkpoints_are_400(served, http, model, tmp_path, config, index,
                                             fragment):
    """Before: a config.json that is a list, a malformed index and index entries outside the
    checkpoint were 500s (or opened files anywhere); now 400 naming the defect."""
    url, _, _ = served
    (tmp_path / "outside.safetensors").write_bytes(b"x")
    path = _checkpoint(model, tmp_path / "ckpt", config=config, index=index)
    (tmp_path / "ckpt" / "link.safetensors").symlink_to(tmp_path / "outside.safetensors")
    status, out, _ = await post(http, url + "/update_weights_from_disk", {"model_path": path})
    assert status == 400 and out["success"] is False and fragment in out["message"], out


@pytest.mark.parametrize("route,body", [
    ("/abort_request", {"abort_all": "no"}),
    ("/abort_request", {"abort_all": 1}),
    ("/update_weights_from_disk", {"model_path": "CKPT", "flush_cache": "false"}),
    ("/update_weights_from_disk", {"model_path": "CKPT", "abort_all_requests": 0}),
    ("/continue_generation", {"torch_empty_cache": "yes"}),
    ("/pause_generation", {"mode": 3}),
    ("/generate", {"input_ids": [1], "stream": 0}),
])
async def test_booleans_are_strict(served, http, model, tmp_path, route, body):
    """Before: {"abort_all": "no"} aborted every request; only JSON true / false count."""
    url, engine, _ = served
    if body.get("model_path") == "CKPT":  # a loadable checkpoint: only the boolean is wrong
        body = {**body, "model_path": _checkpoint(model, tmp_path / "ckpt")}
    status, out, _ = await post(http, url + route, body)
    assert status == 400, out
    assert not engine.paused


async def test_lone_surrogates_are_400(served, http):
    """Before: {"text": "\\ud800"} was a 500 (the tokenizer cannot encode it)."""
    url, _, _ = served
    for route, raw in [("/generate", b'{"text": "\\ud800"}'),
                       ("/generate", b'{"text": ["ok", "a\\udfffb"]}'),
                       ("/v1/completions", b'{"prompt": "\\ud800", "max_tokens": 1}'),
                       ("/v1/chat/completions",
                        b'{"messages": [{"role": "user", "content": "\\ud800"}]}')]:
        status, out, _ = await post(http, url + route, raw=raw)
        assert status == 400, (route, out)


async def test_client_chat_templates_refused_by_default(served, http):
    """Before: a client Jinja template was rendered on the event loop."""
    url, _, _ = served
    msgs = [{"role": "user", "content": "hi"}]
    for kwargs, fragment in [({"chat_template": "{{ messages }}"}, "allow-request-chat-template"),
                             ({"tokenize": True}, "cannot be set"),
                             ({"return_dict": True}, "cannot be set")]:
        status, out, _ = await post(http, url + "/v1/chat/completions", {
            "messages": msgs, "max_tokens": 1, "chat_template_kwargs": kwargs})
        assert status == 400 and fragment in out["error"]["message"], out


async def test_client_chat_template_renders_off_loop_within_a_deadline(model, tokenizer, http,
                                                                       startup_heap_frozen):
    engine = make_engine(model, tokenizer)
    thread = start_server(engine, allow_request_chat_template=True, chat_template_timeout_s=1.0)
    url = thread.url + "/v1/chat/completions"
    msgs = [{"role": "user", "content": "hi"}]
    try:
        good = "{% for m in messages %}{{ m['content'] }}{% endfor %}|{{ eos_token }}"
        status, out, _ = await post(http, url, {"messages": msgs, "max_tokens": 2,
                                                "chat_template_kwargs": {"chat_template": good}})
        assert status == 200, out
        assert out["usage"]["prompt_tokens"] == len(tokenizer.encode("hi|<|im_end|>"))
        slow = ("{% for a in range(100000) %}{% for b in range(100000) %}{{ '' }}"
                "{% endfor %}{% endfor %}")
        request = asyncio.create_task(post(http, url, {
            "messages": msgs, "chat_template_kwargs": {"chat_template": slow}}))
        latencies = []
        while not request.done():  # the loop keeps serving while the template spins
            started = time.perf_counter()
            assert (await get(http, thread.url + "/health"))[0] == 200
            latencies.append(time.perf_counter() - started)
            await asyncio.sleep(0.05)
        status, out, _ = await request
        assert status == 400 and "within 1 s" in out["error"]["message"], out
        assert max(latencies) < 0.5, latencies
        assert thread.server.template_sandbox.kills == 1
        status, out, _ = await post(http, url, {"messages": msgs, "max_tokens": 1,
                                                "chat_template_kwargs": {"chat_template": good}})
        assert status == 200, out  # a fresh renderer took over
    finally:
        thread.stop()
        engine.close()


async def test_large_bodies_are_bounded_and_do_not_stall_the_loop(model, tokenizer, http,
                                                                  startup_heap_frozen):
    """Before: a 15 MB body (and, longer, a 7 MB text) blocked /health (docs/RELIABILITY.md).

    The behaviour itself, not a latency: the parsing and the validation of each large body
    wait (on their worker thread) until a /health request sent after they began has been
    answered. Were they on the event loop, that answer could not come and they would give up
    (an assertion inside the request: a 500, not the expected 400)."""
    engine = make_engine(model, tokenizer, max_queue=64)
    thread = start_server(engine)  # the default body limit
    bodies = [(json.dumps({"input_ids": [5] * 2_300_000}).encode(), 400),
              (json.dumps({"text": "ab " * 2_300_000}).encode(), 400),
              (json.dumps({"input_ids": [[5] * 50] * 45_000}).encode(), 400),
              (json.dumps({"input_ids": [5] * 5_000_000}).encode(), 413)]
    working = threading.Event()  # a gated piece of a large request's work has begun
    served = threading.Event()  # a /health sent after that was answered
    gated: list[str] = []

    def gate(name, fn):
        def wrapped(*args):
            if name == "parse" and len(args[0]) <= INLINE_BYTES:
                return fn(*args)  # small bodies are parsed inline
            try:
                asyncio.get_running_loop()
                on_loop = True
            except RuntimeError:  # a worker thread has no running loop
                on_loop = False
            if on_loop:
                gated.append(f"{name} on the event loop")
                return fn(*args)
            served.clear()
            working.set()
            answered = served.wait(60)
            working.clear()
            gated.append(name)
            assert answered, f"no /health answer while the {name} of a large body ran"
            return fn(*args)
        return wrapped

    server = thread.server
    real_parse = server_app.parse_json_object
    server_app.parse_json_object = gate("parse", real_parse)
    server._plan_generate = gate("validation", server._plan_generate)
    done = asyncio.Event()
    answers = 0

    async def probe():
        nonlocal answers
        async with aiohttp.ClientSession() as probe_http:
            while not done.is_set():
                during = working.is_set()  # this request is sent while the work waits
                async with probe_http.get(thread.url + "/health") as response:
                    assert response.status == 200
                answers += 1
                if during:
                    served.set()
                await asyncio.sleep(0.01)

    prober = asyncio.create_task(probe())
    try:
        for raw, expected in bodies:
            status, out, _ = await post(http, thread.url + "/generate", raw=raw)
            assert status == expected, out
        assert "too large" in out["error"]["message"] and "8388608" in out["error"]["message"]
    finally:
        server_app.parse_json_object = real_parse
        done.set()
        await prober
        thread.stop()
        engine.close()
    # three bodies parsed and validated off the loop; the 413 is refused before it is read
    assert gated.count("parse") == 3 and gated.count("validation") >= 2, gated
    assert not [g for g in gated if "event loop" in g], gated
    assert answers >= 3


async def _max_health_latency(url: str, until: asyncio.Future) -> float:
    """Poll /health every 10 ms until ``until`` is done; the slowest answer in seconds."""
    latencies = []
    async with aiohttp.ClientSession() as probe_http:
        while not until.done():
            started = time.perf_counter()
            async with probe_http.get(url + "/health") as response:
                assert response.status == 200
            latencies.append(time.perf_counter() - started)
            await asyncio.sleep(0.01)
    assert len(latencies) >= 3, latencies
    return max(latencies)


async def test_a_large_valid_batch_does_not_stall_the_loop(model, tokenizer, http,
                                                           startup_heap_frozen):
    """4,096 prompts of 127 ids (1.6 MB) held /health (docs/RELIABILITY.md) while validated
    and submitted (and two tasks made per prompt) on the event loop; here 2,048."""
    engine = make_engine(model, tokenizer, max_queue=4096)
    thread = start_server(engine)
    engine.pause("in_place")
    try:
        raw = json.dumps({"input_ids": [[5] * 127] * 2048,
                          "sampling_params": {"max_new_tokens": 1}}).encode()
        request = asyncio.ensure_future(post(http, thread.url + "/generate", raw=raw))
        queued = asyncio.get_running_loop().create_future()

        async def watch_queue():
            for _ in range(1000):
                if engine.load()["waiting"] == 2048 or request.done():
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)
            queued.set_result(None)

        watcher = asyncio.ensure_future(watch_queue())
        slowest = await _max_health_latency(thread.url, queued)
        await watcher
        assert engine.load()["waiting"] == 2048 and not request.done()
        assert slowest < 0.25, slowest
        engine.abort_all()
        engine.resume()
        status, out, _ = await request
        assert status == 200 and len(out) == 2048
        assert {o["meta_info"]["finish_reason"]["type"] for o in out} == {"abort"}
    finally:
        engine.resume()
        thread.stop()
        engine.close()


async def test_api_key(served, model, tokenizer):
    """Before: any client could pause or abort; with --api-key only key holders can."""
    _, engine, _ = served
    thread = start_server(engine, api_key="sesame")
    try:
        async with aiohttp.ClientSession() as anon:
            assert (await get(anon, thread.url + "/health"))[0] == 200  # open, as in SGLang
            for route in ("/pause_generation", "/abort_request", "/generate",
                          "/update_weights_from_disk"):
                status, out, headers = await post(anon, thread.url + route, {"abort_all": True})
                assert status == 401 and headers.get("WWW-Authenticate") == "Bearer", out
            assert (await get(anon, thread.url + "/get_server_info"))[0] == 401
        async with aiohttp.ClientSession(headers={"Authorization": "Bearer wrong"}) as bad:
            assert (await post(bad, thread.url + "/generate", {"input_ids": [1]}))[0] == 401
        async with aiohttp.ClientSession(headers={"Authorization": "Bearer sesame"}) as ok:
            status, out, _ = await post(ok, thread.url + "/generate", {
                "input_ids": [5, 6], "sampling_params": {"max_new_tokens": 1}})
            assert status == 200, out
        assert not engine.paused
    finally:
        thread.stop()


def test_non_loopback_without_api_key_refuses_to_start(served):
    from agentrl_jax.rollout.servers.app import RolloutServer
    from agentrl_jax.rollout.servers.server import ServerThread, main

    _, engine, _ = served
    with pytest.raises(ValueError, match="API key"):
        ServerThread(RolloutServer(engine), host="0.0.0.0").start()
    with pytest.raises(SystemExit, match="API key"):
        main(["--host", "0.0.0.0", "--model", "/nonexistent"])  # refused before loading


async def test_slow_requests_time_out_and_connections_are_limited(served):
    """Before: connections that sent headers and 8 bytes of body stayed open forever."""
    _, engine, _ = served
    thread = start_server(engine, read_timeout=0.5, max_connections=6)
    port = int(thread.url.rsplit(":", 1)[1])
    head = (b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{\"input_")
    try:
        slow = [await asyncio.open_connection("127.0.0.1", port) for _ in range(4)]
        for _, writer in slow[:2]:
            writer.write(head)          # headers, then 8 bytes of a 100-byte body
        for _, writer in slow[2:]:
            writer.write(head[:20])     # half a request line
        extra = [await asyncio.open_connection("127.0.0.1", port) for _ in range(4)]
        refused = await asyncio.gather(*(asyncio.wait_for(r.read(), 5) for r, _ in extra[2:]))
        assert all(a.startswith(b"HTTP/1.1 503") for a in refused), refused
        answers = await asyncio.gather(*(asyncio.wait_for(r.read(), 5) for r, _ in slow))
        assert answers[0].startswith(b"HTTP/1.1 408") and answers[1].startswith(b"HTTP/1.1 408")
        assert answers[2] == answers[3] == b""  # closed without an answer
        for _, writer in slow + extra:
            writer.close()
        async with aiohttp.ClientSession() as http:  # slots are free again
            assert (await get(http, thread.url + "/health"))[0] == 200
    finally:
        thread.stop()
