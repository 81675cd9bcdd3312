"""The server's OpenAPI document (``GET /openapi.json``), complete enough to fuzz against.

The handlers parse their bodies by hand (so a body sent without a JSON content type still works),
so FastAPI alone would publish no request bodies, a JSON 200 for every route and 422s that never
happen. ``install_openapi(app, ...)`` replaces ``app.openapi`` (FastAPI's documented hook for a
custom schema) with one built from FastAPI's paths plus the declarations in ``OPERATIONS``:

- request bodies from the pydantic request models, with ``sampling_params`` spelled out
  (``sampling_params_schema``: types and the ranges ``SamplingParams.verify`` enforces; a value of
  ``null`` means "default", as SGLang's frontend sends every field);
- every status a route answers, with its media type: JSON schemas of the responses (OpenAI models,
  SGLang's ``/generate`` dict), ``text/event-stream`` for streams, ``text/plain`` for ``/metrics`` and
  ``/flush_cache``, no body for ``/health`` and every ``HEAD`` (``get_and_head``); errors as ``NativeError``
  or ``OpenAIError`` (``radixlm.srt.errors``), 503 with its ``Retry-After`` header;
- with ``--api-key``: a bearer security scheme on every operation but the probes' and scrapers' (``/health``,
  ``/health_generate``, ``/metrics``: ``OPEN_PATH_PREFIXES``), and 401s.

JSON Schema cannot state every rule (a regex must compile, prompt + ``max_new_tokens`` must fit the
context, only one grammar per request), so a schema-valid body can still get a 400. A route missing
from ``OPERATIONS`` makes building the document fail (``KeyError``), so declarations cannot drift
from the routes silently.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Optional

import msgspec
from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from radixlm.managers.tokenizer_manager import MAX_SEQUENCES_PER_REQUEST
from radixlm.srt.openai_api import protocol, responses_protocol
from radixlm.srt.sampling_params import INT64_MAX, INT64_MIN, SamplingParams

JSON = "application/json"
SSE = "text/event-stream"
TEXT = "text/plain"
BEARER = "HTTPBearer"


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


@dataclasses.dataclass(frozen=True)
class Operation:
    """What one (path, method) takes and answers.

    body: component name of the JSON request body (None: no body). ok: media type -> schema (None:
    no schema) of the 200 answer; empty: a 200 without a body. errors: error statuses (401 is added
    with ``--api-key``). openai: errors in OpenAI's shape.
    """

    summary: str
    body: Optional[str] = None
    ok: dict = dataclasses.field(default_factory=dict)
    errors: tuple[int, ...] = ()
    openai: bool = False


def get_and_head(get: Operation) -> dict[str, Operation]:
    """The operations of a read-only route (``read_routes.read_route``): ``get``, and a ``head`` with
    the same statuses and no body."""
    return {"get": get, "head": dataclasses.replace(get, summary=f"{get.summary} (HEAD: the same without a body)",
                                                    ok={})}


_GENERATE = Operation("Generate text (SGLang's native API); a stream with stream: true", "GenerateRequest",
                      {JSON: {"anyOf": [_ref("GenerateResponse"), {"type": "array", "items": _ref("GenerateResponse")}]},
                       SSE: None}, (400, 413, 503))
_MODEL_INFO = Operation("Model path, tokenizer path and chat template", ok={JSON: {"type": "object"}})
_SERVER_INFO = Operation("Server arguments, version and scheduler state", ok={JSON: _ref("ServerInfo")}, errors=(503,))
_FLUSH = Operation("Drop the prefix cache and the host KV tier (400 while requests run)", ok={TEXT: {"type": "string"}},
                   errors=(400, 503))
_CLEAR_STORAGE = Operation("Delete the hierarchical cache's storage files (400 without a storage backend)",
                           ok={TEXT: {"type": "string"}}, errors=(400, 503))
_COMPLETION_ERRORS = (400, 413, 503)
# Paths ``--api-key`` leaves open, as SGLang's middleware does: probes and scrapers carry no secret
# (``http_server.ApiKeyMiddleware`` enforces it; the spec declares it).
OPEN_PATH_PREFIXES = ("/health", "/metrics")


def _open(path: str) -> bool:
    return path.startswith(OPEN_PATH_PREFIXES)


OPERATIONS: dict[str, dict[str, Operation]] = {
    "/generate": {"post": _GENERATE, "put": _GENERATE},
    "/health": get_and_head(Operation("200 while the scheduler is alive and the server is not shutting down "
                                      "(never needs the API key)", errors=(503,))),
    "/health_generate": get_and_head(Operation("200 once a one-token request finished on every replica",
                                               errors=(503,))),
    "/get_model_info": get_and_head(_MODEL_INFO),
    "/model_info": get_and_head(_MODEL_INFO),
    "/get_server_info": get_and_head(_SERVER_INFO),
    "/server_info": get_and_head(_SERVER_INFO),
    "/get_load": get_and_head(Operation("Per-replica load: requests held, waiting, KV tokens held (SGLang's shape)",
                                        ok={JSON: {"type": "array", "items": {"type": "object"}}}, errors=(503,))),
    "/flush_cache": {"get": _FLUSH, "post": _FLUSH},
    "/clear_hicache_storage_backend": {"get": _CLEAR_STORAGE, "post": _CLEAR_STORAGE},
    "/abort_request": {"post": Operation("Abort requests by rid prefix, or all", "AbortRequest", errors=(400, 413))},
    "/metrics": get_and_head(Operation("Prometheus metrics", ok={TEXT: {"type": "string"}})),
    "/v1/models": get_and_head(Operation("The served model", ok={JSON: _ref("ModelList")}, openai=True)),
    "/v1/models/{model_id}": get_and_head(Operation("One model card (404 for another id)", ok={JSON: _ref("ModelCard")},
                                                    errors=(404,), openai=True)),
    "/v1/completions": {"post": Operation("OpenAI completions", "CompletionRequest",
                                          {JSON: _ref("CompletionResponse"), SSE: None}, _COMPLETION_ERRORS, True)},
    "/v1/chat/completions": {"post": Operation("OpenAI chat completions", "ChatCompletionRequest",
                                               {JSON: _ref("ChatCompletionResponse"), SSE: None}, _COMPLETION_ERRORS,
                                               True)},
    "/v1/responses": {"post": Operation("OpenAI Responses API (events with stream: true)", "ResponsesRequest",
                                        {JSON: _ref("ResponseObject"), SSE: None}, _COMPLETION_ERRORS, True)},
    "/v1/responses/{response_id}": {
        **get_and_head(Operation("A stored response (404: unknown, sent with store: false, or evicted)",
                                 ok={JSON: _ref("ResponseObject")}, errors=(404,), openai=True)),
        "delete": Operation("Forget a stored response", ok={JSON: _ref("ResponseDeleted")}, errors=(404,),
                            openai=True)},
}

# Ranges of SamplingParams.verify (and the context / vocabulary / fan-out limits of the TokenizerManager).
_SAMPLING_BOUNDS: dict[str, dict] = {
    "temperature": {"minimum": 0}, "top_p": {"exclusiveMinimum": 0, "maximum": 1}, "min_p": {"minimum": 0, "maximum": 1},
    "frequency_penalty": {"minimum": -2, "maximum": 2}, "presence_penalty": {"minimum": -2, "maximum": 2},
    "repetition_penalty": {"exclusiveMinimum": 0, "maximum": 2}, "min_new_tokens": {"minimum": 0},
    "n": {"minimum": 1, "maximum": MAX_SEQUENCES_PER_REQUEST},
}
_ERROR_DESCRIPTIONS = {400: "Invalid request", 401: "Missing or wrong API key (Authorization: Bearer KEY)",
                       404: "Not found", 413: "Request body too large",
                       503: "Overloaded, or the scheduler is gone; retry after Retry-After seconds"}


def sampling_params_schema(context_len: int, vocab_size: Optional[int]) -> dict:
    """JSON schema of one ``sampling_params`` object: ``SamplingParams``' fields (from msgspec), each
    also ``null``; unknown keys only as ``null``; ``json_schema`` also as an object or array,
    ``structural_tag`` also as an object."""
    generated = msgspec.json.schema(SamplingParams)
    fields = generated["$defs"]["SamplingParams"]["properties"]
    token = {"type": "integer", "minimum": 0, **({"maximum": vocab_size - 1} if vocab_size else {})}
    typed = {name: {k: v for k, v in spec.items() if k not in ("default", "title")} for name, spec in fields.items()}
    typed["max_new_tokens"] = {"type": "integer", "minimum": 0, "maximum": context_len}
    typed["top_k"] = {"anyOf": [{"const": -1}, {"type": "integer", "minimum": 1, "maximum": INT64_MAX}]}
    typed["sampling_seed"] = {"type": "integer", "minimum": INT64_MIN, "maximum": INT64_MAX}
    typed["stream_interval"] = {"type": "integer", "minimum": 1, "maximum": INT64_MAX}
    typed["stop_token_ids"] = {"type": "array", "items": token}
    typed["json_schema"] = {"anyOf": [{"type": "string"}, {"type": "object"}, {"type": "array"}]}
    typed["structural_tag"] = {"anyOf": [{"type": "string"}, {"type": "object"}]}
    for name, bounds in _SAMPLING_BOUNDS.items():
        typed[name] = {**typed[name], **bounds}
    properties = {name: {"anyOf": [_strip_null(spec), {"type": "null"}]} for name, spec in typed.items()}
    return {"type": "object", "description": "Sampling and stopping controls (null: the default)",
            "properties": properties, "additionalProperties": {"type": "null"}}


def _strip_null(spec: dict) -> dict:
    """``spec`` without its ``null`` alternative (added back once, uniformly)."""
    alternatives = [s for s in spec.get("anyOf", []) if s != {"type": "null"}]
    if "anyOf" not in spec:
        return spec
    return alternatives[0] if len(alternatives) == 1 else {**spec, "anyOf": alternatives}


def _error_schemas() -> dict:
    string_or_null = {"anyOf": [{"type": "string"}, {"type": "null"}]}
    native = {"type": "object", "required": ["message", "type", "code"],
              "properties": {"message": {"type": "string"}, "type": {"type": "string"}, "code": {"type": "integer"}}}
    openai = {"type": "object", "required": ["message", "type", "param", "code"],
              "properties": {"message": {"type": "string"}, "type": {"type": "string"}, "param": string_or_null,
                             "code": string_or_null}}
    return {"NativeError": {"type": "object", "required": ["error"], "properties": {"error": native}},
            "OpenAIError": {"type": "object", "required": ["error"], "properties": {"error": openai}}}


def _native_schemas() -> dict:
    """``/generate``'s answer (``managers/response.py``) and ``/get_server_info``."""
    finish = {"anyOf": [{"type": "null"}, {"type": "object", "required": ["type"],
                                           "properties": {"type": {"enum": ["stop", "length", "abort"]}}}]}
    meta = {"type": "object", "required": ["id", "finish_reason"],
            "properties": {"id": {"type": "string"}, "finish_reason": finish,
                           **{k: {"type": "integer", "minimum": 0} for k in
                              ("prompt_tokens", "completion_tokens", "cached_tokens", "total_retractions")},
                           "cached_tokens_details": {"type": "object", "additionalProperties": {"type": "integer",
                                                                                               "minimum": 0}},
                           # only with --speculative-algorithm
                           "spec_verify_ct": {"type": "integer", "minimum": 0},
                           "spec_accept_length": {"type": "number", "minimum": 0}}}
    response = {"type": "object", "required": ["text", "output_ids", "meta_info"],
                "properties": {"text": {"type": "string"}, "output_ids": {"type": "array", "items": {"type": "integer"}},
                               "meta_info": meta, "index": {"type": "integer"}}}
    server_info = {"type": "object", "required": ["version", "max_total_num_tokens", "internal_states"],
                   "properties": {"version": {"type": "string"}, "max_total_num_tokens": {"type": "integer"},
                                  "internal_states": {"type": "array", "items": {"type": "object"}}}}
    return {"GenerateResponse": response, "ServerInfo": server_info}


