"""Pydantic models of OpenAI's Responses API (``POST /v1/responses``), after the ``openai`` client's
``openai.types.responses`` (the authoritative shapes).

Requests are strict like the chat ones (``protocol._Strict``: strict types, unknown top-level fields
are errors unless sent as ``null``). Input items and content parts tolerate extra keys (``id``,
``status``, ``annotations``, ``logprobs``...), because agents send a response's ``output`` items back
as the next request's input, as the SDK dumped them. Items are told apart by ``type`` (a message may
leave it out); item and tool types of OpenAI's built-in tools parse, so the handler can answer them
with a 400 that names them instead of a schema error.

Responses: ``ResponseObject`` with ``output`` items ``message`` (``output_text`` parts), ``function_call``
and ``reasoning`` (``reasoning_text`` content), ``usage`` in the Responses shape.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from radixlm.srt.openai_api.protocol import Seed, _Strict

# OpenAI's built-in tools and the items they produce: parsed, then refused by the handler.
BUILTIN_TOOL_TYPES = ("file_search", "web_search", "web_search_2025_08_26", "web_search_preview",
                      "web_search_preview_2025_03_11", "computer", "computer_use_preview", "mcp", "code_interpreter",
                      "image_generation", "local_shell", "shell", "custom", "apply_patch", "tool_search", "namespace")
BUILTIN_ITEM_TYPES = ("file_search_call", "computer_call", "computer_call_output", "web_search_call",
                      "image_generation_call", "code_interpreter_call", "local_shell_call", "local_shell_call_output",
                      "shell_call", "shell_call_output", "apply_patch_call", "apply_patch_call_output", "mcp_list_tools",
                      "mcp_approval_request", "mcp_approval_response", "mcp_call", "custom_tool_call",
                      "custom_tool_call_output", "tool_search_call", "tool_search_output", "compaction",
                      "item_reference", "additional_tools")
OTHER_TOOL_CHOICES = ("allowed_tools", "file_search", "web_search_preview", "web_search_preview_2025_03_11",
                      "computer_use_preview", "computer", "image_generation", "code_interpreter", "mcp", "custom",
                      "apply_patch", "shell", "programmatic_tool_calling")


class _Item(BaseModel):
    """Input items and parts: strict types, extra keys kept (and ignored)."""

    model_config = ConfigDict(strict=True, extra="allow", populate_by_name=True)


# ---- input ----------------------------------------------------------------------------------------
class InputTextPart(_Item):
    type: Literal["input_text"]
    text: str


class OutputTextPart(_Item):
    """An assistant message's text, as a previous response's ``output`` has it."""

    type: Literal["output_text"]
    text: str


class RefusalPart(_Item):
    type: Literal["refusal"]
    refusal: str


class MediaPart(_Item):
    """Images, files and audio: refused (this server reads text only)."""

    type: Literal["input_image", "input_file", "input_audio"]


ContentPart = Annotated[Union[InputTextPart, OutputTextPart, RefusalPart, MediaPart], Field(discriminator="type")]


class MessageItem(_Item):
    """``{"role", "content"}`` (``type: "message"`` optional): content a string or a list of parts."""

    type: Optional[Literal["message"]] = None
    role: Literal["user", "system", "developer", "assistant"]
    content: Union[str, list[ContentPart]]


class FunctionCallItem(_Item):
    """A call the model made earlier (a previous response's ``function_call`` output item)."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputItem(_Item):
    """The result of call ``call_id``: text, or a list of ``input_text`` parts."""

    type: Literal["function_call_output"]
    call_id: str
    output: Union[str, list[ContentPart]]


class ReasoningInputItem(_Item):
    """A previous response's reasoning item: accepted and left out of the prompt (chat templates drop
    earlier turns' reasoning too)."""

    type: Literal["reasoning"]


class BuiltinItem(_Item):
    """Items of built-in tools and item references: refused by the handler."""

    type: Literal[BUILTIN_ITEM_TYPES]  # type: ignore[valid-type]


def _item_type(value: Any) -> Any:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    if kind is None:
        return "message"
    return "builtin" if kind in BUILTIN_ITEM_TYPES else kind


InputItem = Annotated[Union[
    Annotated[MessageItem, Tag("message")], Annotated[FunctionCallItem, Tag("function_call")],
    Annotated[FunctionCallOutputItem, Tag("function_call_output")], Annotated[ReasoningInputItem, Tag("reasoning")],
    Annotated[BuiltinItem, Tag("builtin")]], Discriminator(
        _item_type, custom_error_type="invalid_item_type",
        custom_error_message="unknown item type (expected a message, function_call, function_call_output or "
                             "reasoning item)")]


# ---- tools, text format, reasoning ------------------------------------------------------------------
class FunctionToolSpec(_Strict):
    """A function tool, Responses shape: flat (``name`` etc. beside ``type``, not under ``function``)."""

    type: Literal["function"]
    name: str
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None

    @model_validator(mode="before")
    @classmethod
    def _not_chat_shaped(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("function"), dict) and "name" not in data:
            raise ValueError('Responses function tools are flat ({"type": "function", "name": ..., "parameters": '
                             '...}), not nested under "function" as on /v1/chat/completions')
        return data


class BuiltinToolSpec(_Item):
    type: Literal[BUILTIN_TOOL_TYPES]  # type: ignore[valid-type]


ToolSpec = Annotated[Union[FunctionToolSpec, BuiltinToolSpec], Field(discriminator="type")]


class FunctionToolChoice(_Strict):
    """``{"type": "function", "name": ...}``: call exactly that function."""

    type: Literal["function"]
    name: str


class OtherToolChoice(_Item):
    """``allowed_tools`` and built-in tool choices: refused by the handler."""

    type: Literal[OTHER_TOOL_CHOICES]  # type: ignore[valid-type]


ObjectToolChoice = Annotated[Union[FunctionToolChoice, OtherToolChoice], Field(discriminator="type")]


class TextFormatText(_Strict):
    type: Literal["text"]


class TextFormatJsonObject(_Strict):
    type: Literal["json_object"]


class TextFormatJsonSchema(_Strict):
    """``{"type": "json_schema", "name", "schema", "description", "strict"}`` (flat, unlike chat's)."""

    type: Literal["json_schema"]
    name: str = Field(max_length=64)
    schema_: dict[str, Any] = Field(alias="schema")
    description: Optional[str] = None
    strict: Optional[bool] = None


TextFormat = Annotated[Union[TextFormatText, TextFormatJsonObject, TextFormatJsonSchema], Field(discriminator="type")]


class TextConfig(_Strict):
    format: Optional[TextFormat] = None
    verbosity: Optional[Literal["low", "medium", "high"]] = None


class ReasoningConfig(_Strict):
    """Accepted and echoed; no model here reasons at a set effort or writes summaries."""

    effort: Optional[str] = None
    summary: Optional[str] = None
    generate_summary: Optional[str] = None


class ResponsesStreamOptions(_Strict):
    include_obfuscation: Optional[bool] = None


class ResponsesRequest(_Strict):
    """``POST /v1/responses``. ``input``: a string (one user message) or a list of items.

    Sampling: ``max_output_tokens`` (default: the rest of the context), ``temperature``, ``top_p``, and
    radixlm/SGLang's extras with their chat names. ``store`` (OpenAI's default: true) keeps the response
    in this server's memory for ``GET /v1/responses/{id}`` and ``previous_response_id``. Fields that
    change nothing here are accepted (``metadata``, ``user``, ``safety_identifier``, ``prompt_cache_*``,
    ``service_tier``, ``reasoning``, ``text.verbosity``, ``stream_options``, ``include:
    ["reasoning.encrypted_content"]``); the handler refuses the unsupported ones with a 400."""

    model: Optional[str] = None
    input: Union[str, list[InputItem]]
    instructions: Optional[str] = None
    previous_response_id: Optional[str] = None
    store: Optional[bool] = None
    stream: Optional[bool] = False
    stream_options: Optional[ResponsesStreamOptions] = None
    max_output_tokens: Optional[int] = Field(default=None, ge=1)
    temperature: Optional[float] = Field(default=None, ge=0, le=2)
    top_p: Optional[float] = Field(default=None, gt=0, le=1)
    tools: Optional[list[ToolSpec]] = None
    tool_choice: Optional[Union[Literal["none", "auto", "required"], ObjectToolChoice]] = None
    parallel_tool_calls: Optional[bool] = None
    max_tool_calls: Optional[int] = Field(default=None, ge=1)
    text: Optional[TextConfig] = None
    reasoning: Optional[ReasoningConfig] = None
    include: Optional[list[str]] = None
    truncation: Optional[Literal["auto", "disabled"]] = None
    top_logprobs: Optional[int] = Field(default=None, ge=0, le=20)
    background: Optional[bool] = None
    conversation: Optional[Union[str, dict[str, Any]]] = None
    prompt: Optional[dict[str, Any]] = None
    metadata: Optional[dict[str, str]] = None
    user: Optional[str] = None
    safety_identifier: Optional[str] = None
    prompt_cache_key: Optional[str] = None
    prompt_cache_retention: Optional[str] = None
    service_tier: Optional[str] = None
    # radixlm / SGLang extras (as on /v1/chat/completions)
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    frequency_penalty: Optional[float] = Field(default=None, ge=-2, le=2)
    presence_penalty: Optional[float] = Field(default=None, ge=-2, le=2)
    seed: Optional[Seed] = None
    stop: Optional[Union[str, list[str]]] = None
    stop_token_ids: Optional[list[int]] = None
    min_tokens: Optional[int] = Field(default=None, ge=0)
    ignore_eos: Optional[bool] = None
    skip_special_tokens: Optional[bool] = None
    regex: Optional[str] = None
    ebnf: Optional[str] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None
    separate_reasoning: Optional[bool] = None
    rid: Optional[str] = None
    timeout: Optional[float] = Field(default=None, gt=0, allow_inf_nan=False)


# ---- output -----------------------------------------------------------------------------------------
class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class OutputMessage(BaseModel):
    type: Literal["message"] = "message"
    id: str
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"]
    content: list[OutputText]


class OutputFunctionCall(BaseModel):
    """``arguments``: the JSON text the model wrote; ``call_id`` is what ``function_call_output`` names."""

    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"]


class ReasoningText(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class OutputReasoning(BaseModel):
    """The reasoning parser's split (``--reasoning-parser``): the text in ``content``, no summary."""

    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[Any] = Field(default_factory=list)
    content: list[ReasoningText]
    encrypted_content: Optional[str] = None
    status: Literal["in_progress", "completed", "incomplete"]


OutputItem = Annotated[Union[OutputMessage, OutputFunctionCall, OutputReasoning], Field(discriminator="type")]


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens", "content_filter"]


class ResponseError(BaseModel):
    code: str
    message: str


class ResponseObject(BaseModel):
    """A response (``object: "response"``), also the snapshot in stream lifecycle events."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["completed", "failed", "in_progress", "incomplete"]
    error: Optional[ResponseError] = None
    incomplete_details: Optional[IncompleteDetails] = None
    instructions: Optional[str] = None
    max_output_tokens: Optional[int] = None
    model: str
    output: list[OutputItem]
    parallel_tool_calls: bool
    previous_response_id: Optional[str] = None
    reasoning: dict[str, Any]
    store: bool
    temperature: float
    text: dict[str, Any]
    tool_choice: Union[str, dict[str, Any]]
    tools: list[dict[str, Any]]
    top_p: float
    truncation: Literal["auto", "disabled"] = "disabled"
    usage: Optional[ResponseUsage] = None
    user: Optional[str] = None
    metadata: dict[str, str] = Field(default_factory=dict)
    background: bool = False


class ResponseDeleted(BaseModel):
    id: str
    object: Literal["response"] = "response"
    deleted: bool = True
