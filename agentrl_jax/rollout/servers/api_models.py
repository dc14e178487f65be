"""Declared request bodies of the rollout server (``server.py``), as pydantic v2 models.

One model per endpoint body: ``GenerateRequest`` (``/generate``, with ``SamplingParamsRequest``
for its ``sampling_params``), ``CompletionRequest`` (``/v1/completions``),
``ChatCompletionRequest`` (``/v1/chat/completions``), ``UpdateWeightsRequest``
(``/update_weights_from_disk``), ``AbortRequest``, ``PauseRequest``, ``ContinueRequest``. Field
names follow SGLang 0.5.x (``managers/io_struct.py``) and the OpenAI API.

Rules every model follows (the server's 4xx behaviour, docs/ROLLOUT.md section 3):

* Types are strict: booleans are JSON ``true`` / ``false`` only, integers are not floats or
  booleans, a number may be an integer (converted to float), strings are not coerced.
* Unknown fields are refused; the message lists them and the supported ones.
* Fields of the upstream API that this server does not implement (penalties, streaming,
  LoRA, ...) are accepted only at their default value (``Unsupported*`` types).
* ``null``: in ``sampling_params`` and the admin bodies it means "the default"; in the top-level
  generation bodies a field accepts ``null`` only where its type says ``| None``.
* Sampling parameters are range-checked against ``sampling_limits.py`` (the same ranges as
  ``SamplingParams.validate`` and the run-config checks); the message names the field and its
  range, e.g. ``"sampling_params.top_k: must be -1 (off) or an integer in [1, 2147483647]
  (got 2147483648)"``.
* Checks that depend on the server come from the validation context (``context=``):
  ``max_length`` (a prompt has at most ``max_length - 1`` ids; ``max_new_tokens`` /
  ``max_tokens`` at most ``max_length``), ``max_batch`` (``n``), ``vocab_size`` and
  ``max_stop_ids`` (``stop_token_ids``), ``max_queue`` (prompts per batch),
  ``option_tokens`` (``option_count``; only for a policy with option tokens) and
  ``allow_request_chat_template``. Without a key, the static bound of ``sampling_limits.py``
  applies. Lengths are checked *before* the elements, so an over-long id list is refused
  without walking it.

``validate_request(model, body, where, context)`` (``api_fields.py``, with the field types
and the ``Request`` base these models are built from) runs a model and turns a
``pydantic.ValidationError`` into ``InvalidRequestError`` (HTTP 400, the server's JSON error
shape) whose message names each failing field, e.g. ``"/generate:
sampling_params.temperature: Input should be greater than or equal to 0 (got -1)"``.

Token ids are validated by pydantic-core (``list[StrictInt]``), faster than the previous Python
loop (docs/PERFORMANCE.md, "Rollout server request validation"). The prompt's
vocabulary range stays with ``Engine.validate`` / ``engine.prompt_ids.check_input_ids``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (AfterValidator, ConfigDict, Field, StrictBool, StrictInt, StrictStr,
                      ValidationInfo, model_validator, with_config)
from typing_extensions import TypedDict

from agentrl_jax.rollout.contract import SamplingParams
from agentrl_jax.rollout.servers.api_fields import (CompletionPrompt, InputIds, LogprobStart,
                                                    ManualLoadFormat, MaxNewTokens, MinP,
                                                    NumSamples, OptionCount, Request, Seed,
                                                    Stop,
                                                    StopTokenIds, StrOrStrList, Temperature,
                                                    TextField, TopK, TopP, UnsupportedFalse,
                                                    UnsupportedNone, UnsupportedOne,
                                                    UnsupportedTrue, UnsupportedZero,
                                                    WeightVersion, context_value, fail, one_of)


# ------------------------------------------------------------------------------ /generate
_SP = SamplingParams()


class SamplingParamsRequest(Request):
    """SGLang's ``sampling_params`` (``null`` = default)."""

    null_is_default = True
    max_new_tokens: MaxNewTokens = _SP.max_new_tokens
    temperature: Temperature = _SP.temperature
    top_p: TopP = _SP.top_p
    top_k: TopK = _SP.top_k
    min_p: MinP = _SP.min_p
    stop: Stop | None = None
    stop_token_ids: StopTokenIds | None = None
    ignore_eos: StrictBool = _SP.ignore_eos
    n: NumSamples = _SP.n
    sampling_seed: Seed | None = None
    seed: Seed | None = None  # wins over sampling_seed
    skip_special_tokens: StrictBool = _SP.skip_special_tokens
    no_stop_trim: StrictBool = _SP.no_stop_trim
    # ours: sample only the first n option tokens (SamplingParams.option_count)
    option_count: OptionCount | None = None
    # SGLang fields not implemented here: only their defaults
    frequency_penalty: UnsupportedZero = None
    presence_penalty: UnsupportedZero = None
    repetition_penalty: UnsupportedOne = None
    min_new_tokens: UnsupportedZero = None
    json_schema: UnsupportedNone = None
    regex: UnsupportedNone = None
    ebnf: UnsupportedNone = None
    structural_tag: UnsupportedNone = None
    stop_regex: UnsupportedNone = None
    custom_params: UnsupportedNone = None
    logit_bias: UnsupportedNone = None
    spaces_between_special_tokens: UnsupportedTrue = None
    stream_interval: UnsupportedNone = None

    def to_sampling(self) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=self.max_new_tokens, temperature=float(self.temperature),
            top_p=float(self.top_p), top_k=self.top_k, min_p=float(self.min_p),
            stop=_stop_list(self.stop), stop_token_ids=self.stop_token_ids,
            ignore_eos=self.ignore_eos, n=self.n,
            seed=self.seed if self.seed is not None else self.sampling_seed,
            skip_special_tokens=self.skip_special_tokens, no_stop_trim=self.no_stop_trim,
            option_count=self.option_count)