def _model_schemas(context_len: int, vocab_size: Optional[int], dp_size: int = 1) -> dict:
    """Request and response models (pydantic), ``GenerateRequest`` with typed ``sampling_params``."""
    from radixlm.srt.http_server import AbortReqInput, GenerateReqInput  # the app module imports this one

    models: list[tuple[type[BaseModel], str]] = [
        (GenerateReqInput, "validation"), (AbortReqInput, "validation"),
        (protocol.CompletionRequest, "validation"), (protocol.ChatCompletionRequest, "validation"),
        (protocol.CompletionResponse, "serialization"), (protocol.ChatCompletionResponse, "serialization"),
        (protocol.ModelList, "serialization"), (protocol.ModelCard, "serialization"),
        (responses_protocol.ResponsesRequest, "validation"), (responses_protocol.ResponseObject, "serialization"),
        (responses_protocol.ResponseDeleted, "serialization")]
    _, generated = models_json_schema(models, ref_template="#/components/schemas/{model}")
    schemas = generated["$defs"]
    generate = schemas.pop("GenerateReqInput")
    sampling = sampling_params_schema(context_len, vocab_size)
    generate["properties"]["sampling_params"] = {"anyOf": [sampling, {"type": "array", "items": {
        "anyOf": [sampling, {"type": "null"}]}}, {"type": "null"}]}
    given = {"not": {"type": "null"}}
    # the replicas of this server (SGLang's field; pydantic only knows ">= 0")
    generate["properties"]["data_parallel_rank"] = {"anyOf": [{"type": "integer", "minimum": 0, "maximum": dp_size - 1},
                                                              {"type": "null"}]}
    generate["oneOf"] = [{"required": [field], "properties": {field: given}} for field in ("text", "input_ids")]
    generate["description"] += "\n\nExactly one of text and input_ids (not null)."
    schemas["GenerateRequest"] = generate
    schemas["AbortRequest"] = schemas.pop("AbortReqInput")
    return schemas


