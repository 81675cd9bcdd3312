"""``POST /v1/responses`` (OpenAI's Responses API), ``GET`` / ``DELETE /v1/responses/{id}``.

A request becomes a chat request and goes through the chat route's preparation (``chat.prepare_chat``:
template, tool plan and grammar, token budget, admission), so tools, ``tool_choice``,
``parallel_tool_calls``, structured output and reasoning behave exactly as on
``/v1/chat/completions``; only the shapes differ:

* ``input``: a string (one user message) or items: messages (role ``user`` / ``system`` /
  ``developer`` / ``assistant``, content a string or ``input_text`` / ``output_text`` parts),
  ``function_call`` items (an assistant turn's calls; consecutive ones form one turn) and
  ``function_call_output`` items (``role: "tool"`` messages, ``call_id`` -> ``tool_call_id``; the call
  must come earlier). ``reasoning`` items are accepted and left out of the prompt. ``instructions``
  is a system message before everything (a previous response's are not carried over).
* ``tools``: flat function tools (``{"type": "function", "name", "description", "parameters",
  "strict"}``); ``tool_choice`` ``{"type": "function", "name": ...}``; ``text.format`` ``text`` /
  ``json_object`` / ``json_schema`` (flat: ``name``, ``schema``, ``strict``) = chat's
  ``response_format``; ``max_output_tokens`` = ``max_completion_tokens``. A 400 of the chat checks
  names the Responses field (``tools.0.parameters``, ``tool_choice.name``, ``text.format``,
  ``max_output_tokens``, ``input``).
* output items, events: ``responses_stream.OutputBuilder``. ``status``: ``completed``; ``incomplete``
  with ``incomplete_details.reason: "max_output_tokens"`` when the token limit (or the context) cut
  the output; ``failed`` with ``error`` when the request was aborted (``timeout``), partial output kept.

``store`` (default true, as OpenAI's): the response, and the conversation that led to it, are kept in
memory (``ResponseStore``, the newest ``--responses-store-size`` responses) for ``GET
/v1/responses/{id}`` and ``previous_response_id``, which continues that conversation (its input and
output items come before the new input). Nothing outlives the process; an unknown or evicted id is
a 400 (``previous_response_not_found``) or a 404.

Refused with a 400 naming the field: built-in tools (``web_search``, ``file_search``, ...) and their
items and tool choices, ``allowed_tools``, images/files/audio, ``background: true``,
``conversation``, ``prompt``, ``truncation: "auto"``, logprobs (``top_logprobs``, ``include``
``message.output_text.logprobs``), ``max_tool_calls`` other than 1 (1 = ``parallel_tool_calls:
false``).
"""

from __future__ import annotations

import json
import re
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from pydantic import TypeAdapter, ValidationError

from radixlm.managers.tokenizer_manager import ClientDisconnected
from radixlm.srt.json_body import parse_json_body
from radixlm.srt.openai_api.chat import PreparedChat, prepare_chat
from radixlm.srt.openai_api.chat_output import ChoiceOutput
from radixlm.srt.openai_api.common import RESPONSES_PARAM_NAMES, ServingContext, error_body, finish_reason, \
    run_to_completion, validation_message
from radixlm.srt.openai_api.protocol import ChatCompletionRequest, OpenAIError
from radixlm.srt.openai_api.responses_protocol import (BuiltinItem, BuiltinToolSpec, FunctionCallItem,
                                                       FunctionCallOutputItem, InputItem, MediaPart, MessageItem,
                                                       OtherToolChoice, ReasoningInputItem, RefusalPart,
                                                       ResponseDeleted, ResponseObject, ResponsesRequest)
from radixlm.srt.openai_api.responses_stream import OutputBuilder, item_id

DEFAULT_STORE_SIZE = 1024
_ITEMS = TypeAdapter(list[InputItem])
_IGNORED_INCLUDES = {"reasoning.encrypted_content"}  # nothing is encrypted here: no such content exists


# ---- the store ----------------------------------------------------------------------------------------
@dataclass
class StoredResponse:
    """A stored response: its wire object and the conversation items up to and including its output
    (without any ``instructions``)."""

    response: dict[str, Any]
    conversation: tuple[Any, ...]


