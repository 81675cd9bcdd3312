"""``POST /v1/chat/completions``: messages -> chat template -> one native prompt (n choices).

``response_format``: ``text`` adds nothing, ``json_object`` constrains to the schema
``{"type": "object"}``, ``json_schema`` to ``json_schema.schema`` (grammar-constrained decoding).
Streaming sends, per choice: a first chunk with ``delta.role = "assistant"``, content deltas, exactly
one chunk with ``finish_reason`` (empty delta); then the usage chunk if asked and ``data: [DONE]``.
With ``continue_final_message`` (or a final assistant message) the reply continues that message and
the response holds only the new text.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any, Optional

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from radixlm.srt.openai_api.common import (ServingContext, finish_reason, generate_request, grammar_params,
                                           guarded_stream, max_new_tokens, native_sampling_params, new_id,
                                           run_to_completion, sse, tokenize, usage_info)
from radixlm.srt.openai_api.logprobs import TokenStrings, chat_logprobs
from radixlm.srt.openai_api.protocol import (ChatChoice, ChatCompletionChunk, ChatCompletionRequest,
                                             ChatCompletionResponse, ChatResponseMessage, ChatStreamChoice,
                                             ChoiceLogprobs, DeltaMessage, OpenAIError, ResponseFormat)


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
    if req.tools:
        raise OpenAIError("tools (function calling) are not supported by this server yet", 400, "tools")
    if req.tool_choice not in (None, "none", "auto"):
        raise OpenAIError("tool_choice needs tools, which are not supported by this server yet", 400, "tool_choice")
    if req.functions:
        raise OpenAIError("functions (function calling) are not supported by this server yet", 400, "functions")
    if req.function_call not in (None, "none", "auto"):
        raise OpenAIError("function_call needs functions, which are not supported by this server yet", 400,
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


async def create_chat_completion(ctx: ServingContext, req: ChatCompletionRequest, request: Request) -> Response:
    """Render, validate, submit and answer (JSON or SSE)."""
    _check_unsupported(req)
    n = req.n or 1
    text = ctx.chat_template.render_text(req.messages, req.continue_final_message, req.chat_template_kwargs)
    [prompt_ids] = await tokenize(ctx, [text], "messages", add_special_tokens=False)
    requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    max_param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    budget = max_new_tokens([len(prompt_ids)], requested, None, ctx.context_len, "messages", max_param)
    schema = _response_format_schema(req.response_format)
    grammar = grammar_params(schema, req.regex, req.ebnf, schema_param="response_format")
    params = native_sampling_params(req, budget, grammar)
    top_n = (req.top_logprobs or 0) if req.logprobs else 0
    greq = generate_request([prompt_ids], params, n, req.seed, bool(req.logprobs), False, top_n,
                            bool(req.stream), req.rid, req.timeout)
    prep = await ctx.tm.prepare(greq)
    ctx.tm.check_admission(prep)
    state = _ChatState(ctx, req, n, prompt_ids, top_n)
    if req.stream:
        return StreamingResponse(guarded_stream(state.stream(prep, request)), media_type="text/event-stream")
    results = await run_to_completion(ctx.tm, prep, request)
    choices = []
    for k, result in enumerate(results):
        meta = result["meta_info"]
        reason, matched = finish_reason(meta)
        logprobs = state.logprobs(meta, 0, prompt_ids) if req.logprobs else None
        choices.append(ChatChoice(index=k, message=ChatResponseMessage(content=result["text"]), logprobs=logprobs,
                                  finish_reason=reason, matched_stop=matched))
    body = ChatCompletionResponse(id=state.id, created=state.created, model=ctx.model_name,
                                  system_fingerprint=ctx.fingerprint, choices=choices,
                                  usage=usage_info([r["meta_info"] for r in results], n))
    return Response(body.model_dump_json(), media_type="application/json")


class _ChatState:
    """Response building of one chat request (shared by the JSON and SSE paths)."""

    def __init__(self, ctx: ServingContext, req: ChatCompletionRequest, n: int, prompt_ids: list[int], top_n: int):
        self.ctx, self.req, self.n, self.prompt_ids, self.top_n = ctx, req, n, prompt_ids, top_n
        self.id = new_id("chatcmpl")
        self.created = int(time.time())
        skip = True if req.skip_special_tokens is None else req.skip_special_tokens
        self.strings = TokenStrings(ctx.tokenizer, skip)

    def logprobs(self, meta: dict, start: int, context: list[int]) -> ChoiceLogprobs:
        lps = (meta.get("output_token_logprobs") or [])[start:]
        tops = (meta.get("output_top_logprobs") or [])[start:]
        return chat_logprobs(self.strings, lps, tops, context, self.top_n)

    def _chunk(self, choice: Optional[ChatStreamChoice], usage: Any = None) -> bytes:
        body = ChatCompletionChunk(id=self.id, created=self.created, model=self.ctx.model_name,
                                   system_fingerprint=self.ctx.fingerprint, choices=[choice] if choice else [],
                                   usage=usage).model_dump()
        if usage is None:
            body.pop("usage")
        return sse(body)

    async def stream(self, prep: Any, request: Request) -> AsyncIterator[bytes]:
        """Role chunks at once (so clients see the stream open), then deltas from the
        TokenizerManager's cumulative updates, one finish chunk per choice, the usage chunk."""
        total = len(prep.msgs)
        for k in range(total):
            yield self._chunk(ChatStreamChoice(index=k, delta=DeltaMessage(role="assistant", content="")))
        sent_text, sent_lps = [0] * total, [0] * total
        metas: list[Optional[dict]] = [None] * total
        async for event in self.ctx.tm.generate_stream(prep, request.is_disconnected):
            if "error" in event:
                err = event["error"]
                raise OpenAIError(err.get("message") or "request failed", int(err.get("code") or 500))
            k = event.get("index", 0)
            meta = event["meta_info"]
            text = event["text"][sent_text[k]:]
            sent_text[k] += len(text)
            logprobs = None
            if self.req.logprobs:
                done = sent_lps[k]
                logprobs = self.logprobs(meta, done, self.prompt_ids + event["output_ids"][:done])
                sent_lps[k] += len(logprobs.content or [])
            if text or (logprobs is not None and logprobs.content):
                yield self._chunk(ChatStreamChoice(index=k, delta=DeltaMessage(content=text), logprobs=logprobs))
            reason, matched = finish_reason(meta)
            if reason is not None:
                metas[k] = meta
                yield self._chunk(ChatStreamChoice(index=k, delta=DeltaMessage(), finish_reason=reason,
                                                   matched_stop=matched))
        if self.req.stream_options is not None and self.req.stream_options.include_usage:
            yield self._chunk(None, usage_info(metas, self.n))
