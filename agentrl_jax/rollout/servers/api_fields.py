"""The building blocks of the rollout server's request models (``api_models.py``): the strict,
closed ``Request`` base (unknown fields refused with the supported ones listed), field types
range-checked against ``sampling_limits.py`` or the server's validation context (token ids,
batches, stop lists, prompt text without lone surrogates, ``Unsupported*`` fields accepted only
at their default), and the error messages: ``validate_request(model, body, where, context)``
turns a ``pydantic.ValidationError`` into ``InvalidRequestError`` (HTTP 400) naming each
failing field."""

from __future__ import annotations

from typing import Annotated, Any, Callable, ClassVar, TypeVar, Union

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Discriminator,
                      Field, StrictInt, StrictStr, Tag, ValidationError, ValidationInfo,
                      model_validator)
from pydantic_core import PydanticCustomError

from agentrl_jax.rollout import sampling_limits as limits
from agentrl_jax.rollout.contract import InvalidRequestError


M = TypeVar("M", bound=BaseModel)

# ------------------------------------------------------------------------------- helpers
_CUSTOM = "request"  # the error type of this module's own messages (no "got ..." suffix)
# tags of the discriminated unions below: they appear in pydantic's error locations and are
# dropped from the field names in messages
_TAGS = frozenset({"string", "array", "object", "integer", "ids", "batch", "texts"})


def fail(message: str) -> PydanticCustomError:
    """A validation error with ``message`` verbatim (braces are not format fields)."""
    return PydanticCustomError(_CUSTOM, message, {})


def context_value(info: ValidationInfo, key: str) -> Any:
    return (info.context or {}).get(key)


def _kind(value: Any) -> str | None:
    """The JSON kind of ``value`` as a union tag (booleans are not integers)."""
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, int) and not isinstance(value, bool):
        return "integer"
    return None


def one_of(message: str, **variants: Any) -> Any:
    """A union chosen by the value's JSON kind (``string=``, ``array=``, ``object=``,
    ``integer=``): one error message when the kind matches none (``message``), and otherwise
    only the matching variant's errors (a plain union would report every variant's)."""
    members = tuple(Annotated[t, Tag(k)] for k, t in variants.items())
    return Annotated[Union[members], Discriminator(  # type: ignore[valid-type]
        _kind, custom_error_type=_CUSTOM, custom_error_message=message)]


def _only(default: Any) -> Callable[[Any], Any]:
    """Validator of a field this server does not implement: only ``null`` or ``default``
    (a boolean default only as a JSON boolean)."""

    def check(value: Any) -> Any:
        if value is None:
            return value
        if isinstance(default, bool) and not isinstance(value, bool):
            raise fail("must be a boolean")
        if value != default:
            raise fail(f"{value!r} is not supported by this server (only the default "
                        f"{default!r})")
        return value

    return check


UnsupportedNone = Annotated[Any, AfterValidator(_only(None))]
UnsupportedFalse = Annotated[Any, AfterValidator(_only(False))]
UnsupportedZero = Annotated[Any, AfterValidator(_only(0))]
UnsupportedOne = Annotated[Any, AfterValidator(_only(1.0))]
UnsupportedTrue = Annotated[Any, AfterValidator(_only(True))]


def _within(limit: limits.Limit) -> AfterValidator:
    """A validator of ``limit``'s range (its engine-dependent bound from the context)."""

    def check(value: Any, info: ValidationInfo) -> Any:
        problem = limit.problem(value, info.context)
        if problem is not None:
            raise fail(problem)
        return value

    return AfterValidator(check)


def _stop_token_ids(value: list[int], info: ValidationInfo) -> list[int]:
    problem = limits.stop_token_ids_problem(value, info.context)
    if problem is not None:
        raise fail(problem)
    return value


def _stop_strings(value: str | list[str]) -> str | list[str]:
    problem = limits.stop_problem([value] if isinstance(value, str) else value)
    if problem is not None:
        raise fail(problem)
    return value


