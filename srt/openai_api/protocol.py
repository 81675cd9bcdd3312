"""Pydantic models of the OpenAI-compatible API (requests and responses) and its error shape.

Requests are strict (``"1"`` is not an int, unknown top-level fields are errors, so nothing is
silently ignored); ``None`` for an optional sampling field means "the default", as many clients
send unset fields as JSON ``null``. Chat messages tolerate extra keys (``refusal``, ``audio``...)
because clients echo previous assistant messages back as the SDK dumped them.

Responses follow OpenAI's reference types (``openai.types.Completion``, ``ChatCompletion``,
``ChatCompletionChunk``, ``Model``) plus SGLang's non-standard ``matched_stop`` on choices and
``max_model_len`` on model cards. Errors are ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from radixlm.srt.errors import error_type
from radixlm.srt.sampling_params import INT64_MAX, INT64_MIN


# ---- errors ----------------------------------------------------------------------------------------
class OpenAIError(Exception):
    """A client-visible error of the OpenAI routes: HTTP ``status``, the offending ``param`` (a
    request field path such as ``messages.0.role``) and an optional machine-readable ``code``."""

    def __init__(self, message: str, status: int = 400, param: Optional[str] = None, code: Optional[str] = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code


def openai_error_body(message: str, status: int, param: Optional[str] = None, code: Optional[str] = None) -> dict:
    """OpenAI's error object for an HTTP status (``type`` derived from it; 5xx -> ``server_error``)."""
    return {"error": {"message": message, "type": error_type(status), "param": param,
                      "code": code if code is not None else (None if status < 500 else str(status))}}


# ---- shared request pieces ------------------------------------------------------------------------
class _Strict(BaseModel):
    """Strict types, unknown fields refused, except that an unknown field sent as ``null`` is
    dropped: clients and frameworks send every field their SDK version knows, unset ones as null."""

    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _drop_unknown_nulls(cls, data: Any) -> Any:
        if isinstance(data, dict):
            known = set(cls.model_fields) | {f.alias for f in cls.model_fields.values() if f.alias}
            return {k: v for k, v in data.items() if v is not None or k in known}
        return data


def _seed_in_range(value: int) -> int:
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValueError(f"must be in [{INT64_MIN}, {INT64_MAX}] (a 64-bit integer), got {value}")
    return value


# ``seed``: a 64-bit signed integer, as in vLLM (the native ``sampling_seed``'s range); outside it a 400
# naming ``seed`` and the range.
Seed = Annotated[int, AfterValidator(_seed_in_range), Field(json_schema_extra={"minimum": INT64_MIN,
                                                                                "maximum": INT64_MAX})]


class StreamOptions(_Strict):
    """``stream_options``: ``include_usage`` adds a final chunk with ``choices: []`` and ``usage``;
    with ``continuous_usage_stats`` as well (vLLM's and SGLang's extra) every chunk also carries the
    usage so far (completion tokens up to that chunk)."""

    include_usage: Optional[bool] = False
    continuous_usage_stats: Optional[bool] = False
    # OpenAI pads streamed chunks against length side channels when this is true (its default); a
    # self-hosted server has no such channel to close, so it is accepted and nothing is padded.
    include_obfuscation: Optional[bool] = None

    def continuous(self) -> bool:
        return bool(self.include_usage and self.continuous_usage_stats)


class _SamplingRequest(_Strict):
    """Fields common to completions and chat (OpenAI's plus radixlm/SGLang extras)."""

    model: Optional[str] = None
    frequency_penalty: Optional[float] = Field(default=None, ge=-2, le=2)
    presence_penalty: Optional[float] = Field(default=None, ge=-2, le=2)
    # OpenAI's range: -100 bans a token, 100 all but forces it (a larger value is a 400 there too)
    logit_bias: Optional[dict[str, Annotated[float, Field(ge=-100, le=100)]]] = None
    max_tokens: Optional[int] = Field(default=None, ge=1)
    n: Optional[int] = Field(default=None, ge=1, le=128)
    seed: Optional[Seed] = None
    stop: Optional[Union[str, list[str]]] = None
    stream: Optional[bool] = False
    stream_options: Optional[StreamOptions] = None
    temperature: Optional[float] = Field(default=None, ge=0, le=2)
    top_p: Optional[float] = Field(default=None, gt=0, le=1)
    user: Optional[str] = None
    # Standard fields that change nothing on this server, accepted and ignored: nothing is stored
    # (store, metadata), there is one service tier, prefix caching needs no key (the radix cache
    # finds shared prefixes itself) and nothing here uses a safety identifier.
    store: Optional[bool] = None
    metadata: Optional[dict[str, str]] = None
    service_tier: Optional[str] = None
    prompt_cache_key: Optional[str] = None
    safety_identifier: Optional[str] = None
    # radixlm / SGLang extras (the native sampling fields)
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    repetition_penalty: Optional[float] = None  # range checked with the native params: (0, 2]
    min_tokens: Optional[int] = Field(default=None, ge=0)
    ignore_eos: Optional[bool] = None
    stop_token_ids: Optional[list[int]] = None
    skip_special_tokens: Optional[bool] = None
    no_stop_trim: Optional[bool] = None
    include_stop_str_in_output: Optional[bool] = None  # vLLM's: the text ends right after the stop string
    regex: Optional[str] = None
    ebnf: Optional[str] = None
    rid: Optional[str] = None
    # Seconds (> 0) the request may take; then it ends with finish_reason "abort" (partial output
    # kept). The server's --request-timeout caps it.
    timeout: Optional[float] = Field(default=None, gt=0, allow_inf_nan=False)
    # SGLang's; its router sends false on every request. Hidden states are never returned here.
    return_hidden_states: Optional[bool] = None

    @field_validator("return_hidden_states")
    @classmethod
    def _no_hidden_states(cls, value: Optional[bool]) -> Optional[bool]:
        if value:
            raise ValueError("hidden states are not returned by this server")
        return value


