"""The OpenAI-compatible routes as one FastAPI ``APIRouter`` (SGLang's ``/v1`` routes; ``docs/api.md``).

``create_openai_router(tm, server_args, model_info, tokenizer)`` builds it; the app includes it:

- ``GET /v1/models`` and ``GET /v1/models/{id}`` (404 for another id; both also ``HEAD``): one card, id = the served
  model name (``--served-model-name``, else the model path), with ``max_model_len``.
- ``POST /v1/completions`` (``completions.py``) and ``POST /v1/chat/completions`` (``chat.py``).
  Any ``model`` value is accepted (one model per server); responses report the served name.
- ``POST /v1/responses``, ``GET`` and ``DELETE /v1/responses/{id}`` (``responses.py``; stored
  responses live in this process's memory, the newest ``--responses-store-size``).

Every error of these routes is OpenAI-shaped, ``{"error": {"message", "type", "param", "code"}}``
(``common.error_body``): 400 for bad input (never a 500 for a client error), 404, 503 when
overloaded or the scheduler is gone. Bodies are parsed by hand, so a body sent without a JSON
content type still works and FastAPI's own 422 never appears.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Awaitable, Callable

from fastapi import APIRouter, Request
from fastapi.responses import Response

from radixlm.managers.tokenizer_manager import ClientDisconnected
from radixlm.srt.json_body import parse_json_body
from radixlm.srt.openai_api.chat import create_chat_completion
from radixlm.srt.openai_api.chat_template import ChatTemplate
from radixlm.srt.openai_api.common import (CHAT_PARAM_NAMES, COMPLETION_PARAM_NAMES, RESPONSES_PARAM_NAMES,
                                           ServingContext, error_json)
from radixlm.srt.openai_api.completions import create_completion
from radixlm.srt.openai_api.protocol import (ChatCompletionRequest, CompletionRequest, ModelCard, ModelList,
                                             OpenAIError)
from radixlm.srt.openai_api import responses
from radixlm.srt.read_routes import read_route
from radixlm.srt.openai_api.tool_request import ToolValidator

logger = logging.getLogger(__name__)


def _openai_errors(param_names: Mapping[str, str] = MappingProxyType({})
                   ) -> Callable[[Callable[..., Awaitable[Response]]], Callable[..., Awaitable[Response]]]:
    """A decorator turning any exception of a handler into an OpenAI error response (499 if the
    client left); ``param_names`` renames the native field a native error names (``error_body``)."""

    def decorate(handler: Callable[..., Awaitable[Response]]) -> Callable[..., Awaitable[Response]]:
        @functools.wraps(handler)
        async def wrapper(*args: Any, **kwargs: Any) -> Response:
            try:
                return await handler(*args, **kwargs)
            except ClientDisconnected:
                return Response(status_code=499)  # nobody is listening
            except Exception as e:  # noqa: BLE001 - error_json logs the unexpected ones
                return error_json(e, param_names)

        return wrapper

    return decorate


def _tool_parser(server_args: Any, template: ChatTemplate) -> Any:
    """``--tool-call-parser``, else the one the chat template writes, else the default format."""
    from radixlm.srt.function_call import DEFAULT_TOOL_CALL_PARSER, create_tool_parser, detect_tool_parser

    name = getattr(server_args, "tool_call_parser", None)
    how = "--tool-call-parser"
    if name is None:
        name, how = detect_tool_parser(template.text), "the chat template"
    if name is None:
        name = DEFAULT_TOOL_CALL_PARSER
        how = "the default: the chat template has no tool format" if not template.supports_tools else \
            "the default: the chat template's tool format is not recognised; set --tool-call-parser"
    logger.info("tool-call parser: %s (%s)", name, how)
    return create_tool_parser(name)


def _markers_are_special(parser: Any, tokenizer: Any) -> bool:
    """Whether the parser's markers are special tokens (dropped from text by skip_special_tokens)."""
    from radixlm.constrained.vocab import special_token_ids

    specials = set(tokenizer.convert_ids_to_tokens(sorted(special_token_ids(tokenizer))))
    return any(m in specials for m in getattr(parser, "markers", parser.openers))