def _token_ids(value: Any, info: ValidationInfo) -> Any:
    """A prompt: a non-empty list shorter than the context (before its elements are read)."""
    if type(value) is not list or not value:
        raise fail("must be a non-empty list of integers")
    limit = context_value(info, "max_length")
    if limit is not None and len(value) >= limit:
        raise fail(f"has {len(value)} tokens: a prompt must be shorter than the context "
                    f"length {limit}")
    return value


def _batch(value: Any, info: ValidationInfo) -> Any:
    """A batch of prompts: non-empty, no larger than the admission queue (before its
    elements are read: a batch that could never be admitted whole is refused at once)."""
    if type(value) is not list or not value:
        raise fail("must be a non-empty list")
    limit = context_value(info, "max_queue")
    if limit is not None and len(value) > limit:
        raise fail(f"a batch of {len(value)} prompts exceeds the server's admission queue "
                    f"({limit} requests)")
    return value


def _unicode(text: str) -> str:
    """Text must be encodable as UTF-8 (no lone surrogates such as ``"\\ud800"``)."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise fail("is not valid Unicode (a lone surrogate code point)") from None
    return text


# ----------------------------------------------------------------------------- field types
FiniteFloat = Annotated[float, Field(strict=True, allow_inf_nan=False)]  # ints accepted
MaxNewTokens = Annotated[StrictInt, _within(limits.MAX_NEW_TOKENS)]
Seed = Annotated[StrictInt, _within(limits.SEED)]
TopK = Annotated[StrictInt, _within(limits.TOP_K)]
Temperature = Annotated[FiniteFloat, _within(limits.TEMPERATURE)]
TopP = Annotated[FiniteFloat, _within(limits.TOP_P)]
MinP = Annotated[FiniteFloat, _within(limits.MIN_P)]
NumSamples = Annotated[StrictInt, _within(limits.N)]
OptionCount = Annotated[StrictInt, _within(limits.OPTION_COUNT)]
StopTokenIds = Annotated[list[StrictInt], AfterValidator(_stop_token_ids)]
StopString = Annotated[StrictStr, Field(min_length=1)]
Stop = Annotated[one_of("must be a string or a list of strings", string=StopString,
                        array=list[StopString]), AfterValidator(_stop_strings)]
LogprobStart = one_of("must be an integer or a list of integers",
                      integer=Annotated[StrictInt, _within(limits.LOGPROB_START_LEN)],
                      array=list[Annotated[StrictInt, _within(limits.LOGPROB_START_LEN)]])
StrOrStrList = one_of("must be a string or a list of strings", string=StrictStr,
                      array=list[StrictStr])
TokenIds = Annotated[list[StrictInt], BeforeValidator(_token_ids)]
TokenBatch = Annotated[list[TokenIds], BeforeValidator(_batch)]
PromptText = Annotated[StrictStr, AfterValidator(_unicode)]
TextBatch = Annotated[list[PromptText], BeforeValidator(_batch)]
TextField = one_of("must be a string or a list of strings", string=PromptText, array=TextBatch)
WeightVersion = one_of("must be a string or an integer", string=StrictStr, integer=StrictInt)
ManualLoadFormat = one_of("must be a string, an object or a list", string=StrictStr,
                          object=dict[str, Any], array=list[Any])


def _ids_kind(value: Any) -> str | None:
    """``input_ids``: one prompt or a batch (a list whose first element is a list)."""
    if type(value) is not list:
        return None
    return "batch" if value and type(value[0]) is list else "ids"


InputIds = Annotated[Union[Annotated[TokenIds, Tag("ids")], Annotated[TokenBatch, Tag("batch")]],
                     Discriminator(_ids_kind, custom_error_type=_CUSTOM, custom_error_message=(
                         "must be a non-empty list of integers (or a list of such lists)"))]


def _prompt_kind(value: Any) -> str | None:
    """``/v1/completions`` ``prompt``, by its first element: text, ids, texts or id lists."""
    if isinstance(value, str):
        return "string"
    if type(value) is not list or not value:
        return None
    first = value[0]
    if isinstance(first, int) and not isinstance(first, bool):
        return "ids"
    return {str: "texts", list: "batch"}.get(type(first))


CompletionPrompt = Annotated[
    Union[Annotated[PromptText, Tag("string")], Annotated[TokenIds, Tag("ids")],
          Annotated[TextBatch, Tag("texts")], Annotated[TokenBatch, Tag("batch")]],
    Discriminator(_prompt_kind, custom_error_type=_CUSTOM, custom_error_message=(
        "must be a string, a list of strings, a list of token ids or a list of token-id "
        "lists"))]


# ------------------------------------------------------------------------------ the base
class Request(BaseModel):
    """Strict, closed request body. ``null_is_default``: ``null`` fields take their default."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)
    null_is_default: ClassVar[bool] = False
    _fields: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls._fields = frozenset(cls.model_fields)

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        """Unknown fields are refused with the list of supported ones (one message, before
        any field is read; ``extra="forbid"`` would give one terse error per field)."""
        if not isinstance(data, dict):
            raise fail(f"must be a JSON object, got {json_type(data)}")
        unknown = data.keys() - cls._fields
        if unknown:
            raise fail(f"unknown field(s) {sorted(map(str, unknown))}; supported fields: "
                        f"{sorted(cls._fields)}")
        if cls.null_is_default and None in data.values():
            data = {k: v for k, v in data.items() if v is not None}
        return data