def _stop_list(stop: str | list[str] | None) -> list[str] | None:
    if isinstance(stop, str):
        return [stop]
    return stop or None  # [] = no stop strings


SamplingField = one_of("must be an object or a list of objects", object=SamplingParamsRequest,
                       array=list[SamplingParamsRequest])


class GenerateRequest(Request):
    """SGLang's ``GenerateReqInput`` (non-streaming; ``session_id`` is our extension)."""

    text: TextField | None = None  # type: ignore[valid-type]
    input_ids: InputIds | None = None
    sampling_params: SamplingField | None = None  # type: ignore[valid-type]
    return_logprob: StrictBool = False
    return_text_in_logprobs: StrictBool = False
    rid: StrOrStrList | None = None  # type: ignore[valid-type]
    session_id: StrOrStrList | None = None  # type: ignore[valid-type]
    # accepted and ignored (SGLang's own types vary: per-prompt lists, dicts)
    session_params: Any = None  # its "id" stands for session_id
    logprob_start_len: LogprobStart | None = None  # only -1 / null with return_logprob
    log_metrics: Any = None
    priority: Any = None
    extra_key: Any = None
    data_parallel_rank: Any = None
    no_logs: Any = None
    # not implemented here: only their defaults
    stream: UnsupportedFalse = None
    top_logprobs_num: UnsupportedZero = None
    token_ids_logprob: UnsupportedNone = None
    lora_path: UnsupportedNone = None
    lora_id: UnsupportedNone = None
    custom_logit_processor: UnsupportedNone = None
    return_hidden_states: UnsupportedFalse = None
    image_data: UnsupportedNone = None
    audio_data: UnsupportedNone = None
    video_data: UnsupportedNone = None
    input_embeds: UnsupportedNone = None
    modalities: UnsupportedNone = None
    bootstrap_host: UnsupportedNone = None
    bootstrap_port: UnsupportedNone = None
    bootstrap_room: UnsupportedNone = None
    return_routed_experts: UnsupportedFalse = None

    @model_validator(mode="before")
    @classmethod
    def _session_params_id(cls, data: Any) -> Any:
        """``session_params.id`` stands for a missing ``session_id`` (checked as one)."""
        if (isinstance(data, dict) and data.get("session_id") is None
                and isinstance(data.get("session_params"), dict)
                and data["session_params"].get("id") is not None):
            data = {**data, "session_id": data["session_params"]["id"]}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> "GenerateRequest":
        if (self.text is None) == (self.input_ids is None):
            raise fail("needs exactly one of 'text' or 'input_ids'")
        if self.return_logprob and self.logprob_start_len not in (-1, None):
            raise fail("input-token logprobs (logprob_start_len >= 0) are not supported; "
                        "only output_token_logprobs")
        count = self.count
        if isinstance(self.sampling_params, list) and len(self.sampling_params) != count:
            raise fail(f"sampling_params has {len(self.sampling_params)} entries for {count} "
                        f"prompts")
        for name in ("rid", "session_id"):
            value = getattr(self, name)
            if isinstance(value, list) and len(value) != count:
                raise fail(f"{name} has {len(value)} entries for {count} prompts")
            if isinstance(value, str) and count != 1:
                raise fail(f"a batch of {count} prompts needs a list of {count} {name}s")
        return self

    @property
    def batched(self) -> bool:
        """A list of prompts (``text`` list or ``input_ids`` list of lists)."""
        if self.text is not None:
            return isinstance(self.text, list)
        return bool(self.input_ids) and isinstance(self.input_ids[0], list)

    @property
    def count(self) -> int:
        """Number of prompts."""
        prompts = self.text if self.text is not None else self.input_ids
        return len(prompts) if self.batched else 1  # type: ignore[arg-type]

    def texts(self) -> list[str]:
        return self.text if isinstance(self.text, list) else [self.text]  # type: ignore

    def token_ids(self) -> list[list[int]]:
        return self.input_ids if self.batched else [self.input_ids]  # type: ignore

    def samplings(self) -> list[SamplingParams]:
        """One ``SamplingParams`` per prompt."""
        if isinstance(self.sampling_params, list):
            return [s.to_sampling() for s in self.sampling_params]
        sp = self.sampling_params or SamplingParamsRequest()
        return [sp.to_sampling()] * self.count

    def per_prompt(self, name: str) -> list[str | None]:
        """``rid`` / ``session_id`` as one entry per prompt."""
        value = getattr(self, name)
        if value is None:
            return [None] * self.count
        return value if isinstance(value, list) else [value]


