"""Declared request models of the rollout server (agentrl_jax/rollout/servers/api_models.py).

Every declared constraint is exercised with a bad value through the running server: the
answer is a 400 in the server's JSON error shape whose message names the field. Valid bodies
map to the hand-computed ``SamplingParams`` / prompts, SGLang fields this server ignores are
still accepted, and a prompt longer than the context is refused by its length before its
elements are read.
"""

from __future__ import annotations

import json

import aiohttp
import pytest

from agentrl_jax.rollout.servers.api_fields import validate_request
from agentrl_jax.rollout.servers.api_models import (ChatCompletionRequest, CompletionRequest,
                                                    GenerateRequest, SamplingParamsRequest)
from agentrl_jax.rollout.contract import InvalidRequestError, SamplingParams
from rollout_helpers import TINY, byte_tokenizer, make_engine, start_server, tiny_model

MAX_LENGTH = 128  # rollout_helpers.ENGINE_KW
MAX_QUEUE = 64
CONTEXT = {"max_length": MAX_LENGTH, "max_queue": MAX_QUEUE}
IDS = [5, 6, 7]
MSGS = [{"role": "user", "content": "hi"}]

# (route, body, text the message must contain: the field's path)
GENERATE = [
    ({"input_ids": "abc"}, "input_ids"),
    ({"input_ids": []}, "input_ids"),
    ({"input_ids": [1, 2.5]}, "input_ids[1]"),
    ({"input_ids": [1, True]}, "input_ids[1]"),
    ({"input_ids": [[1], [2, "x"]]}, "input_ids[1][1]"),
    ({"input_ids": [[1], 2]}, "input_ids[1]"),
    ({"input_ids": [[1], []]}, "input_ids[1]"),
    ({"input_ids": [3] * MAX_LENGTH}, "input_ids"),
    ({"input_ids": [[3]] * (MAX_QUEUE + 1)}, "input_ids"),
    ({"text": 5}, "text"),
    ({"text": []}, "text"),
    ({"text": ["a", 3]}, "text[1]"),
    ({"text": "a", "input_ids": IDS}, "input_ids"),
    ({}, "input_ids"),
    ({"input_ids": IDS, "return_logprob": "yes"}, "return_logprob"),
    ({"input_ids": IDS, "return_logprob": 1}, "return_logprob"),
    ({"input_ids": IDS, "return_logprob": None}, "return_logprob"),
    ({"input_ids": IDS, "return_text_in_logprobs": 1}, "return_text_in_logprobs"),
    ({"input_ids": IDS, "rid": 5}, "rid"),
    ({"input_ids": [[1], [2]], "rid": "one"}, "rid"),
    ({"input_ids": [[1], [2]], "rid": ["a"]}, "rid"),
    ({"input_ids": [[1], [2]], "rid": ["a", 3]}, "rid[1]"),
    ({"input_ids": IDS, "session_id": 7}, "session_id"),
    ({"input_ids": IDS, "session_params": {"id": 7}}, "session_id"),
    ({"input_ids": IDS, "return_logprob": True, "logprob_start_len": 0}, "logprob_start_len"),
    ({"input_ids": IDS, "sampling_params": "x"}, "sampling_params"),
    ({"input_ids": [[1], [2]], "sampling_params": [{}]}, "sampling_params"),
    ({"input_ids": [[1], [2]], "sampling_params": [{}, {"n": 0}]}, "sampling_params[1].n"),
    ({"input_ids": IDS, "stream": True}, "stream"),
    ({"input_ids": IDS, "stream": 0}, "stream"),
    ({"input_ids": IDS, "top_logprobs_num": 2}, "top_logprobs_num"),
    ({"input_ids": IDS, "token_ids_logprob": [1]}, "token_ids_logprob"),
    ({"input_ids": IDS, "lora_path": "x"}, "lora_path"),
    ({"input_ids": IDS, "return_hidden_states": 1}, "return_hidden_states"),
    ({"input_ids": IDS, "image_data": "x"}, "image_data"),
    ({"input_ids": IDS, "bootstrap_port": 1}, "bootstrap_port"),
    ({"input_ids": IDS, "return_routed_experts": True}, "return_routed_experts"),
    ({"input_ids": IDS, "bogus": 1}, "bogus"),
    ({"input_ids": IDS, "sampling_params": {"temprature": 1}},
     "sampling_params: unknown field(s) ['temprature']"),
]
SAMPLING = [  # inside /generate's sampling_params
    ({"max_new_tokens": -1}, "max_new_tokens"), ({"max_new_tokens": 1.5}, "max_new_tokens"),
    ({"max_new_tokens": True}, "max_new_tokens"), ({"temperature": -0.1}, "temperature"),
    ({"temperature": "hot"}, "temperature"), ({"temperature": True}, "temperature"),
    ({"top_p": 0}, "top_p"), ({"top_p": 1.5}, "top_p"), ({"top_k": 0}, "top_k"),
    ({"top_k": -2}, "top_k"), ({"top_k": 1.5}, "top_k"), ({"min_p": -0.1}, "min_p"),
    ({"min_p": 1.1}, "min_p"), ({"stop": 3}, "stop"), ({"stop": ""}, "stop"),
    ({"stop": ["a", ""]}, "stop[1]"), ({"stop": ["a", 1]}, "stop[1]"),
    ({"stop_token_ids": "x"}, "stop_token_ids"), ({"stop_token_ids": [1.5]}, "stop_token_ids[0]"),
    ({"stop_token_ids": [True]}, "stop_token_ids[0]"), ({"ignore_eos": "no"}, "ignore_eos"),
    ({"ignore_eos": 0}, "ignore_eos"), ({"skip_special_tokens": 1}, "skip_special_tokens"),
    ({"no_stop_trim": "false"}, "no_stop_trim"), ({"n": 0}, "n"), ({"n": 1.5}, "n"),
    ({"n": True}, "n"), ({"seed": -1}, "seed"), ({"seed": 2**63}, "seed"), ({"seed": 1.5}, "seed"),
    ({"seed": True}, "seed"), ({"sampling_seed": -1}, "sampling_seed"),
    ({"frequency_penalty": 0.5}, "frequency_penalty"),
    ({"presence_penalty": 1}, "presence_penalty"),
    ({"repetition_penalty": 1.2}, "repetition_penalty"), ({"min_new_tokens": 3}, "min_new_tokens"),
    ({"json_schema": "{}"}, "json_schema"), ({"regex": "a"}, "regex"), ({"ebnf": "a"}, "ebnf"),
    ({"structural_tag": "a"}, "structural_tag"), ({"stop_regex": "a"}, "stop_regex"),
    ({"custom_params": {"a": 1}}, "custom_params"), ({"logit_bias": {"1": 2}}, "logit_bias"),
    ({"spaces_between_special_tokens": False}, "spaces_between_special_tokens"),
    ({"spaces_between_special_tokens": 1}, "spaces_between_special_tokens"),
    ({"stream_interval": 1}, "stream_interval"),
]
OPENAI = [  # fields of both OpenAI bodies
    ({"max_tokens": -1}, "max_tokens"), ({"max_tokens": 1.5}, "max_tokens"), ({"n": 0}, "n"),
    ({"n": None}, "n"), ({"n": True}, "n"), ({"model": 3}, "model"), ({"model": None}, "model"),
    ({"temperature": -1}, "temperature"), ({"top_p": 2}, "top_p"), ({"seed": -1}, "seed"),
    ({"stop": 3}, "stop"), ({"top_k": 0}, "top_k"), ({"min_p": 2}, "min_p"),
    ({"ignore_eos": "y"}, "ignore_eos"), ({"stop_token_ids": ["a"]}, "stop_token_ids[0]"),
    ({"skip_special_tokens": 1}, "skip_special_tokens"), ({"no_stop_trim": 1}, "no_stop_trim"),
    ({"session_id": 3}, "session_id"), ({"stream": True}, "stream"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"frequency_penalty": 1}, "frequency_penalty"),
    ({"presence_penalty": 1}, "presence_penalty"),
    ({"logit_bias": {"1": 1}}, "logit_bias"), ({"repetition_penalty": 2}, "repetition_penalty"),
    ({"min_tokens": 1}, "min_tokens"), ({"bogus": 1}, "bogus"),
]
COMPLETIONS = [
    ({}, "prompt"), ({"prompt": None}, "prompt"), ({"prompt": 5}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [1, "a"]}, "prompt[1]"), ({"prompt": [3] * MAX_LENGTH}, "prompt"),
    ({"prompt": [[1], []]}, "prompt[1]"), ({"prompt": ["a"] * (MAX_QUEUE + 1)}, "prompt"),
    ({"prompt": "a", "logprobs": 5}, "logprobs"), ({"prompt": "a", "logprobs": True}, "logprobs"),
    ({"prompt": "a", "best_of": 2}, "best_of"), ({"prompt": "a", "best_of": True}, "best_of"),
    ({"prompt": "a", "echo": True}, "echo"), ({"prompt": "a", "suffix": "x"}, "suffix"),
] + [({"prompt": "a", **body}, field) for body, field in OPENAI]
CHAT = [
    ({}, "messages"), ({"messages": []}, "messages"), ({"messages": "x"}, "messages"),
    ({"messages": [{"content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": 3, "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]},
     "messages[0].content[0].text"),
    ({"messages": MSGS, "max_completion_tokens": -1}, "max_completion_tokens"),
    ({"messages": MSGS, "logprobs": 1}, "logprobs"),
    ({"messages": MSGS, "logprobs": None}, "logprobs"),
    ({"messages": MSGS, "rid": 3}, "rid"),
    ({"messages": MSGS, "response_format": {"type": "json_object"}}, "response_format"),
    ({"messages": MSGS, "chat_template_kwargs": "x"}, "chat_template_kwargs"),
    ({"messages": MSGS, "chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs"),
    ({"messages": MSGS, "chat_template_kwargs": {"chat_template": "{{ 1 }}"}}, "chat_template"),
    ({"messages": MSGS, "top_logprobs": 2}, "top_logprobs"),
    ({"messages": MSGS, "tools": [{"type": "function"}]}, "tools"),
    ({"messages": MSGS, "tool_choice": "auto"}, "tool_choice"),
    ({"messages": MSGS, "parallel_tool_calls": True}, "parallel_tool_calls"),
    ({"messages": MSGS, "reasoning_effort": "low"}, "reasoning_effort"),
    ({"messages": MSGS, "continue_final_message": True}, "continue_final_message"),
] + [({"messages": MSGS, **body}, field) for body, field in OPENAI]
ADMIN = [
    ("/update_weights_from_disk", {}, "model_path"),
    ("/update_weights_from_disk", {"model_path": 3}, "model_path"),
    ("/update_weights_from_disk", {"model_path": ""}, "model_path"),
    *[("/update_weights_from_disk", {"model_path": "/x", field: value}, field) for field, value in [
        ("load_format", "pt"), ("abort_all_requests", 0), ("weight_version", 1.5),
        ("weight_version", True), ("flush_cache", "false"), ("is_async", 1),
        ("torch_empty_cache", "y"), ("keep_pause", 0), ("recapture_cuda_graph", 1),
        ("token_step", 1.5), ("token_step", True), ("manual_load_format", 3), ("bogus", 1)]],
    ("/abort_request", {}, "rid"), ("/abort_request", {"rid": 5}, "rid"),
    ("/abort_request", {"rid": ""}, "rid"), ("/abort_request", {"abort_all": "no"}, "abort_all"),
    ("/abort_request", {"abort_all": 1}, "abort_all"),
    ("/abort_request", {"rid": "r", "abort_message": 3}, "abort_message"),
    ("/abort_request", {"rid": "r", "bogus": 1}, "bogus"),
    ("/close_session", {}, "session_id"), ("/close_session", {"session_id": 5}, "session_id"),
    ("/close_session", {"session_id": ""}, "session_id"),
    ("/close_session", {"session_id": "ep-1", "bogus": 1}, "bogus"),
    ("/pause_generation", {"mode": "sideways"}, "mode"), ("/pause_generation", {"mode": 3}, "mode"),
    ("/continue_generation", {"torch_empty_cache": "yes"}, "torch_empty_cache"),
]
CASES = ([("/generate", b, f) for b, f in GENERATE]
         + [("/generate", {"input_ids": IDS, "sampling_params": b}, f"sampling_params.{f}")
            for b, f in SAMPLING]
         + [("/v1/completions", b, f) for b, f in COMPLETIONS]
         + [("/v1/chat/completions", b, f) for b, f in CHAT] + ADMIN)


@pytest.fixture(scope="module")
def served():
    engine = make_engine(tiny_model(seed=0), byte_tokenizer(TINY.vocab_size), max_queue=MAX_QUEUE)
    thread = start_server(engine, model_path="tiny-random")
    yield thread.url, engine
    thread.stop()
    engine.close()


@pytest.mark.parametrize("route,body,field", CASES,
                         ids=[f"{r}:{json.dumps(b)[:60]}" for r, b, _ in CASES])
async def test_each_constraint_is_a_400_naming_the_field(served, route, body, field):
    url, engine = served
    async with aiohttp.ClientSession() as http:
        async with http.post(url + route, json=body) as response:
            status, out = response.status, await response.json()
    assert status == 400, out
    message = out["error"]["message"]
    assert out == {"error": {"message": message, "type": "invalid_request_error", "code": 400},
                   "object": "error", "message": message}
    assert message.startswith(route + ": ") and field in message, message
    assert not engine.paused


def test_unknown_fields_are_listed_with_the_supported_ones():
    with pytest.raises(InvalidRequestError) as e:
        validate_request(GenerateRequest, {"input_ids": IDS, "zz": 1, "aa": 2}, "/generate")
    message = str(e.value)
    assert "unknown field(s) ['aa', 'zz']; supported fields: [" in message
    assert "'input_ids'" in message and "'sampling_params'" in message


def test_several_errors_are_all_named():
    with pytest.raises(InvalidRequestError) as e:
        validate_request(GenerateRequest, {"input_ids": IDS, "sampling_params": {
            "temperature": -1, "top_p": 2, "n": 0, "seed": -1}}, "/generate", CONTEXT)
    message = str(e.value)
    assert "sampling_params.temperature" in message and "sampling_params.top_p" in message
    assert "sampling_params.n" in message and "and 1 more error(s)" in message


def test_length_is_checked_before_the_elements():
    """A prompt of max_length non-integers is refused for its length (elements not read)."""
    for body in ({"input_ids": ["x"] * MAX_LENGTH}, {"input_ids": [["x"] * 2] * (MAX_QUEUE + 1)}):
        with pytest.raises(InvalidRequestError) as e:
            validate_request(GenerateRequest, body, "/generate", CONTEXT)
        assert "valid integer" not in str(e.value)
        assert "context length 128" in str(e.value) or "admission queue (64" in str(e.value)
    ok = validate_request(GenerateRequest, {"input_ids": [3] * (MAX_LENGTH - 1)}, "/generate",
                          CONTEXT)
    assert ok.token_ids() == [[3] * (MAX_LENGTH - 1)]


def test_lone_surrogates_in_text_are_refused():
    for body, field in [({"text": "\ud800"}, "text"), ({"text": ["ok", "a\udfffb"]}, "text[1]")]:
        with pytest.raises(InvalidRequestError, match="lone surrogate") as e:
            validate_request(GenerateRequest, body, "/generate", CONTEXT)
        assert f"/generate: {field}: " in str(e.value)


def test_sampling_params_map_to_hand_computed_values():
    def sp(raw):
        return validate_request(SamplingParamsRequest, raw, "sampling_params").to_sampling()

    assert sp({}) == SamplingParams()
    null = {k: None for k in SamplingParamsRequest.model_fields}  # null = the default
    assert sp(null) == SamplingParams()
    got = sp({"temperature": 1, "top_p": 1, "min_p": 0, "seed": 5, "sampling_seed": 9,
              "stop": "x", "stop_token_ids": [2], "max_new_tokens": 7, "top_k": 3, "n": 2,
              "ignore_eos": True, "skip_special_tokens": False, "no_stop_trim": True})
    assert got == SamplingParams(max_new_tokens=7, temperature=1.0, top_p=1.0, top_k=3,
                                 min_p=0.0, stop=["x"], stop_token_ids=[2], ignore_eos=True,
                                 n=2, seed=5, skip_special_tokens=False, no_stop_trim=True)
    assert type(got.temperature) is float and type(got.top_p) is float
    assert sp({"sampling_seed": 9, "stop": []}) == SamplingParams(seed=9, stop=None)
    # unimplemented SGLang fields at their defaults are accepted
    assert sp({"frequency_penalty": 0, "presence_penalty": 0.0, "repetition_penalty": 1,
               "min_new_tokens": 0, "regex": None, "spaces_between_special_tokens": True}) == \
        SamplingParams()


def test_generate_bodies_that_stay_accepted():
    req = validate_request(GenerateRequest, {
        "input_ids": [[5, 6], [7]], "rid": ["a", "b"], "sampling_params": [{"n": 2}, {}],
        "session_params": {"id": ["s1", "s2"]}, "stream": False, "top_logprobs_num": 0,
        "lora_path": None, "return_hidden_states": False, "priority": "high",
        "log_metrics": 5, "extra_key": [1], "data_parallel_rank": None, "no_logs": "x",
        "logprob_start_len": 3}, "/generate", CONTEXT)
    assert req.batched and req.count == 2 and req.token_ids() == [[5, 6], [7]]
    assert req.per_prompt("rid") == ["a", "b"] and req.per_prompt("session_id") == ["s1", "s2"]
    assert [s.n for s in req.samplings()] == [2, 1]
    req = validate_request(GenerateRequest, {"text": "hi", "session_id": "s", "rid": None,
                                             "return_logprob": True, "logprob_start_len": -1},
                           "/generate", CONTEXT)
    assert not req.batched and req.texts() == ["hi"] and req.per_prompt("session_id") == ["s"]
    assert req.per_prompt("rid") == [None] and req.samplings() == [SamplingParams()]


def test_openai_bodies_that_stay_accepted():
    req = validate_request(CompletionRequest, {"prompt": [5, 6], "n": 2, "best_of": 2,
                                               "logprobs": 0, "rid": ["ignored"], "user": 3,
                                               "stream": False, "frequency_penalty": 0},
                           "/v1/completions", CONTEXT)
    assert req.prompts() == (None, [[5, 6]]) and req.max_tokens == 16
    assert req.sampling(req.max_tokens) == SamplingParams(max_new_tokens=16, n=2)
    req = validate_request(CompletionRequest, {"prompt": ["a", "b"], "max_tokens": None,
                                               "temperature": 0, "stop": ["x"]},
                           "/v1/completions", CONTEXT)
    assert req.prompts() == (["a", "b"], None)
    assert req.sampling(req.max_tokens) == SamplingParams(temperature=0.0, stop=["x"])
    msgs = [{"role": "system", "content": "s", "name": "ignored"},
            {"role": "user", "content": [{"type": "text", "text": "a"},
                                         {"type": "text", "text": "b"}]}]
    req = validate_request(ChatCompletionRequest, {
        "messages": msgs, "max_tokens": 5, "max_completion_tokens": 3, "logprobs": True,
        "response_format": {"type": "text"}, "chat_template_kwargs": {"enable_thinking": False},
        "tools": None, "top_logprobs": 0}, "/v1/chat/completions", CONTEXT)
    assert req.conversation() == [{"role": "system", "content": "s"},
                                  {"role": "user", "content": "ab"}]
    assert req.requested_max_tokens() == 3 and req.template() == ({"enable_thinking": False}, None)
    req = validate_request(ChatCompletionRequest, {"messages": msgs, "max_tokens": 5},
                           "/v1/chat/completions", CONTEXT)
    assert req.requested_max_tokens() == 5
    allowed = {**CONTEXT, "allow_request_chat_template": True}
    req = validate_request(ChatCompletionRequest, {"messages": msgs, "chat_template_kwargs": {
        "chat_template": "{{ 1 }}", "x": 1}}, "/v1/chat/completions", allowed)
    assert req.template() == ({"x": 1}, "{{ 1 }}")