class ResponseStore:
    """The newest ``max_entries`` stored responses, in memory (0: nothing is stored)."""

    def __init__(self, max_entries: int = DEFAULT_STORE_SIZE):
        self.max_entries = max_entries
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def put(self, response: dict[str, Any], conversation: tuple[Any, ...]) -> None:
        if self.max_entries <= 0:
            return
        self._entries[response["id"]] = StoredResponse(response, conversation)
        self._entries.move_to_end(response["id"])
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def get(self, response_id: str) -> Optional[StoredResponse]:
        return self._entries.get(response_id)

    def delete(self, response_id: str) -> bool:
        return self._entries.pop(response_id, None) is not None

    def __len__(self) -> int:
        return len(self._entries)


def not_found(response_id: str) -> OpenAIError:
    return OpenAIError(f"Response with id '{response_id}' not found.", 404, "response_id", "response_not_found")


def unsupported_route(method: str, sub_route: str) -> OpenAIError:
    """404 for the Responses API's routes this server does not have (``input_items``, ``input_tokens``,
    ``cancel``...), naming them rather than reporting a response id that does not exist."""
    return OpenAIError(f"{method} /v1/responses/{sub_route} is not supported by this server (it has POST "
                       "/v1/responses, and GET and DELETE /v1/responses/{response_id})", 404, None, "not_found")


def retrieve(store: ResponseStore, response_id: str) -> Response:
    if "/" in response_id:
        raise unsupported_route("GET", response_id)
    entry = store.get(response_id)
    if entry is None:
        raise not_found(response_id)
    return Response(json.dumps(entry.response), media_type="application/json")


def delete(store: ResponseStore, response_id: str) -> Response:
    if "/" in response_id:
        raise unsupported_route("DELETE", response_id)
    if not store.delete(response_id):
        raise not_found(response_id)
    return Response(ResponseDeleted(id=response_id).model_dump_json(), media_type="application/json")


# ---- request parsing and errors -------------------------------------------------------------------------
def parse_request(body: bytes) -> ResponsesRequest:
    """The request, or an OpenAI 400 whose ``param`` is the Responses field (union tags removed).

    Raises:
        OpenAIError(400): the body does not validate.
        UnpairedSurrogateError(400): a string of the body holds a lone UTF-16 surrogate.
    """
    try:
        return parse_json_body(ResponsesRequest, body)
    except ValidationError as e:
        message, param = validation_message([_without_tags(err) for err in e.errors()])
        raise OpenAIError(message, 400, param) from None


def _without_tags(err: Any) -> dict:
    """pydantic names the branch of a tagged union in ``loc`` (``input.0.message.content``): the part
    after a list index, or after ``format``, is such a tag."""
    loc = list(err.get("loc", ()))
    kept = []
    for i, part in enumerate(loc):
        prev = loc[i - 1] if i else None
        if isinstance(part, str) and (part.startswith("tagged-union[") or isinstance(prev, int) or (
                isinstance(prev, str) and (prev in ("format", "tool_choice") or prev.startswith("tagged-union[")))):
            continue
        kept.append(part)
    return {**err, "loc": tuple(kept)}


_RENAMES = [(re.compile(r"\btools\.(\d+)\.function\."), r"tools.\1."), (re.compile(r"\btool_choice\.function\."),
                                                                        "tool_choice."),
            (re.compile(r"\bresponse_format(\.json_schema)?(\.schema)?\b"), "text.format"),
            (re.compile(r"\bmax_completion_tokens\b"), "max_output_tokens")]


def _renamed(e: OpenAIError) -> OpenAIError:
    """A chat-route error with the Responses field names (message and ``param``)."""
    message, param = e.message, e.param
    for pattern, repl in _RENAMES:
        message = pattern.sub(repl, message)
        param = pattern.sub(repl, param) if param else param
    if param and param.startswith("messages"):
        param = "input"
    message = re.sub(r"\bmessages\.\d+(\.[\w.]+)?", "input", message).replace("/v1/chat/completions", "/v1/responses")
    return OpenAIError(message, e.status, param, e.code)