# ------------------------------------------------------------------------------- OpenAI
class OpenAIRequest(Request):
    """Fields shared by ``/v1/completions`` and ``/v1/chat/completions``."""

    model: StrictStr = ""  # not checked against the served model
    max_tokens: MaxNewTokens | None = None
    n: NumSamples = 1
    temperature: Temperature | None = None
    top_p: TopP | None = None
    stop: Stop | None = None  # type: ignore[valid-type]
    seed: Seed | None = None
    top_k: TopK | None = None
    min_p: MinP | None = None
    ignore_eos: StrictBool | None = None
    stop_token_ids: StopTokenIds | None = None
    skip_special_tokens: StrictBool | None = None
    no_stop_trim: StrictBool | None = None
    session_id: StrictStr | None = None
    rid: StrictStr | None = None
    # ours, as /generate's sampling_params.option_count: sample only the first n option tokens
    option_count: OptionCount | None = None
    # accepted and ignored
    user: Any = None
    metadata: Any = None
    store: Any = None
    service_tier: Any = None
    # not implemented here: only their defaults
    stream: UnsupportedFalse = None
    stream_options: UnsupportedNone = None
    frequency_penalty: UnsupportedZero = None
    presence_penalty: UnsupportedZero = None
    logit_bias: UnsupportedNone = None
    repetition_penalty: UnsupportedOne = None
    min_tokens: UnsupportedZero = None

    def sampling(self, max_tokens: int | None) -> SamplingParams:
        """``SamplingParams`` from the OpenAI fields (``None`` = SGLang's default)."""
        given = {"max_new_tokens": max_tokens, "temperature": self.temperature,
                 "top_p": self.top_p, "n": self.n, "stop": _stop_list(self.stop),
                 "seed": self.seed, "top_k": self.top_k, "min_p": self.min_p,
                 "ignore_eos": self.ignore_eos, "stop_token_ids": self.stop_token_ids,
                 "skip_special_tokens": self.skip_special_tokens,
                 "no_stop_trim": self.no_stop_trim, "option_count": self.option_count}
        kwargs = {k: v for k, v in given.items() if v is not None}
        for key in ("temperature", "top_p", "min_p"):
            if key in kwargs:
                kwargs[key] = float(kwargs[key])
        return SamplingParams(**kwargs)