# ---- completions ------------------------------------------------------------------------------------
class CompletionRequest(_SamplingRequest):
    """``POST /v1/completions``. ``prompt``: str, list of str, token ids or list of token-id lists.
    ``max_tokens`` defaults to 16; 0 only with ``echo`` (the prompt alone, to score it: vLLM's and
    OpenAI's legacy behaviour; the handler refuses it otherwise). ``logprobs`` (0..20) asks for that
    many alternatives per token."""

    prompt: Union[list[list[int]], list[int], list[str], str]
    max_tokens: Optional[int] = Field(default=None, ge=0)
    echo: Optional[bool] = False
    logprobs: Optional[int] = Field(default=None, ge=0, le=20)
    best_of: Optional[int] = Field(default=None, ge=1)
    suffix: Optional[str] = None
    json_schema: Optional[Union[str, dict[str, Any]]] = None


class CompletionLogprobs(BaseModel):
    """OpenAI's legacy logprobs: parallel lists; ``text_offset`` indexes the choice's ``text``."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[Optional[float]] = Field(default_factory=list)
    top_logprobs: list[Optional[dict[str, float]]] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: Optional[CompletionLogprobs] = None
    finish_reason: Optional[str] = None
    matched_stop: Optional[Union[int, str]] = None


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0
    # With --enable-hierarchical-cache: where the cached tokens came from ({"device", "host"[, "storage"]}).
    cached_tokens_details: Optional[dict[str, int]] = None


class UsageInfo(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class CompletionResponse(BaseModel):
    """A ``text_completion`` (streamed chunks have the same shape, ``usage`` only in the last)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    system_fingerprint: Optional[str] = None
    choices: list[CompletionChoice]
    usage: Optional[UsageInfo] = None


# ---- chat ---------------------------------------------------------------------------------------------
class ContentPart(BaseModel):
    """One part of a message's content; only ``{"type": "text", "text": ...}`` is supported."""

    model_config = ConfigDict(extra="allow")
    type: str
    text: Optional[str] = None


class ChatMessage(BaseModel):
    """One input message. ``content`` is a string, a list of text parts, or null (assistant);
    ``tool_call_id`` is required with role ``tool`` (checked when rendering: a 400 naming
    ``messages.<i>.tool_call_id``, as OpenAI answers)."""

    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Optional[Union[str, list[ContentPart]]] = None
    name: Optional[str] = None
    tool_call_id: Optional[str] = None
    tool_calls: Optional[list[dict[str, Any]]] = None


class JsonSchemaFormat(_Strict):
    name: str = Field(max_length=64)
    description: Optional[str] = None
    schema_: Optional[dict[str, Any]] = Field(default=None, alias="schema")
    strict: Optional[bool] = None