def _check_unsupported(req: ResponsesRequest) -> None:
    def refuse(message: str, param: str) -> None:
        raise OpenAIError(message, 400, param)

    if req.background:
        refuse("background responses are not supported by this server: send background: false (or leave it out) "
               "and wait for the answer, or stream it", "background")
    if req.conversation is not None:
        refuse("conversations are not supported by this server: chain responses with previous_response_id, or "
               "send the whole history as input", "conversation")
    if req.prompt is not None:
        refuse("reusable prompts (prompt) are not supported by this server: send instructions and input", "prompt")
    if req.truncation == "auto":
        refuse("truncation 'auto' is not supported: an input longer than the context is a 400 "
               "(context_length_exceeded); use 'disabled'", "truncation")
    if req.top_logprobs:
        refuse("logprobs are not supported on /v1/responses (use /v1/chat/completions)", "top_logprobs")
    for i, name in enumerate(req.include or []):
        if name == "message.output_text.logprobs":
            refuse("logprobs are not supported on /v1/responses (use /v1/chat/completions)", f"include.{i}")
    if req.max_tool_calls is not None and req.max_tool_calls != 1:
        refuse("max_tool_calls is only supported as 1 (at most one call, like parallel_tool_calls: false)",
               "max_tool_calls")
    if req.stream_options is not None and not req.stream:
        refuse("stream_options is only allowed with stream: true", "stream_options")
    for i, tool in enumerate(req.tools or []):
        if isinstance(tool, BuiltinToolSpec):
            refuse(f"tools.{i}: the built-in tool {tool.type!r} is not supported by this server; only function "
                   "tools ({\"type\": \"function\", \"name\": ..., \"parameters\": {...}})", f"tools.{i}.type")
    if isinstance(req.tool_choice, OtherToolChoice):
        refuse(f"tool_choice {{\"type\": {req.tool_choice.type!r}}} is not supported by this server; use 'none', "
               "'auto', 'required' or {\"type\": \"function\", \"name\": ...}", "tool_choice.type")


# ---- input items -> chat messages -------------------------------------------------------------------------
def _text_of(content: Any, where: str, allow_refusal: bool = True) -> str:
    """A message's (or a tool output's) content as one string; media parts are a 400."""
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if isinstance(part, MediaPart):
            raise OpenAIError(f"{where}.{j}: {part.type} content is not supported by this server (text only)", 400,
                              f"{where}.{j}.type")
        if isinstance(part, RefusalPart):
            if not allow_refusal:
                raise OpenAIError(f"{where}.{j}: a refusal part is only allowed in assistant messages", 400,
                                  f"{where}.{j}.type")
            texts.append(part.refusal)
        else:
            texts.append(part.text)
    return "".join(texts)


def to_messages(instructions: Optional[str], items: Sequence[Any], first_input: int) -> list[dict[str, Any]]:
    """Chat messages of the conversation ``items`` (``first_input``: the index of the request's own
    first item; errors name ``input.{i - first_input}``).

    Raises:
        OpenAIError(400): a built-in tool item, media content, arguments that are not JSON, an output
            whose call is not earlier in the conversation.
    """
    messages: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    calls: set[str] = set()
    for i, item in enumerate(items):
        where = f"input.{i - first_input}"
        if isinstance(item, BuiltinItem):
            raise OpenAIError(f"{where}: {item.type} items are not supported by this server (no built-in tools)", 400,
                              f"{where}.type")
        if isinstance(item, ReasoningInputItem):
            continue
        if isinstance(item, MessageItem):
            text = _text_of(item.content, f"{where}.content", allow_refusal=item.role == "assistant")
            messages.append({"role": item.role, "content": text})
        elif isinstance(item, FunctionCallItem):  # arguments that are not JSON pass as text (tool_prompt)
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments or "{}"}}
            calls.add(item.call_id)
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":  # the calls of one turn, after its text
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            if item.call_id not in calls:
                raise OpenAIError(f"{where}.call_id: no function_call with call_id {item.call_id!r} comes before this "
                                  "function_call_output", 400, f"{where}.call_id")
            messages.append({"role": "tool", "tool_call_id": item.call_id,
                             "content": _text_of(item.output, f"{where}.output", allow_refusal=False)})
    if not any(m["role"] != "system" for m in messages):
        raise OpenAIError("input: needs at least one message or item besides instructions", 400, "input")
    return messages