class CompletionRequest(OpenAIRequest):
    """OpenAI ``/v1/completions`` (``max_tokens`` defaults to 16; ``null`` = SGLang's 128)."""

    prompt: CompletionPrompt
    rid: Any = None  # accepted and ignored (SGLang: a string or one per prompt)
    max_tokens: MaxNewTokens | None = 16
    logprobs: Annotated[StrictInt, Field(ge=0, le=1)] | None = None  # no top alternatives
    best_of: StrictInt | None = None  # must equal n
    echo: UnsupportedFalse = None
    suffix: UnsupportedNone = None

    @model_validator(mode="after")
    def _best_of(self) -> "CompletionRequest":
        if self.best_of is not None and self.best_of != self.n:
            raise fail("best_of != n is not supported")
        return self

    def prompts(self) -> tuple[list[str] | None, list[list[int]] | None]:
        """(texts to tokenize, token-id prompts): exactly one is not None."""
        p = self.prompt
        if isinstance(p, str):
            return [p], None
        if isinstance(p[0], str):
            return p, None  # type: ignore[return-value]
        if isinstance(p[0], list):
            return None, p  # type: ignore[return-value]
        return None, [p]  # type: ignore[list-item]


@with_config(ConfigDict(extra="ignore"))
class TextPart(TypedDict):
    """An OpenAI content part; only text parts are supported."""

    type: Literal["text"]
    text: StrictStr


MessageContent = one_of("must be a string or a list of text parts", string=StrictStr,
                        array=list[TextPart])


@with_config(ConfigDict(extra="ignore"))
class ChatMessage(TypedDict):
    """A chat message: a role and text content (other keys, e.g. ``name``, are ignored)."""

    role: StrictStr
    content: MessageContent  # type: ignore[valid-type]


class ResponseFormat(Request):
    type: Literal["text"]


# apply_chat_template's own parameters: not template variables, so not client-settable
RESERVED_TEMPLATE_KWARGS = frozenset({
    "conversation", "tokenize", "padding", "truncation", "max_length",
    "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs",
    "add_generation_prompt", "continue_final_message"})


def _template_kwargs(value: dict[str, Any] | None, info: ValidationInfo) -> dict[str, Any] | None:
    if not value:
        return value
    reserved = sorted(RESERVED_TEMPLATE_KWARGS & value.keys())
    if reserved:
        raise fail(f"{reserved} cannot be set by a request")
    template = value.get("chat_template")
    if template is not None:
        if not context_value(info, "allow_request_chat_template"):
            raise fail("chat_template: client-supplied chat templates are disabled on this "
                        "server (start it with --allow-request-chat-template)")
        if not isinstance(template, str) or not template:
            raise fail("chat_template must be a non-empty string")
    return value