def create_openai_router(tm: Any, server_args: Any, model_info: dict, tokenizer: Any) -> APIRouter:
    """Build the ``/v1`` routes.

    Args:
        tm: the ``TokenizerManager`` (``prepare``, ``check_admission``, ``generate``, ``generate_stream``).
        server_args: ``ServerArgs``; ``chat_template`` (a Jinja file) overrides the tokenizer's template;
            ``tool_call_parser``, ``reasoning_parser``, ``grammar_backend`` shape tool calling.
        model_info: the ``/get_model_info`` dict (``served_model_name``, ``model_path``, ``context_length``).
        tokenizer: the transformers tokenizer of the model.

    Raises:
        FileNotFoundError: ``--chat-template`` names a file that does not exist.
    """
    from radixlm import __version__

    context_len = int(model_info.get("context_length") or tm.context_len)
    name = str(model_info.get("served_model_name") or model_info.get("model_path") or "default")
    from radixlm.srt.reasoning_parser import get_reasoning_format

    template = ChatTemplate(tokenizer, getattr(server_args, "chat_template", None))
    parser = _tool_parser(server_args, template)
    reasoning = getattr(server_args, "reasoning_parser", None)
    ctx = ServingContext(tm=tm, tokenizer=tokenizer, model_name=name, context_len=context_len,
                         fingerprint=f"fp_radixlm_{__version__}", chat_template=template, tool_parser=parser,
                         tool_validator=ToolValidator(getattr(server_args, "grammar_backend", "xgrammar"),
                                                      bool(getattr(server_args, "grammar_any_whitespace", False))),
                         reasoning=get_reasoning_format(reasoning) if reasoning else None,
                         tool_markers_special=_markers_are_special(parser, tokenizer))
    card = ModelCard(id=name, created=int(time.time()), root=str(model_info.get("model_path") or name),
                     max_model_len=context_len)
    router = APIRouter()

    @read_route(router, "/v1/models")
    @_openai_errors()
    async def list_models() -> Response:
        return Response(ModelList(data=[card]).model_dump_json(), media_type="application/json")

    @read_route(router, "/v1/models/{model_id:path}")
    @_openai_errors()
    async def retrieve_model(model_id: str) -> Response:
        if model_id != card.id:
            raise OpenAIError(f"The model '{model_id}' does not exist; this server serves '{card.id}'", 404,
                              "model", "model_not_found")
        return Response(card.model_dump_json(), media_type="application/json")

    @router.post("/v1/completions")
    @_openai_errors(COMPLETION_PARAM_NAMES)
    async def completions(request: Request) -> Response:
        req = parse_json_body(CompletionRequest, await request.body())
        return await create_completion(ctx, req, request)

    @router.post("/v1/chat/completions")
    @_openai_errors(CHAT_PARAM_NAMES)
    async def chat_completions(request: Request) -> Response:
        req = parse_json_body(ChatCompletionRequest, await request.body())
        return await create_chat_completion(ctx, req, request)

    store = responses.ResponseStore(int(getattr(server_args, "responses_store_size", responses.DEFAULT_STORE_SIZE)))

    @router.post("/v1/responses")
    @_openai_errors(RESPONSES_PARAM_NAMES)
    async def create_response(request: Request) -> Response:
        req = responses.parse_request(await request.body())
        return await responses.create_response(ctx, store, req, request)

    @read_route(router, "/v1/responses/{response_id:path}")
    @_openai_errors()
    async def retrieve_response(response_id: str) -> Response:
        return responses.retrieve(store, response_id)

    @router.post("/v1/responses/{sub_route:path}", include_in_schema=False)  # an error only
    @_openai_errors()
    async def responses_sub_route(sub_route: str) -> Response:
        raise responses.unsupported_route("POST", sub_route)

    @router.delete("/v1/responses/{response_id:path}")
    @_openai_errors()
    async def delete_response(response_id: str) -> Response:
        return responses.delete(store, response_id)

    return router
