"""``POST /v1/chat/completions``: messages -> chat template -> one native prompt (n choices).

``response_format``: ``text`` adds nothing, ``json_object`` constrains to the schema
``{"type": "object"}``, ``json_schema`` to ``json_schema.schema`` (grammar-constrained decoding).
Streaming sends, per choice: a first chunk with ``delta.role = "assistant"``, content deltas, exactly
one chunk with ``finish_reason`` (empty delta); then the usage chunk if asked and ``data: [DONE]``.
With ``continue_final_message: true`` the reply continues the final assistant message and the
response holds only the new text; without it a final assistant message is history, as in OpenAI's API.

Tools (``tool_request``): the prompt lists them (``tool_prompt``), the output is parsed for calls and,
on an xgrammar server, constrained so calls are valid (``function_call.grammar``). Messages carry
``tool_calls`` / ``reasoning_content`` (``chat_output``); streamed calls come as OpenAI's
``delta.tool_calls`` (index, id, type and name first with ``arguments: ""``, then argument fragments).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Optional

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from radixlm.srt.openai_api.common import (CHAT_PARAM_NAMES, ServingContext, finish_reason, generate_request,
                                           grammar_params, guarded_stream, max_new_tokens, native_sampling_params, new_id,
                                           run_to_completion, sse, tokenize, usage_info)
from radixlm.srt.function_call import ReasoningGrammar
from radixlm.srt.openai_api.chat_output import ChoiceOutput
from radixlm.srt.openai_api.logprobs import TokenStrings, chat_logprobs
from radixlm.srt.openai_api.protocol import (ChatChoice, ChatCompletionChunk, ChatCompletionRequest,
                                             ChatCompletionResponse, ChatStreamChoice, ChoiceLogprobs,
                                             DeltaMessage, OpenAIError, ResponseFormat)
from radixlm.srt.openai_api.tool_request import ToolPlan, output_tool_parser, plan_tools, request_tools, tool_mode
from radixlm.srt.reasoning_parser import starts_in_reasoning


def _response_format_schema(fmt: Optional[ResponseFormat]) -> Optional[Any]:
    """The JSON schema a ``response_format`` asks for (None for plain text)."""
    if fmt is None or fmt.type == "text":
        if fmt is not None and fmt.json_schema is not None:
            raise OpenAIError("response_format.json_schema is only allowed with type json_schema", 400,
                              "response_format.json_schema")
        return None
    if fmt.type == "json_object":
        return {"type": "object"}
    if fmt.json_schema is None:
        raise OpenAIError("response_format of type json_schema needs a json_schema object "
                          "({\"name\": ..., \"schema\": {...}})", 400, "response_format.json_schema")
    if fmt.json_schema.schema_ is None:
        raise OpenAIError("response_format.json_schema.schema is missing: give the JSON schema of the reply",
                          400, "response_format.json_schema.schema")
    return fmt.json_schema.schema_


def _check_unsupported(req: ChatCompletionRequest) -> None:
    if req.functions:
        raise OpenAIError("functions (the deprecated form of function calling) are not supported: send the same "
                          "definitions as tools ([{\"type\": \"function\", \"function\": {...}}])", 400, "functions")
    if req.function_call not in (None, "none", "auto"):
        raise OpenAIError("function_call needs functions, which are not supported: use tools and tool_choice", 400,
                          "function_call")
    if req.modalities is not None and any(m != "text" for m in req.modalities):
        raise OpenAIError(f"modalities {req.modalities} are not supported: this server replies with text only",
                          400, "modalities")
    if req.audio is not None:
        raise OpenAIError("audio output is not supported: this server replies with text only", 400, "audio")
    if req.web_search_options is not None:
        raise OpenAIError("web search is not supported by this server", 400, "web_search_options")
    if req.top_logprobs is not None and not req.logprobs:
        raise OpenAIError("top_logprobs needs logprobs: true", 400, "top_logprobs")
    if req.stream_options is not None and not req.stream:
        raise OpenAIError("stream_options is only allowed with stream: true", 400, "stream_options")


def _other_constraint(req: ChatCompletionRequest) -> Optional[str]:
    """The request field of an output constraint other than tools, if any."""
    if req.response_format is not None and req.response_format.type != "text":
        return "response_format"
    return "regex" if req.regex is not None else "ebnf" if req.ebnf is not None else None


@dataclass
class PreparedChat:
    """A chat request rendered, checked and admitted (``prepare_chat``): the prompt's token ids, the
    tool plan, what ``ChoiceOutput`` gets (the reasoning split, None when off or with
    ``separate_reasoning: false``; the tool-call parser, None when the output is not parsed for
    calls), the TokenizerManager's prepared request and the number of top logprobs."""

    prompt_ids: list[int]
    plan: ToolPlan
    reasoning: Any
    tool_parser: Any
    prep: Any
    top_n: int