def _chat_request(req: ResponsesRequest, messages: list[dict[str, Any]]) -> ChatCompletionRequest:
    tools = [{"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
             for t in req.tools or []]
    choice: Any = req.tool_choice
    if choice is not None and not isinstance(choice, str):
        choice = {"type": "function", "function": {"name": choice.name}}
    fmt = req.text.format if req.text is not None else None
    response_format = None
    if fmt is not None and fmt.type == "json_schema":
        response_format = {"type": "json_schema", "json_schema": fmt.model_dump(by_alias=True, exclude={"type"},
                                                                                exclude_none=True)}
    elif fmt is not None:
        response_format = {"type": fmt.type}
    parallel = req.parallel_tool_calls
    if req.max_tool_calls == 1:
        parallel = False
    body = {
        "messages": messages, "continue_final_message": False, "stream": bool(req.stream),
        "max_completion_tokens": req.max_output_tokens, "temperature": req.temperature, "top_p": req.top_p,
        "tools": tools or None, "tool_choice": choice, "parallel_tool_calls": parallel,
        "response_format": response_format, "top_k": req.top_k, "min_p": req.min_p,
        "frequency_penalty": req.frequency_penalty, "presence_penalty": req.presence_penalty, "seed": req.seed,
        "stop": req.stop, "stop_token_ids": req.stop_token_ids, "min_tokens": req.min_tokens,
        "ignore_eos": req.ignore_eos, "skip_special_tokens": req.skip_special_tokens, "regex": req.regex,
        "ebnf": req.ebnf, "chat_template_kwargs": req.chat_template_kwargs, "separate_reasoning": req.separate_reasoning,
        "rid": req.rid, "timeout": req.timeout,
    }
    return ChatCompletionRequest.model_validate({k: v for k, v in body.items() if v is not None})


# ---- the response -----------------------------------------------------------------------------------------
@dataclass
class _Response:
    """One response being answered: the echoed request fields and the output."""

    ctx: ServingContext
    req: ResponsesRequest
    store: ResponseStore
    conversation: tuple[Any, ...]
    chat: PreparedChat
    id: str = field(default_factory=lambda: item_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        self.builder = OutputBuilder(ChoiceOutput(self.chat.reasoning, self.chat.tool_parser), bool(self.req.stream))

    @property
    def stored(self) -> bool:
        return self.req.store is not False and self.store.max_entries > 0

    def body(self, status: str, meta: Optional[dict] = None, error: Optional[dict] = None) -> dict[str, Any]:
        """The response object (``meta``: the native ``meta_info`` once finished, for ``usage``)."""
        req = self.req
        fmt = req.text.format.model_dump(by_alias=True, exclude_none=True) if req.text and req.text.format else \
            {"type": "text"}
        choice: Any = req.tool_choice if req.tool_choice is not None else ("auto" if req.tools else "none")
        if not isinstance(choice, str):
            choice = choice.model_dump()
        tools = []
        for t in req.tools or []:
            tool = t.model_dump()
            tool["strict"] = True if t.strict is None else t.strict  # the grammar holds every call to the schema
            tools.append(tool)
        usage = None
        if meta is not None:
            reasoning_tokens = len(self.ctx.tokenizer.encode(self.builder.reasoning, add_special_tokens=False)) \
                if self.builder.reasoning else 0
            prompt, completion = int(meta.get("prompt_tokens", 0)), int(meta.get("completion_tokens", 0))
            usage = {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": int(meta.get("cached_tokens", 0)),
                                                                      "cache_write_tokens": 0},
                     "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
                     "total_tokens": prompt + completion}
        body = {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status, "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "model": self.ctx.model_name, "output": self.builder.items if status != "in_progress" else [],
            "parallel_tool_calls": req.parallel_tool_calls is not False and req.max_tool_calls != 1,
            "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": req.reasoning.effort if req.reasoning else None,
                          "summary": req.reasoning.summary if req.reasoning else None},
            "store": self.stored, "temperature": 1.0 if req.temperature is None else req.temperature,
            "text": {"format": fmt, "verbosity": (req.text.verbosity if req.text else None) or "medium"},
            "tool_choice": choice, "tools": tools, "top_p": 1.0 if req.top_p is None else req.top_p,
            "truncation": req.truncation or "disabled", "usage": usage, "user": req.user,
            "metadata": req.metadata or {}, "background": False,
        }
        return ResponseObject.model_validate(body).model_dump(mode="json")

    def finish(self, meta: dict) -> dict[str, Any]:
        """Close the output; the final object (stored when ``store``)."""
        reason, _ = finish_reason(meta)
        status = {"stop": "completed", "length": "incomplete"}.get(reason or "", "failed")
        self.builder.finish(incomplete=status != "completed")
        error = None
        if status == "failed":
            fr = meta.get("finish_reason") or {}
            error = {"code": "server_error", "message": fr.get("message") or "the request was aborted"}
        body = self.body(status, meta, error)
        if self.stored:  # a call cut short is no call: it stays out of the conversation (its arguments
            # may not be JSON), so a function_call_output for it is a 400 later
            kept = [i for i in body["output"] if i["type"] != "function_call" or i["status"] == "completed"]
            self.store.put(body, self.conversation + tuple(_ITEMS.validate_python(kept)))
        return body

    async def stream(self, request: Request) -> AsyncIterator[bytes]:
        """Lifecycle events around the builder's item events; an error mid-stream becomes an ``error``
        event and ``response.failed``."""
        b = self.builder
        b.event("response.created", response=self.body("in_progress"))
        b.event("response.in_progress", response=self.body("in_progress"))
        for chunk in b.drain():
            yield chunk
        try:
            sent, meta = 0, None
            async for event in self.ctx.tm.generate_stream(self.chat.prep, request.is_disconnected):
                if "error" in event:
                    err = event["error"]
                    raise OpenAIError(err.get("message") or "request failed", int(err.get("code") or 500))
                text = event["text"][sent:]
                sent += len(text)
                b.feed(text)
                if finish_reason(event["meta_info"])[0] is not None:
                    meta = event["meta_info"]
                for chunk in b.drain():
                    yield chunk
            body = self.finish(meta or {})
            kind = {"completed": "response.completed", "incomplete": "response.incomplete"}.get(body["status"],
                                                                                                 "response.failed")
            b.event(kind, response=body)
        except ClientDisconnected:
            return
        except Exception as e:  # noqa: BLE001 - the status line is sent; report in-band
            _, err = error_body(e, RESPONSES_PARAM_NAMES)
            b.event("error", code=err["error"]["code"] or err["error"]["type"], message=err["error"]["message"],
                    param=err["error"]["param"])
            b.event("response.failed", response=self.body("failed", error={"code": "server_error",
                                                                            "message": err["error"]["message"]}))
        for chunk in b.drain():
            yield chunk