class ChatCompletionRequest(OpenAIRequest):
    """OpenAI ``/v1/chat/completions`` (max tokens default: the rest of the context)."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: MaxNewTokens | None = None  # wins over max_tokens when present
    logprobs: StrictBool = False
    response_format: ResponseFormat | None = None  # only {"type": "text"}
    chat_template_kwargs: Annotated[dict[str, Any] | None, AfterValidator(_template_kwargs)] = None
    top_logprobs: UnsupportedZero = None
    tools: UnsupportedNone = None
    tool_choice: UnsupportedNone = None
    parallel_tool_calls: UnsupportedNone = None
    reasoning_effort: UnsupportedNone = None
    continue_final_message: UnsupportedFalse = None

    def requested_max_tokens(self) -> int | None:
        """``max_completion_tokens`` if the body has it (even ``null``), else ``max_tokens``."""
        if "max_completion_tokens" in self.model_fields_set:
            return self.max_completion_tokens
        return self.max_tokens

    def conversation(self) -> list[dict[str, str]]:
        """The messages as ``{"role", "content"}`` (text parts joined)."""
        out = []
        for m in self.messages:
            content = m["content"]
            if isinstance(content, list):
                content = "".join(part["text"] for part in content)
            out.append({"role": m["role"], "content": content})
        return out

    def template(self) -> tuple[dict[str, Any], str | None]:
        """(template variables, the client's template or None)."""
        kwargs = dict(self.chat_template_kwargs or {})
        return kwargs, kwargs.pop("chat_template", None)


# ------------------------------------------------------------------------- admin bodies
class UpdateWeightsRequest(Request):
    """SGLang's ``UpdateWeightFromDiskReqInput`` (``null`` = default)."""

    null_is_default = True
    model_path: Annotated[StrictStr, Field(min_length=1)]
    load_format: Literal["auto", "safetensors"] | None = None
    abort_all_requests: StrictBool = False
    weight_version: WeightVersion | None = None  # type: ignore[valid-type]
    flush_cache: StrictBool = True
    is_async: StrictBool = False
    torch_empty_cache: StrictBool = False
    keep_pause: StrictBool = False
    recapture_cuda_graph: StrictBool = False
    token_step: StrictInt = 0
    manual_load_format: ManualLoadFormat | None = None  # type: ignore[valid-type]


class AbortRequest(Request):
    """SGLang's ``AbortReq``: one ``rid`` or ``abort_all``."""

    null_is_default = True
    rid: StrictStr | None = None
    abort_all: StrictBool = False
    abort_message: StrictStr | None = None

    @model_validator(mode="after")
    def _target(self) -> "AbortRequest":
        if not self.abort_all and not self.rid:
            raise fail("rid must be a non-empty string (or abort_all true)")
        return self


class CloseSessionRequest(Request):
    """SGLang's ``CloseSessionReqInput``: here, a finished episode's ``session_id`` whose
    cached prefix the engine may free."""

    session_id: Annotated[StrictStr, Field(min_length=1)]


MEMORY_TAGS = ("kv_cache", "weights", "cuda_graph")  # SGLang's memory-saver tags


class MemoryOccupationRequest(Request):
    """SGLang's ``ReleaseMemoryOccupationReqInput`` / ``ResumeMemoryOccupationReqInput``.
    ``tags``: what to release / resume, of SGLang's ``kv_cache``, ``weights``, ``cuda_graph``;
    ``null`` = what this server can: only its KV cache (the weights stay loaded), so a tag
    other than ``kv_cache`` is refused."""

    null_is_default = True
    tags: list[StrictStr] | None = None

    @model_validator(mode="after")
    def _kv_only(self) -> "MemoryOccupationRequest":
        for tag in self.tags or ():
            if tag not in MEMORY_TAGS:
                raise fail(f"unknown tag {tag!r}; known: {', '.join(MEMORY_TAGS)}")
            if tag != "kv_cache":
                raise fail(f"tag {tag!r}: this engine releases only its KV cache "
                            "(tags ['kv_cache'] or null); its weights stay loaded")
        return self


class PauseRequest(Request):
    """SGLang's ``PauseGenerationReqInput``."""

    null_is_default = True
    mode: Literal["abort", "retract", "in_place"] = "abort"


class ContinueRequest(Request):
    """SGLang's ``ContinueGenerationReqInput``."""

    null_is_default = True
    torch_empty_cache: StrictBool = False


__all__ = ["SamplingParamsRequest", "GenerateRequest", "OpenAIRequest",
           "CompletionRequest", "ChatCompletionRequest", "ChatMessage", "TextPart",
           "UpdateWeightsRequest", "AbortRequest", "CloseSessionRequest", "MemoryOccupationRequest",
           "MEMORY_TAGS", "PauseRequest", "ContinueRequest", "RESERVED_TEMPLATE_KWARGS"]