async def prepare_chat(ctx: ServingContext, req: ChatCompletionRequest) -> PreparedChat:
    """Everything before generation, shared by ``/v1/chat/completions`` and ``/v1/responses``: checks,
    rendering, the tool plan and its grammar, tokenizing, the token budget, admission.

    Raises:
        OpenAIError(400 ...): any problem of the request (named by its chat field).
    """
    _check_unsupported(req)
    n = req.n or 1
    schema = _response_format_schema(req.response_format)
    grammar = grammar_params(schema, req.regex, req.ebnf, schema_param="response_format")
    text, plan, reasoning = _render_and_plan(ctx, req)
    [prompt_ids] = await tokenize(ctx, [text], "messages", add_special_tokens=False)
    requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    max_param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    budget = max_new_tokens([len(prompt_ids)], requested, None, ctx.context_len, "messages", max_param)
    if plan.structural_tag is not None:
        grammar = {"structural_tag": plan.structural_tag}
    params = native_sampling_params(req, budget, grammar)
    if plan.mode in ("required", "named"):
        # The output is only the call(s), ended by their grammar: a stop string or token would cut
        # a call short (an agent's usual stop ["\n"] ended one at "<tool_call>"), so none applies.
        params["stop"], params["stop_token_ids"] = None, None
    if plan.parse and ctx.tool_markers_special and req.skip_special_tokens is None:
        params["skip_special_tokens"] = False  # the parser must see its markers
    top_n = (req.top_logprobs or 0) if req.logprobs else 0
    greq = generate_request([prompt_ids], params, n, req.seed, bool(req.logprobs), False, top_n,
                            bool(req.stream), req.rid, req.timeout)
    prep = await ctx.tm.prepare(greq)
    ctx.tm.check_admission(prep)
    separate = reasoning if req.separate_reasoning is not False else None
    parser = output_tool_parser(ctx.tool_parser, plan)
    return PreparedChat(prompt_ids, plan, separate, parser, prep, top_n)


async def create_chat_completion(ctx: ServingContext, req: ChatCompletionRequest, request: Request) -> Response:
    """Render, validate, submit and answer (JSON or SSE)."""
    chat = await prepare_chat(ctx, req)
    n, prompt_ids, prep = req.n or 1, chat.prompt_ids, chat.prep
    state = _ChatState(ctx, req, n, prompt_ids, chat.top_n, chat.reasoning, chat.tool_parser)
    if req.stream:
        return StreamingResponse(guarded_stream(state.stream(prep, request), CHAT_PARAM_NAMES), media_type="text/event-stream")
    results = await run_to_completion(ctx.tm, prep, request)
    choices = []
    for k, result in enumerate(results):
        meta = result["meta_info"]
        reason, matched = finish_reason(meta)
        logprobs = state.logprobs(meta, 0, prompt_ids, len(result["text"])) if req.logprobs else None
        out = state.new_output()
        out.feed(result["text"])
        out.finish()
        choices.append(ChatChoice(index=k, message=out.message(), logprobs=logprobs,
                                  finish_reason=out.finish_reason(reason), matched_stop=matched))
    body = ChatCompletionResponse(id=state.id, created=state.created, model=ctx.model_name,
                                  system_fingerprint=ctx.fingerprint, choices=choices,
                                  usage=usage_info([r["meta_info"] for r in results], n))
    return Response(body.model_dump_json(), media_type="application/json")


def _render_and_plan(ctx: ServingContext, req: ChatCompletionRequest) -> tuple[str, ToolPlan, Any]:
    """The prompt (offering the tools unless ``tool_choice`` is none), the tool plan, and the
    reasoning split ``(format, output starts inside)`` or None."""
    tools = request_tools(req)
    mode, _ = tool_mode(req, tools)
    text = ctx.chat_template.render_text(req.messages, req.continue_final_message, req.chat_template_kwargs,
                                         tools=tools if mode != "none" else None, tool_parser=ctx.tool_parser,
                                         add_generation_prompt=req.add_generation_prompt is not False)
    reasoning, grammar_reasoning = None, None
    if ctx.reasoning is not None:
        inside = starts_in_reasoning(ctx.reasoning, text)
        reasoning = (ctx.reasoning, inside)
        grammar_reasoning = ReasoningGrammar(ctx.reasoning.start, ctx.reasoning.end, inside)
    plan = ToolPlan()
    if mode != "none":
        plan = plan_tools(req, tools, ctx.tool_parser, ctx.tool_validator, grammar_reasoning, _other_constraint(req))
    return text, plan, reasoning


