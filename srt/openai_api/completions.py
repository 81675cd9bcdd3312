"""``POST /v1/completions``: prompts -> native requests -> ``text_completion`` objects or chunks.

Choice ``k`` belongs to prompt ``k // n`` (OpenAI's order). With ``echo`` the prompt text is
prepended to each choice's text (the client's string verbatim; token ids are decoded) and, with
``logprobs``, its positions come first in the logprobs with a ``null`` first entry. Streaming sends
per choice: content chunks (the first one carries the echo), one chunk with ``finish_reason``, then
an optional usage chunk (``stream_options.include_usage``) and ``data: [DONE]``.

``max_tokens: 0`` with ``echo`` (vLLM's and OpenAI's legacy way to score a prompt) runs the prefill
only (native ``max_new_tokens: 0``): each choice's text is the prompt, ``finish_reason`` ``length``,
``completion_tokens`` 0, and with ``logprobs`` the prompt tokens' logprobs (the first one null).
Without ``echo`` it is a 400, as on vLLM.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any, Optional

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from radixlm.srt.openai_api.common import (COMPLETION_PARAM_NAMES, ServingContext, finish_reason, generate_request,
                                           grammar_params, guarded_stream, max_new_tokens, native_sampling_params,
                                           new_id, run_to_completion, sse, tokenize, usage_info)
from radixlm.srt.openai_api.logprobs import TokenStrings, completion_logprobs
from radixlm.srt.openai_api.protocol import (CompletionChoice, CompletionLogprobs, CompletionRequest,
                                             CompletionResponse, OpenAIError)

DEFAULT_MAX_TOKENS = 16


async def _prompts(ctx: ServingContext, req: CompletionRequest) -> tuple[list[list[int]], list[str]]:
    """``(token ids, echo text)`` per prompt; text prompts are tokenized together (off the event
    loop when large)."""
    p = req.prompt
    if isinstance(p, str):
        items: list[Any] = [p]
    elif not p:
        raise OpenAIError("prompt is empty: give a string, a list of strings or token ids", 400, "prompt")
    elif isinstance(p[0], int):
        items = [p]
    else:
        items = list(p)
    strings = [item for item in items if isinstance(item, str)]
    encoded = iter(await tokenize(ctx, strings, "prompt") if strings else [])
    ids, texts = [], []
    for i, item in enumerate(items):
        if isinstance(item, str):
            ids.append(next(encoded))
            texts.append(item)
        else:
            if not item:
                raise OpenAIError(f"prompt.{i} is an empty token list", 400, "prompt")
            ids.append(list(item))
            texts.append(_decode_prompt(ctx, item, req))
    return ids, texts


def _decode_prompt(ctx: ServingContext, ids: list[int], req: CompletionRequest) -> str:
    if not req.echo:
        return ""
    skip = True if req.skip_special_tokens is None else req.skip_special_tokens
    try:
        return ctx.tokenizer.decode(ids, skip_special_tokens=skip)
    except Exception:  # ids outside the vocabulary: the TokenizerManager rejects them with a 400
        return ""


async def create_completion(ctx: ServingContext, req: CompletionRequest, request: Request) -> Response:
    """Validate, submit and answer (JSON or SSE). Raises ``OpenAIError``/native errors (mapped by the router)."""
    n = req.n or 1
    if req.suffix:
        raise OpenAIError("suffix is not supported", 400, "suffix")
    if req.best_of is not None and req.best_of != n:
        raise OpenAIError(f"best_of must equal n ({n}): ranking candidates is not supported", 400, "best_of")
    if req.stream_options is not None and not req.stream:
        raise OpenAIError("stream_options is only allowed with stream: true", 400, "stream_options")
    if req.max_tokens == 0 and not req.echo:
        raise OpenAIError("invalid request: max_tokens: Input should be greater than or equal to 1 (0 only with echo: "
                          "true, which returns the prompt without generating)", 400, "max_tokens")
    prompt_ids, prompt_texts = await _prompts(ctx, req)
    budget = max_new_tokens([len(x) for x in prompt_ids], req.max_tokens, DEFAULT_MAX_TOKENS, ctx.context_len,
                            "prompt", "max_tokens")
    grammar = grammar_params(req.json_schema, req.regex, req.ebnf)
    params = native_sampling_params(req, budget, grammar)
    want_lp = req.logprobs is not None
    greq = generate_request(prompt_ids, params, n, req.seed, want_lp, want_lp and bool(req.echo),
                            req.logprobs or 0, bool(req.stream), req.rid, req.timeout)
    prep = await ctx.tm.prepare(greq)
    ctx.tm.check_admission(prep)
    state = _State(ctx, req, n, prompt_ids, prompt_texts)
    if req.stream:
        return StreamingResponse(guarded_stream(state.stream(prep, request), COMPLETION_PARAM_NAMES), media_type="text/event-stream")
    results = await run_to_completion(ctx.tm, prep, request)
    choices = [state.choice(k, r) for k, r in enumerate(results)]
    body = CompletionResponse(id=state.id, created=state.created, model=ctx.model_name,
                              system_fingerprint=ctx.fingerprint, choices=choices,
                              usage=usage_info([r["meta_info"] for r in results], n))
    return Response(body.model_dump_json(), media_type="application/json")


class _State:
    """One completion request's response building (shared by the JSON and SSE paths)."""

    def __init__(self, ctx: ServingContext, req: CompletionRequest, n: int, prompt_ids: list[list[int]],
                 prompt_texts: list[str]):
        self.ctx, self.req, self.n = ctx, req, n
        self.prompt_ids, self.prompt_texts = prompt_ids, prompt_texts
        self.id = new_id("cmpl")
        self.created = int(time.time())
        skip = True if req.skip_special_tokens is None else req.skip_special_tokens
        self.strings = TokenStrings(ctx.tokenizer, skip)
        self.top_n = req.logprobs or 0

    def _echo_logprobs(self, meta: dict) -> CompletionLogprobs:
        return completion_logprobs(self.strings, meta.get("input_token_logprobs") or [],
                                   meta.get("input_top_logprobs") or [], (), 0, self.top_n)

    def _output_logprobs(self, meta: dict, start: int, context: list[int], offset: int,
                         text_chars: int) -> CompletionLogprobs:
        tops = meta.get("output_top_logprobs") or []
        return completion_logprobs(self.strings, (meta.get("output_token_logprobs") or [])[start:],
                                   tops[start:], context, offset, self.top_n,
                                   final=meta.get("finish_reason") is not None, text_chars=text_chars)

    def choice(self, k: int, result: dict) -> CompletionChoice:
        """The final choice ``k`` from its native result."""
        i = k // self.n
        meta = result["meta_info"]
        prefix = self.prompt_texts[i] if self.req.echo else ""
        logprobs = None
        if self.req.logprobs is not None:
            logprobs = self._echo_logprobs(meta) if self.req.echo else CompletionLogprobs()
            _extend(logprobs, self._output_logprobs(meta, 0, self.prompt_ids[i], len(prefix), len(result["text"])))
        reason, matched = finish_reason(meta)
        return CompletionChoice(index=k, text=prefix + result["text"], logprobs=logprobs,
                                finish_reason=reason, matched_stop=matched)

    def _chunk(self, choice: CompletionChoice, usage: Any = None) -> bytes:
        body = CompletionResponse(id=self.id, created=self.created, model=self.ctx.model_name,
                                  system_fingerprint=self.ctx.fingerprint,
                                  choices=[choice] if choice else [], usage=usage).model_dump()
        if usage is None:
            body.pop("usage")
        return sse(body)

    async def stream(self, prep: Any, request: Request) -> AsyncIterator[bytes]:
        """SSE chunks from the TokenizerManager's cumulative updates (``index`` = choice)."""
        total = len(prep.msgs)
        sent_text, sent_lps, lp_chars = [0] * total, [0] * total, [0] * total
        lp_out_chars = [0] * total  # characters of the output text the sent logprob tokens cover
        started = [False] * total
        continuous = self.req.stream_options is not None and self.req.stream_options.continuous()
        latest: list[Optional[dict]] = [None] * total  # each choice's last meta_info (continuous usage)
        metas: list[Optional[dict]] = [None] * total
        async for event in self.ctx.tm.generate_stream(prep, request.is_disconnected):
            if "error" in event:
                err = event["error"]
                raise OpenAIError(err.get("message") or "request failed", int(err.get("code") or 500))
            k = event.get("index", 0)
            i = k // self.n
            meta = event["meta_info"]
            latest[k] = meta
            usage = usage_info(latest, self.n) if continuous else None
            text = event["text"][sent_text[k]:]
            sent_text[k] += len(text)
            logprobs = None
            if not started[k] and self.req.echo:
                text = self.prompt_texts[i] + text
                lp_chars[k] = len(self.prompt_texts[i])
                if self.req.logprobs is not None:
                    logprobs = self._echo_logprobs(meta)
            if self.req.logprobs is not None:
                done = sent_lps[k]
                context = self.prompt_ids[i] + event["output_ids"][:done]
                more = self._output_logprobs(meta, done, context, lp_chars[k], sent_text[k] - lp_out_chars[k])
                sent_lps[k] += len(more.tokens)
                lp_chars[k] += sum(len(t) for t in more.tokens)
                lp_out_chars[k] += sum(len(t) for t in more.tokens)
                logprobs = logprobs or CompletionLogprobs()
                _extend(logprobs, more)
            if text or not started[k] or (logprobs is not None and logprobs.tokens):
                yield self._chunk(CompletionChoice(index=k, text=text, logprobs=logprobs), usage)
            started[k] = True
            reason, matched = finish_reason(meta)
            if reason is not None:
                metas[k] = meta
                yield self._chunk(CompletionChoice(index=k, text="", finish_reason=reason, matched_stop=matched), usage)
        if self.req.stream_options is not None and self.req.stream_options.include_usage:
            yield self._chunk(None, usage_info(metas, self.n))  # type: ignore[arg-type]


def _extend(into: CompletionLogprobs, more: CompletionLogprobs) -> None:
    into.tokens += more.tokens
    into.token_logprobs += more.token_logprobs
    into.top_logprobs += more.top_logprobs
    into.text_offset += more.text_offset