class ResponseFormat(_Strict):
    """``text`` | ``json_object`` (any JSON object) | ``json_schema`` (constrained to the schema)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaFormat] = None


class FunctionDefinition(_Strict):
    """``tools[i].function``: ``parameters`` is a JSON Schema of type object (absent: no arguments)."""

    name: str
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None


class ChatTool(_Strict):
    """One entry of ``tools``; only ``type: "function"`` exists."""

    type: Literal["function"] = "function"
    function: FunctionDefinition


class FunctionName(_Strict):
    name: str


class NamedToolChoice(_Strict):
    """``tool_choice: {"type": "function", "function": {"name": ...}}``: call exactly that function."""

    type: Literal["function"] = "function"
    function: FunctionName


class ChatCompletionRequest(_SamplingRequest):
    """``POST /v1/chat/completions``. ``max_completion_tokens`` wins over ``max_tokens``; without
    either the reply may use the rest of the context. ``continue_final_message`` (vLLM's and SGLang's;
    default false) continues the final assistant message instead of opening a new turn.

    Tools: ``tool_choice`` is ``none`` / ``auto`` (the default with tools) / ``required`` / a named
    function; ``parallel_tool_calls`` (default true) allows more than one call. ``separate_reasoning``
    (SGLang's; default true) puts a reasoning parser's split in ``reasoning_content``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(default=None, ge=1)
    logprobs: Optional[bool] = False
    top_logprobs: Optional[int] = Field(default=None, ge=0, le=20)
    response_format: Optional[ResponseFormat] = None
    tools: Optional[list[ChatTool]] = None
    tool_choice: Optional[Union[str, NamedToolChoice]] = None  # the string is checked by tool_request
    parallel_tool_calls: Optional[bool] = None
    separate_reasoning: Optional[bool] = None
    # The deprecated function-calling pair (``functions`` = tools of type function).
    functions: Optional[list[dict[str, Any]]] = None
    function_call: Optional[Union[str, dict[str, Any]]] = None
    # Accepted; text output only: ``modalities`` other than ["text"] and any ``audio`` are 400s.
    modalities: Optional[list[str]] = None
    audio: Optional[dict[str, Any]] = None
    # Predicted outputs are a latency hint; the reply is the same without it, so it is ignored.
    prediction: Optional[dict[str, Any]] = None
    reasoning_effort: Optional[str] = None
    verbosity: Optional[Literal["low", "medium", "high"]] = None  # GPT-5 answer length: no model here reads it
    web_search_options: Optional[dict[str, Any]] = None
    continue_final_message: Optional[bool] = None
    add_generation_prompt: Optional[bool] = None  # vLLM's: false renders no assistant-turn opener
    chat_template_kwargs: Optional[dict[str, Any]] = None
    # SGLang's (default true, what its router sends): reasoning_content is streamed as it is generated.
    stream_reasoning: Optional[bool] = None

    @field_validator("stream_reasoning")
    @classmethod
    def _reasoning_streams(cls, value: Optional[bool]) -> Optional[bool]:
        if value is False:
            raise ValueError("stream_reasoning: false is not supported (reasoning is streamed as it is generated)")
        return value


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: Optional[list[int]] = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    content: Optional[list[ChatTokenLogprob]] = None
    refusal: Optional[list[ChatTokenLogprob]] = None


class ChatResponseMessage(BaseModel):
    """``tool_calls``: ``[{"id", "type": "function", "function": {"name", "arguments"}}]`` (arguments
    is JSON text); ``reasoning_content``: the reasoning parser's split (SGLang/vLLM's field)."""

    role: Literal["assistant"] = "assistant"
    content: Optional[str] = None
    reasoning_content: Optional[str] = None
    refusal: Optional[str] = None
    tool_calls: Optional[list[dict[str, Any]]] = None


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: Optional[ChoiceLogprobs] = None
    finish_reason: Optional[str] = None
    matched_stop: Optional[Union[int, str]] = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    system_fingerprint: Optional[str] = None
    choices: list[ChatChoice]
    usage: UsageInfo


class DeltaMessage(BaseModel):
    """A streamed piece. ``tool_calls[i]``: ``{"index", "id", "type", "function": {"name",
    "arguments": ""}}`` first, then ``{"index", "function": {"arguments": fragment}}``. Unset
    ``reasoning_content``/``tool_calls`` are left out of chunks (``ChatCompletionChunk.dump``)."""

    role: Optional[Literal["assistant"]] = None
    content: Optional[str] = None
    reasoning_content: Optional[str] = None
    tool_calls: Optional[list[dict[str, Any]]] = None


class ChatStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: Optional[ChoiceLogprobs] = None
    finish_reason: Optional[str] = None
    matched_stop: Optional[Union[int, str]] = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    system_fingerprint: Optional[str] = None
    choices: list[ChatStreamChoice]
    usage: Optional[UsageInfo] = None

    def dump(self) -> dict[str, Any]:
        """The wire dict: ``usage`` only when set, deltas without unset tool/reasoning fields."""
        body = self.model_dump()
        if self.usage is None:
            body.pop("usage")
        for choice in body["choices"]:
            for key in ("reasoning_content", "tool_calls"):
                if choice["delta"].get(key) is None:
                    choice["delta"].pop(key, None)
        return body


# ---- models -----------------------------------------------------------------------------------------
class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "radixlm"
    root: Optional[str] = None
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