class _ChatState:
    """Response building of one chat request (shared by the JSON and SSE paths)."""

    def __init__(self, ctx: ServingContext, req: ChatCompletionRequest, n: int, prompt_ids: list[int], top_n: int,
                 reasoning: Any = None, tool_parser: Any = None):
        self.ctx, self.req, self.n, self.prompt_ids, self.top_n = ctx, req, n, prompt_ids, top_n
        self.reasoning, self.tool_parser = reasoning, tool_parser
        self.id = new_id("chatcmpl")
        self.created = int(time.time())
        skip = True if req.skip_special_tokens is None else req.skip_special_tokens
        self.strings = TokenStrings(ctx.tokenizer, skip)

    def new_output(self) -> ChoiceOutput:
        """The parsers of one choice."""
        return ChoiceOutput(self.reasoning, self.tool_parser)

    def logprobs(self, meta: dict, start: int, context: list[int], text_chars: int) -> ChoiceLogprobs:
        """Logprobs of output positions ``start`` on; ``text_chars``: characters of the raw output
        text (before the reasoning and tool parsers) they may cover (``fit_to_text``)."""
        lps = (meta.get("output_token_logprobs") or [])[start:]
        tops = (meta.get("output_top_logprobs") or [])[start:]
        return chat_logprobs(self.strings, lps, tops, context, self.top_n,
                             final=meta.get("finish_reason") is not None, text_chars=text_chars)

    def _chunk(self, choice: Optional[ChatStreamChoice], usage: Any = None) -> bytes:
        return sse(ChatCompletionChunk(id=self.id, created=self.created, model=self.ctx.model_name,
                                       system_fingerprint=self.ctx.fingerprint, choices=[choice] if choice else [],
                                       usage=usage).dump())

    async def stream(self, prep: Any, request: Request) -> AsyncIterator[bytes]:
        """Role chunks at once (so clients see the stream open), then deltas from the
        TokenizerManager's cumulative updates, one finish chunk per choice, the usage chunk."""
        total = len(prep.msgs)
        continuous = self.req.stream_options is not None and self.req.stream_options.continuous()
        latest: list[Optional[dict]] = [None] * total  # each choice's last meta_info (continuous usage)
        # the role chunks come before any output: the prompt's tokens only
        opening = usage_info([{"prompt_tokens": len(self.prompt_ids)}], 1) if continuous else None
        for k in range(total):
            yield self._chunk(ChatStreamChoice(index=k, delta=DeltaMessage(role="assistant", content="")), opening)
        sent_text, sent_lps, lp_chars = [0] * total, [0] * total, [0] * total
        outputs = [self.new_output() for _ in range(total)]
        metas: list[Optional[dict]] = [None] * total
        async for event in self.ctx.tm.generate_stream(prep, request.is_disconnected):
            if "error" in event:
                err = event["error"]
                raise OpenAIError(err.get("message") or "request failed", int(err.get("code") or 500))
            k = event.get("index", 0)
            meta = event["meta_info"]
            latest[k] = meta
            usage = usage_info(latest, self.n) if continuous else None
            text = event["text"][sent_text[k]:]
            sent_text[k] += len(text)
            logprobs = None
            if self.req.logprobs:
                done = sent_lps[k]
                logprobs = self.logprobs(meta, done, self.prompt_ids + event["output_ids"][:done],
                                         sent_text[k] - lp_chars[k])
                sent_lps[k] += len(logprobs.content or [])
                lp_chars[k] += sum(len(c.token) for c in logprobs.content or [])
            parts = outputs[k].feed(text) if text else None
            if parts or (logprobs is not None and logprobs.content):
                delta = parts.message() if parts else DeltaMessage(content="")
                yield self._chunk(ChatStreamChoice(index=k, delta=delta, logprobs=logprobs), usage)
            reason, matched = finish_reason(meta)
            if reason is not None:
                metas[k] = meta
                held = outputs[k].finish()
                if held:
                    yield self._chunk(ChatStreamChoice(index=k, delta=held.message()), usage)
                yield self._chunk(ChatStreamChoice(index=k, delta=DeltaMessage(),
                                                   finish_reason=outputs[k].finish_reason(reason),
                                                   matched_stop=matched), usage)
        if self.req.stream_options is not None and self.req.stream_options.include_usage:
            yield self._chunk(None, usage_info(metas, self.n))
