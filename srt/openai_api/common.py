"""Pieces shared by the completions and chat handlers: OpenAI fields -> native sampling params,
context-length checks, ``GenerateRequest`` building (``n`` and ``seed``), finish reasons, usage,
SSE framing and the exception -> OpenAI error mapping.

``seed`` with ``n > 1``: choice ``j`` samples with ``sampling_seed = seed + j`` (``copy_seed``), so the n choices
differ, choice 0 equals the same request with ``n = 1``, and every choice is reproducible alone or
in any batch (the engine's per-request seeds do not depend on the batch).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import uuid
from collections.abc import AsyncIterator, Mapping
from types import MappingProxyType
from typing import Any, Optional, Sequence

import msgspec
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from radixlm.managers.prompt_tokenizer import PromptTooLongError
from radixlm.managers.tokenizer_manager import ClientDisconnected, GenerateRequest, RequestError
from radixlm.managers.validation import InvalidRequestError
from radixlm.srt.openai_api.protocol import OpenAIError, PromptTokensDetails, UsageInfo, openai_error_body
from radixlm.srt.sampling_params import copy_seed

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class ServingContext:
    """What the handlers need: the TokenizerManager, the tokenizer, the served model id, the
    context length (tokens) and the ``system_fingerprint`` reported with every response; for chat
    the template, the tool-call parser (``function_call.ToolCallParser``) and its grammar check
    (``tool_request.ToolValidator``), the reasoning format (``reasoning_parser.ReasoningFormat``,
    None: off) and whether the parser's markers are special tokens (kept in the text then)."""

    tm: Any
    tokenizer: Any
    model_name: str
    context_len: int
    fingerprint: str
    chat_template: Any = None
    tool_parser: Any = None
    tool_validator: Any = None
    reasoning: Any = None
    tool_markers_special: bool = False


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


# ---- request -> native ------------------------------------------------------------------------------
def native_sampling_params(req: Any, max_new_tokens: int, grammar: dict[str, str]) -> dict[str, Any]:
    """The ``sampling_params`` dict of ``/generate`` for an OpenAI request (unset fields omitted,
    so the native defaults apply: temperature 1, top_p 1, no penalties)."""
    params = {
        "max_new_tokens": max_new_tokens, "min_new_tokens": req.min_tokens, "stop": req.stop,
        "stop_token_ids": req.stop_token_ids, "temperature": req.temperature, "top_p": req.top_p,
        "top_k": req.top_k, "min_p": req.min_p, "frequency_penalty": req.frequency_penalty,
        "presence_penalty": req.presence_penalty, "repetition_penalty": req.repetition_penalty,
        "logit_bias": req.logit_bias, "ignore_eos": req.ignore_eos,
        "skip_special_tokens": req.skip_special_tokens,
        "no_stop_trim": req.no_stop_trim, "include_stop_str_in_output": req.include_stop_str_in_output, **grammar,
    }
    return {k: v for k, v in params.items() if v is not None}


def grammar_params(json_schema: Any = None, regex: Optional[str] = None, ebnf: Optional[str] = None,
                   schema_param: str = "json_schema") -> dict[str, str]:
    """At most one constraint, as the native ``json_schema`` (JSON text) / ``regex`` / ``ebnf``."""
    given = {k: v for k, v in ((schema_param, json_schema), ("regex", regex), ("ebnf", ebnf)) if v is not None}
    if len(given) > 1:
        raise OpenAIError(f"give at most one output constraint, got {' and '.join(given)}", 400, list(given)[1])
    if json_schema is not None and not isinstance(json_schema, str):
        json_schema = json.dumps(json_schema)
    out = {"json_schema": json_schema, "regex": regex, "ebnf": ebnf}
    return {k: v for k, v in out.items() if v is not None}


async def tokenize(ctx: ServingContext, texts: list[str], prompt_param: str,
                   add_special_tokens: bool = True) -> list[list[int]]:
    """Token ids of ``texts``, large ones tokenized off the event loop (``PromptTokenizer``).

    Raises:
        OpenAIError(400, code ``context_length_exceeded``): a text certainly longer than the
            context, found before tokenizing it.
    """
    try:
        return await ctx.tm.prompt_tokenizer.encode(texts, add_special_tokens)
    except PromptTooLongError as e:
        raise OpenAIError(f"This model's maximum context length is {e.context_len} tokens, but the prompt has at "
                          f"least {e.min_tokens} tokens. Please shorten the prompt.", 400, prompt_param,
                          "context_length_exceeded") from None