def _responses(op: Operation, needs_key: bool) -> dict:
    ok: dict[str, Any] = {"description": "OK"}
    if op.ok:
        ok["content"] = {media: ({"schema": schema} if schema is not None else {}) for media, schema in op.ok.items()}
    responses = {"200": ok}
    error_schema = _ref("OpenAIError" if op.openai else "NativeError")
    for status in sorted({*op.errors, *((401,) if needs_key else ())}):
        entry: dict[str, Any] = {"description": _ERROR_DESCRIPTIONS[status], "content": {JSON: {"schema": error_schema}}}
        if status == 503:
            entry["headers"] = {"Retry-After": {"required": True, "description": "seconds",
                                                "schema": {"type": "string", "pattern": "^[0-9]+$"}}}
        responses[str(status)] = entry
    return responses


def build_openapi(app: FastAPI, context_len: int, vocab_size: Optional[int], api_key: bool, dp_size: int = 1) -> dict:
    """The complete document. Raises ``KeyError`` naming a route that ``OPERATIONS`` lacks."""
    with warnings.catch_warnings():  # one FastAPI route per multi-method path: its operation ids repeat (replaced below)
        warnings.filterwarnings("ignore", "Duplicate Operation ID", UserWarning)
        spec = get_openapi(title=app.title, version=app.version, routes=app.routes)
    components = spec.setdefault("components", {})
    components["schemas"] = {**_model_schemas(context_len, vocab_size, dp_size), **_error_schemas(), **_native_schemas()}
    for path, methods in spec["paths"].items():
        for method, generated in methods.items():
            try:
                op = OPERATIONS[path][method]
            except KeyError:
                raise KeyError(f"{method.upper()} {path} has no declaration in radixlm.srt.openapi_spec.OPERATIONS") from None
            declared: dict[str, Any] = {"summary": op.summary, "operationId": f"{method}_{path.strip('/')}".replace("/", "_"),
                                        "responses": _responses(op, api_key and not _open(path))}
            if generated.get("parameters"):
                declared["parameters"] = generated["parameters"]
            if op.body is not None:
                declared["requestBody"] = {"required": True, "content": {JSON: {"schema": _ref(op.body)}}}
            if api_key and _open(path):
                declared["security"] = []
            methods[method] = declared
    if api_key:
        components["securitySchemes"] = {BEARER: {"type": "http", "scheme": "bearer"}}
        spec["security"] = [{BEARER: []}]
    return spec


def install_openapi(app: FastAPI, context_len: int, vocab_size: Optional[int], api_key: bool, dp_size: int = 1) -> None:
    """Serve ``build_openapi``'s document at ``/openapi.json`` (built on first use, then cached)."""

    def openapi() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = build_openapi(app, context_len, vocab_size, api_key, dp_size)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