async def create_response(ctx: ServingContext, store: ResponseStore, req: ResponsesRequest,
                          request: Request) -> Response:
    """Check, convert, prepare (as chat), answer (JSON or SSE)."""
    _check_unsupported(req)
    history: tuple[Any, ...] = ()
    if req.previous_response_id is not None:
        entry = store.get(req.previous_response_id)
        if entry is None:
            raise OpenAIError(f"Previous response with id '{req.previous_response_id}' not found.", 400,
                              "previous_response_id", "previous_response_not_found")
        history = entry.conversation
    own = (MessageItem(role="user", content=req.input),) if isinstance(req.input, str) else tuple(req.input)
    conversation = history + own
    messages = to_messages(req.instructions, conversation, len(history))
    try:
        chat = await prepare_chat(ctx, _chat_request(req, messages))
    except OpenAIError as e:
        raise _renamed(e) from None
    state = _Response(ctx, req, store, conversation, chat)
    if req.stream:
        return StreamingResponse(state.stream(request), media_type="text/event-stream")
    (result,) = await run_to_completion(ctx.tm, chat.prep, request)
    state.builder.feed(result["text"])
    return Response(json.dumps(state.finish(result["meta_info"])), media_type="application/json")


__all__ = ["DEFAULT_STORE_SIZE", "ResponseStore", "create_response", "delete", "parse_request", "retrieve"]