def max_new_tokens(prompt_lens: Sequence[int], requested: Optional[int], default: Optional[int],
                   context_len: int, prompt_param: str, max_param: str) -> int:
    """Check the prompts against the context and pick ``max_new_tokens``.

    ``requested`` (from the client) must fit after the longest prompt; without it ``default``
    (None = the rest of the context) is clamped to what fits.

    Raises:
        OpenAIError(400, code ``context_length_exceeded``): naming both lengths.
    """
    longest = max(prompt_lens)
    if longest >= context_len:
        raise OpenAIError(f"This model's maximum context length is {context_len} tokens, but the prompt has "
                          f"{longest} tokens. Please shorten the prompt.", 400, prompt_param,
                          "context_length_exceeded")
    room = context_len - longest
    if requested is None:
        return room if default is None else min(default, room)
    if requested > room:
        raise OpenAIError(f"This model's maximum context length is {context_len} tokens. However, you requested "
                          f"{longest + requested} tokens ({longest} in the prompt, {requested} for the "
                          f"completion). Please reduce the prompt or {max_param} (at most {room} with this "
                          f"prompt).", 400, max_param,
                          "context_length_exceeded")
    return requested


def generate_request(prompts: list[list[int]], params: dict[str, Any], n: int, seed: Optional[int],
                     logprobs: bool, echo_logprobs: bool, top_logprobs: int, stream: bool,
                     rid: Optional[str], timeout: Optional[float] = None) -> GenerateRequest:
    """One entry per prompt (or per prompt x choice when seeded); results come back prompt-major.
    ``timeout``: seconds the whole request may take (None: only the server's limit)."""
    if seed is not None and n > 1:
        entries = [(ids, {**params, "sampling_seed": copy_seed(seed, j)}) for ids in prompts for j in range(n)]
    else:
        extra = {"n": n} if n > 1 else {}
        if seed is not None:
            extra["sampling_seed"] = seed
        entries = [(ids, {**params, **extra}) for ids in prompts]
    count = len(entries)
    rids = None
    if rid is not None:
        rids = [rid] if count == 1 else [f"{rid}_{i}" for i in range(count)]
    return GenerateRequest(
        prompts=[list(ids) for ids, _ in entries], sampling_params=[p for _, p in entries], rids=rids,
        return_logprob=[logprobs] * count, logprob_start_len=[0 if echo_logprobs else -1] * count,
        top_logprobs_num=[top_logprobs] * count, stream=stream, is_batch=True, timeout=timeout)


async def run_to_completion(tm: Any, prep: Any, request: Any) -> list[dict]:
    """``tm.generate`` as a list of native results (prompt-major, then choice)."""
    out = await tm.generate(prep, request.is_disconnected)
    return out if isinstance(out, list) else [out]


# ---- native -> response ------------------------------------------------------------------------------
def finish_reason(meta: dict) -> tuple[Optional[str], Optional[Any]]:
    """``(finish_reason, matched_stop)`` from the native ``meta_info``: stop | length | abort."""
    fr = meta.get("finish_reason")
    if not fr:
        return None, None
    return fr["type"], fr.get("matched") if fr["type"] == "stop" else None


def usage_info(metas: Sequence[Optional[dict]], n: int) -> UsageInfo:
    """Usage over all choices: each prompt's tokens (and cache hits) count once, completions all."""
    prompt = cached = completion = 0
    tiers: Optional[dict[str, int]] = None
    for k, meta in enumerate(metas):
        if meta is None:
            continue
        completion += meta.get("completion_tokens", 0)
        if k % n == 0:
            prompt += meta.get("prompt_tokens", 0)
            cached += meta.get("cached_tokens", 0)
            if meta.get("cached_tokens_details") is not None:
                tiers = tiers or {}
                for tier, count in meta["cached_tokens_details"].items():
                    tiers[tier] = tiers.get(tier, 0) + count
    return UsageInfo(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                     prompt_tokens_details=PromptTokensDetails(cached_tokens=cached, cached_tokens_details=tiers))


# ---- SSE and errors ---------------------------------------------------------------------------------
def sse(obj: Any) -> bytes:
    """One ``data: {json}`` event; a ``BaseModel`` is dumped first."""
    if isinstance(obj, BaseModel):
        obj = obj.model_dump()
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


async def guarded_stream(events: AsyncIterator[bytes],
                         param_names: Mapping[str, str] = MappingProxyType({})) -> AsyncIterator[bytes]:
    """Forward ``events``; an error becomes an in-band OpenAI error event (``param_names`` as in
    ``error_body``); always ends with ``[DONE]`` unless the client went away."""
    try:
        async for chunk in events:
            yield chunk
    except ClientDisconnected:
        return
    except Exception as e:  # noqa: BLE001 - the status line is already sent; report in-band
        status, body = error_body(e, param_names)
        yield sse(body)
    yield SSE_DONE


# Native field -> the /v1 field it comes from, where the names differ; a field not listed keeps its
# name (stop, temperature, regex, ...). The native errors name native fields (``InvalidRequestError.param``,
# ``RequestError.param``); the OpenAI error body names what the client sent.
COMPLETION_PARAM_NAMES = MappingProxyType({
    "input_ids": "prompt", "max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens",
    "top_logprobs_num": "logprobs", "sampling_seed": "seed"})