# ----------------------------------------------------------------------- error messages
_JSON_TYPE_NAMES = {bool: "boolean", int: "integer", float: "number", str: "string",
                    list: "array", dict: "object", type(None): "null"}
MAX_REPORTED_ERRORS = 3


def json_type(value: Any) -> str:
    """The JSON name of ``value``'s type, for error messages."""
    return _JSON_TYPE_NAMES.get(type(value), type(value).__name__)


def _got(value: Any) -> str:
    """A short description of an offending value."""
    if isinstance(value, (list, dict)):
        return f"{'an array' if isinstance(value, list) else 'an object'} of {len(value)} items"
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    text = repr(value)
    return f"{json_type(value)} {text if len(text) <= 40 else text[:37] + '...'}"


def _where(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as a field path: ``sampling_params[1].temperature``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part not in _TAGS:
            out += f".{part}" if out else str(part)
    return out


def error_message(error: ValidationError, where: str) -> str:
    """One message for all of ``error``'s failures (at most ``MAX_REPORTED_ERRORS``), each
    naming its field: ``"<where>: <field>: <problem> (got <value>)"``."""
    errors = error.errors(include_url=False, include_context=False)
    parts = []
    for e in errors[:MAX_REPORTED_ERRORS]:
        field = _where(e["loc"])
        text = f"{field}: {e['msg']}" if field else e["msg"]
        if e["type"] not in (_CUSTOM, "missing"):
            text += f" (got {_got(e['input'])})"
        parts.append(text)
    more = len(errors) - MAX_REPORTED_ERRORS
    if more > 0:
        parts.append(f"and {more} more error(s)")
    return f"{where}: " + "; ".join(parts)


def validate_request(model: type[M], body: Any, where: str,
                     context: dict[str, Any] | None = None) -> M:
    """``model`` validated from ``body`` (a parsed JSON value); ``InvalidRequestError`` (HTTP
    400) naming the failing fields otherwise."""
    try:
        return model.model_validate(body, context=context)
    except ValidationError as e:
        raise InvalidRequestError(error_message(e, where)) from None


__all__ = ["Request", "one_of", "fail", "context_value", "validate_request", "json_type",
           "error_message", "MAX_REPORTED_ERRORS", "UnsupportedNone", "UnsupportedFalse",
           "UnsupportedZero", "UnsupportedOne", "UnsupportedTrue", "MaxNewTokens", "Seed", "TopK",
           "Temperature", "TopP", "MinP", "NumSamples", "OptionCount", "StopTokenIds", "Stop",
           "LogprobStart",
           "StrOrStrList", "TokenIds", "TokenBatch", "PromptText", "TextBatch", "TextField",
           "WeightVersion", "ManualLoadFormat", "InputIds", "CompletionPrompt"]