CHAT_PARAM_NAMES = MappingProxyType({
    **COMPLETION_PARAM_NAMES, "input_ids": "messages", "top_logprobs_num": "top_logprobs",
    "json_schema": "response_format", "structural_tag": "tools"})
RESPONSES_PARAM_NAMES = MappingProxyType({
    **CHAT_PARAM_NAMES, "input_ids": "input", "max_new_tokens": "max_output_tokens", "json_schema": "text.format"})


def error_body(exc: BaseException, param_names: Mapping[str, str] = MappingProxyType({})) -> tuple[int, dict]:
    """The single exception -> ``(status, OpenAI error body)`` mapping of the OpenAI routes.

    ``param_names``: native field -> the route's field (``COMPLETION_PARAM_NAMES``, ``CHAT_PARAM_NAMES``),
    applied to the ``param`` that a native error (``InvalidRequestError``, ``RequestError``) names.
    """
    if isinstance(exc, OpenAIError):
        return exc.status, openai_error_body(exc.message, exc.status, exc.param, exc.code)
    if isinstance(exc, ValidationError):
        message, param = validation_message(list(exc.errors()))
        return 400, openai_error_body(message, 400, param)
    if isinstance(exc, (InvalidRequestError, RequestError)):
        status = exc.status_code if isinstance(exc, RequestError) else 400
        param = param_names.get(exc.param, exc.param) if exc.param is not None else None
        return status, openai_error_body(str(exc), status, param)
    logger.error("internal error in an OpenAI route", exc_info=exc)
    return 500, openai_error_body(f"internal server error: {type(exc).__name__}: {exc}", 500)


def error_json(exc: BaseException, param_names: Mapping[str, str] = MappingProxyType({})) -> Response:
    """``error_body`` as a JSON response."""
    status, body = error_body(exc, param_names)
    return Response(msgspec.json.encode(body), status_code=status, media_type="application/json")


def validation_message(errors: list[dict], rewrite_extra_fields: bool = True) -> tuple[str, Optional[str]]:
    """pydantic errors -> one message with a clause per field, and the first field as ``param``.
    Union branches (``loc`` parts such as ``list[int]``) are merged: the deepest branch explains.
    Shared by the native API (``rewrite_extra_fields=False`` keeps pydantic's wording) and /v1."""
    if any(e.get("type") == "json_invalid" for e in errors):
        detail = next(e for e in errors if e.get("type") == "json_invalid").get("ctx", {}).get("error", "")
        if detail.startswith("recursion limit exceeded"):  # valid JSON, deeper than the parser goes
            return f"JSON body nested too deeply (the limit is 200 levels of objects and arrays): {detail}", None
        return f"malformed JSON body: {detail}".rstrip(": "), None
    by_field: dict[str, list[tuple[list[str], str]]] = {}
    for e in errors:
        loc = [str(p) for p in e.get("loc", ()) if p != "body" and not _is_type_tag(p)]
        msg = str(e.get("msg", "invalid")).replace("Value error, ", "")
        value = e.get("input")
        if isinstance(value, float) and not math.isfinite(value):  # pydantic: "less than or equal to 2"
            msg = f"must be a finite number, got {value}"
        if rewrite_extra_fields and e.get("type") == "extra_forbidden":
            msg = "unknown field (not supported by this server)"
        by_field.setdefault(loc[0] if loc else "", []).append((loc, msg))
    clauses, params = [], []
    for errs in by_field.values():
        depth = max(len(loc) for loc, _ in errs)
        deepest = [(loc, msg) for loc, msg in errs if len(loc) == depth]
        where = ".".join(deepest[0][0])
        params.append(where or None)
        clauses.append(f"{where or 'request body'}: {' or '.join(dict.fromkeys(m for _, m in deepest))}")
    return "invalid request: " + "; ".join(clauses), params[0] if params else None


def _is_type_tag(part: object) -> bool:
    """pydantic names union branches and validators in ``loc`` (``str``, ``list[int]``, ``function-...``,
    a model class such as ``NamedToolChoice``): not field names."""
    if isinstance(part, str) and part.startswith("function-"):
        return True
    if isinstance(part, str) and part[:1].isupper() and part in _model_class_names():
        return True
    return isinstance(part, str) and (part in ("str", "int", "float", "bool") or "[" in part)


@functools.lru_cache(maxsize=1)
def _model_class_names() -> frozenset[str]:
    """Names of the pydantic request models (union branches in ``loc``; computed once)."""
    seen: set[str] = set()
    todo = list(BaseModel.__subclasses__())
    while todo:
        cls = todo.pop()
        if cls.__name__ not in seen:
            seen.add(cls.__name__)
            todo.extend(cls.__subclasses__())
    return frozenset(seen)
