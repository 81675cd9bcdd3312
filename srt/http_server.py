"""The FastAPI app: SGLang's native routes (``/generate``, the cache, model and server info routes).

``create_app(tokenizer_manager, server_args, model_info, metrics)`` builds the app; all state comes
in through those arguments (no module-level state). Routes:

- ``POST|PUT /generate``: ``GenerateReqInput`` -> response dict, list for a batch, or an SSE stream
  of cumulative dicts ending with ``data: [DONE]``.
- ``GET /health`` (never needs the API key), ``GET /health_generate`` (a one-token request on every
  replica). Every read-only ``GET`` route (these, the info routes, ``/get_load``, ``/metrics``, ``GET /v1/...``)
  also answers ``HEAD``, without a body (``read_routes.read_route``).
- ``GET /get_model_info`` = ``/model_info``; ``GET /get_server_info`` = ``/server_info`` (one
  ``internal_states`` entry per ``--dp-size`` replica, ``internal_state`` their sum); ``GET /get_load``.
- ``GET|POST /flush_cache`` (400 while requests run; flushes the device and host KV tiers of every
  replica),
  ``GET|POST /clear_hicache_storage_backend`` (deletes the storage tier's files; 400 without one),
  ``POST /abort_request``, ``GET /metrics``.

The OpenAI-compatible ``/v1/*`` routes come from ``radixlm.srt.openai_api.router``; their errors
(also 401, 404/405 and 413 under ``/v1/``) are OpenAI-shaped, ``{"error": {"message", "type", "param",
"code"}}``. Every other error, including 404/405 of unknown paths and methods, is the native
``{"error": {"message": str, "type": str, "code": <HTTP status>}}`` (``radixlm.srt.errors``), built
by ``error_response`` (the one exception-to-response mapping): bad input 400, missing/wrong API key
401, overload or a dead scheduler 503 (with ``Retry-After``), a body over ``MAX_REQUEST_BODY_BYTES``
413 (``LimitsMiddleware``).
"""

from __future__ import annotations

import hmac
import logging
from typing import Any, Literal, Optional, Union

import msgspec
from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

from radixlm.managers.data_parallel_controller import merge_internal_states
from radixlm.managers.tokenizer_manager import ClientDisconnected, GenerateRequest, RequestError, TokenizerManager
from radixlm.managers.validation import InvalidRequestError
from radixlm.srt.errors import native_error_body
from radixlm.srt.json_body import parse_json_body
from radixlm.srt.openai_api.common import validation_message
from radixlm.srt.openapi_spec import OPEN_PATH_PREFIXES, install_openapi
from radixlm.srt.openai_api.protocol import openai_error_body
from radixlm.srt.openai_api.router import create_openai_router
from radixlm.srt.read_routes import read_route

logger = logging.getLogger(__name__)

# SGLang request fields we accept only when unset (null / false / empty), so SGLang's clients that
# send them with default values keep working; a real value is a 400 naming the field. SGLang's router
# (sglang-router) re-serializes every /generate body with ``log_metrics: true`` and ``background``,
# ``return_bytes``, ``return_entropy``, ``return_hidden_states`` false.
_UNSUPPORTED_FIELDS = ("input_embeds", "image_data", "video_data", "audio_data", "lora_path", "session_params",
                       "return_hidden_states", "custom_logit_processor", "token_ids_logprob", "modalities",
                       "priority", "extra_key", "return_entropy", "background", "return_bytes",
                       "bootstrap_host", "bootstrap_port", "bootstrap_room", "require_reasoning", "stream_output")


class GenerateReqInput(BaseModel):
    """The ``/generate`` body (SGLang's ``GenerateReqInput``). Types are strict: ``"1"`` is not an int.

    Exactly one of ``text`` (str or list of str) and ``input_ids`` (list of int or list of lists).
    Per-prompt fields (``sampling_params``, ``rid``, logprob knobs) take one value for all prompts
    or a list with one per prompt; a single ``rid`` for a batch becomes ``rid_0, rid_1, ...``.
    ``timeout`` (seconds, a radixlm extra) limits the whole request, as ``--request-timeout`` does.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    # ``model`` (sent by SGLang's router, null there): this server serves one model, so any name is that one.
    model: Optional[str] = None
    text: Optional[Union[str, list[str]]] = None
    input_ids: Optional[Union[list[int], list[list[int]]]] = None
    sampling_params: Optional[Union[dict[str, Any], list[Optional[dict[str, Any]]]]] = None
    rid: Optional[Union[str, list[str]]] = None
    return_logprob: Optional[Union[bool, list[bool]]] = None
    logprob_start_len: Optional[Union[int, list[int]]] = None
    top_logprobs_num: Optional[Union[int, list[int]]] = None
    return_text_in_logprobs: Optional[bool] = None
    stream: Optional[bool] = None
    # Seconds (> 0) the request may take before it is aborted (finish_reason abort, partial output
    # kept); the server's --request-timeout caps it.
    timeout: Optional[float] = Field(default=None, gt=0, allow_inf_nan=False)
    input_embeds: Any = None
    image_data: Any = None
    video_data: Any = None
    audio_data: Any = None
    lora_path: Any = None
    session_params: Any = None
    return_hidden_states: Any = None
    custom_logit_processor: Any = None
    token_ids_logprob: Any = None
    modalities: Any = None
    priority: Any = None
    extra_key: Any = None
    # SGLang's default (true): the request counts in /metrics, as every request does here.
    log_metrics: Optional[Literal[True]] = None
    # Keep this request out of the --log-requests log (SGLang's field).
    no_logs: Optional[bool] = None
    # The --dp-size replica to run on (SGLang's field; its router's dp-aware mode sends it). None: routed.
    data_parallel_rank: Optional[int] = Field(default=None, ge=0)
    return_entropy: Any = None
    bootstrap_host: Any = None
    bootstrap_port: Any = None
    bootstrap_room: Any = None
    require_reasoning: Any = None
    stream_output: Any = None
    background: Any = None
    return_bytes: Any = None

    @model_validator(mode="after")
    def _check(self) -> "GenerateReqInput":
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("give exactly one of text and input_ids")
        used = [f for f in _UNSUPPORTED_FIELDS if getattr(self, f) not in (None, False, [], {}, "")]
        if used:
            raise ValueError(f"not supported by this server: {', '.join(used)}")
        return self

    def to_request(self) -> GenerateRequest:
        """Expand to one entry per prompt. Raises ``InvalidRequestError`` on mismatched list lengths."""
        if self.text is not None:
            is_batch = isinstance(self.text, list)
            prompts: list[Union[str, list[int]]] = list(self.text) if is_batch else [self.text]  # type: ignore[arg-type]
        else:
            ids = self.input_ids or []
            is_batch = bool(ids) and isinstance(ids[0], list)
            prompts = [list(x) for x in ids] if is_batch else [list(ids)]  # type: ignore[arg-type]
        if not prompts:
            raise InvalidRequestError("the batch is empty: give at least one prompt")
        n = len(prompts)

        def per_prompt(name: str, value: Any, default: Any) -> list[Any]:
            if not isinstance(value, list):
                return [default if value is None else value] * n
            if not is_batch or len(value) != n:
                raise InvalidRequestError(f"{name} is a list of {len(value)} but the request has "
                                          f"{n if is_batch else 'a single'} prompt{'s' if is_batch else ''}")
            return value

        rids: Optional[list[str]] = None
        if isinstance(self.rid, str):
            rids = [f"{self.rid}_{i}" for i in range(n)] if is_batch else [self.rid]
        elif self.rid is not None:
            rids = per_prompt("rid", self.rid, None)
        return GenerateRequest(
            prompts=prompts,
            sampling_params=[dict(d or {}) for d in per_prompt("sampling_params", self.sampling_params, {})],
            rids=rids,
            return_logprob=per_prompt("return_logprob", self.return_logprob, False),
            logprob_start_len=per_prompt("logprob_start_len", self.logprob_start_len, -1),
            top_logprobs_num=per_prompt("top_logprobs_num", self.top_logprobs_num, 0),
            return_text_in_logprobs=bool(self.return_text_in_logprobs),
            stream=bool(self.stream),
            is_batch=is_batch,
            timeout=self.timeout,
            data_parallel_rank=self.data_parallel_rank,
            no_logs=bool(self.no_logs),
        )


class AbortReqInput(BaseModel):
    """``/abort_request`` body: abort the requests whose rid starts with ``rid``, or all of them."""

    model_config = ConfigDict(extra="forbid", strict=True)
    rid: str = ""
    abort_all: bool = False


# ---- errors ---------------------------------------------------------------------------------------
def _format_validation_errors(errors: list[dict]) -> str:
    """One clause per offending field, e.g. ``input_ids.1: Input should be a valid integer``."""
    return validation_message(errors, rewrite_extra_fields=False)[0]


def error_response(exc: BaseException) -> Response:
    """The single exception-to-response mapping of the server."""
    if isinstance(exc, (RequestValidationError, ValidationError)):
        status, message = 400, _format_validation_errors(list(exc.errors()))
    elif isinstance(exc, InvalidRequestError):
        status, message = 400, str(exc)
    elif isinstance(exc, RequestError):
        status, message = exc.status_code, exc.message
    else:
        logger.error("internal error", exc_info=exc)
        status, message = 500, f"internal server error: {type(exc).__name__}: {exc}"
    return json_response(native_error_body(message, status), status)


def json_response(obj: Any, status: int = 200) -> Response:
    """JSON via msgspec (non-finite floats become null instead of invalid JSON)."""
    return Response(msgspec.json.encode(obj), status_code=status, media_type="application/json")


class ApiKeyMiddleware:
    """Pure ASGI middleware (BaseHTTPMiddleware would break streaming disconnect detection):
    requires ``Authorization: Bearer <key>`` on every HTTP route and method but the probes' and the
    scrapers' paths (``/health*``, ``/metrics*``: SGLang's ``add_api_key_middleware`` exempts the same,
    so Kubernetes probes and Prometheus need no secret), before routing (so unknown paths and methods
    answer 401 too); the scheme in any case (RFC 7235 2.1: ``bearer`` is ``Bearer``), the key compared
    in constant time."""

    OPEN_PREFIXES = OPEN_PATH_PREFIXES

    def __init__(self, app: Any, api_key: str):
        self.app = app
        self.expected = api_key.encode()

    def authorized(self, header: bytes) -> bool:
        scheme, _, key = header.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(key.lstrip(b" "), self.expected)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not scope["path"].startswith(self.OPEN_PREFIXES):
            if not self.authorized(dict(scope.get("headers") or []).get(b"authorization", b"")):
                message = "invalid or missing API key (Authorization: Bearer KEY)"
                body = (openai_error_body(message, 401, code="invalid_api_key") if scope["path"].startswith("/v1/")
                        else native_error_body(message, 401))
                await json_response(body, 401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


MAX_REQUEST_BODY_BYTES = 32 << 20  # 413 beyond this (ServerArgs.max_request_body_bytes overrides, if set)
RETRY_AFTER_S = "1"  # the Retry-After of every 503 (overload, scheduler gone): worth retrying soon


class LimitsMiddleware:
    """Pure ASGI: buffers the request body and answers 413 once it passes ``max_body`` bytes (by
    Content-Length, or while reading a chunked body), so no handler ever holds a larger one; adds
    ``Retry-After`` to every 503 response (native and ``/v1``)."""

    def __init__(self, app: Any, max_body: int):
        self.app = app
        self.max_body = max_body

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_retry_after(message: dict) -> None:
            if message["type"] == "http.response.start" and message["status"] == 503:
                message = {**message, "headers": [*message.get("headers", []), (b"retry-after", RETRY_AFTER_S.encode())]}
            await send(message)

        length = dict(scope.get("headers") or []).get(b"content-length", b"")
        too_big = length.isdigit() and int(length) > self.max_body
        parts: list[bytes] = []
        size, disconnected = 0, False
        while not too_big:
            message = await receive()
            if message["type"] == "http.disconnect":
                disconnected = True
                break
            parts.append(message.get("body", b""))
            size += len(parts[-1])
            too_big = size > self.max_body
            if not message.get("more_body", False):
                break
        if disconnected:  # the client left before its body was in: nobody to answer, no route to run
            return
        if too_big:
            text = f"request body larger than {self.max_body} bytes"
            body = openai_error_body(text, 413) if scope["path"].startswith("/v1/") else native_error_body(text, 413)
            await json_response(body, 413)(scope, receive, send)
            return
        pending = [{"type": "http.request", "body": b"".join(parts), "more_body": False}]

        async def replay() -> dict:
            return pending.pop() if pending else await receive()  # after the body: waits for the disconnect

        await self.app(scope, replay, send_with_retry_after)


# ---- app --------------------------------------------------------------------------------------------
def create_app(tm: TokenizerManager, server_args: Any, model_info: dict, metrics: Any, version: str) -> FastAPI:
    """Build the app. ``model_info`` is the ``/get_model_info`` dict; ``metrics`` a ``ServerMetrics``."""
    app = FastAPI(title="radixlm")
    for exc_type in (RequestValidationError, ValidationError, InvalidRequestError, RequestError, Exception):
        app.add_exception_handler(exc_type, lambda request, exc: error_response(exc))
    app.add_exception_handler(StarletteHTTPException, _http_error)  # unknown /v1 routes: OpenAI-shaped 404
    app.add_middleware(LimitsMiddleware, max_body=getattr(server_args, "max_request_body_bytes", None) or MAX_REQUEST_BODY_BYTES)
    if server_args.api_key:  # outside the limits: no body is read before the key is checked
        app.add_middleware(ApiKeyMiddleware, api_key=server_args.api_key)
    # Browsers' cross-origin requests, as SGLang's server allows them (any origin, method and header):
    # outermost, so a preflight OPTIONS (which carries no API key) is answered before the key check.
    app.add_middleware(CORSMiddleware, allow_origins=["*"], allow_credentials=True, allow_methods=["*"],
                       allow_headers=["*"])

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(request: Request) -> Response:
        # Parsed by hand so a body sent without a JSON content type (curl -d) still works.
        obj = parse_json_body(GenerateReqInput, await request.body())
        prep = await tm.prepare(obj.to_request())
        tm.check_admission(prep)
        if obj.stream:
            return StreamingResponse(_sse(tm, prep, request), media_type="text/event-stream")
        try:
            return json_response(await tm.generate(prep, request.is_disconnected))
        except ClientDisconnected:
            return Response(status_code=499)  # nobody is listening; nginx's "client closed request"

    @read_route(app, "/health")  # HEAD: load balancers' and uptime checkers' probes
    async def health() -> Response:
        if tm.dead is not None:
            return json_response(native_error_body(tm.dead, 503), 503)
        if tm.draining:  # shutting down: probes and load balancers should send traffic elsewhere
            return json_response(native_error_body("the server is shutting down", 503), 503)
        return Response(status_code=200)

    @read_route(app, "/health_generate")
    async def health_generate() -> Response:
        if tm.draining:
            return json_response(native_error_body("the server is shutting down", 503), 503)
        if await tm.health_generate():
            return Response(status_code=200)
        return json_response(native_error_body("health check generation did not finish in time", 503), 503)

    @read_route(app, "/get_model_info")
    @read_route(app, "/model_info")
    async def get_model_info() -> Response:
        return json_response(model_info)

    from radixlm.srt.cpu_runtime import cpu_info

    cpu = cpu_info().to_json()

    @read_route(app, "/get_server_info")
    @read_route(app, "/server_info")
    async def get_server_info() -> Response:
        states = await tm.internal_states()
        total = merge_internal_states(states)  # one replica: its own state
        # One entry per data-parallel replica (SGLang's shape), with the router's view of it.
        per_replica = [{**msgspec.structs.asdict(s), **stats} for s, stats in zip(states, tm.dp.replica_stats())]
        return json_response({**server_args.to_dict(), "max_total_num_tokens": total.max_total_num_tokens,
                              "version": version, "model_dtype": model_info.get("dtype"), "cpu": cpu,
                              "internal_states": per_replica,
                              "internal_state": msgspec.structs.asdict(total)})  # the offline Engine's key

    @read_route(app, "/get_load")
    async def get_load() -> Response:
        """SGLang's per-replica load (what its router's load monitor reads): requests held
        (running + waiting), waiting requests, and KV tokens held by requests."""
        return json_response([{"dp_rank": r, "num_reqs": s.num_running_reqs + s.num_waiting_reqs,
                               "num_waiting_reqs": s.num_waiting_reqs,
                               "num_tokens": s.max_total_num_tokens - s.available_size - s.evictable_size}
                              for r, s in enumerate(await tm.internal_states())])

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        out = await tm.flush_cache()
        if not out.success:
            raise RequestError(out.message or "cannot flush the cache now", 400)
        return PlainTextResponse("Cache flushed.\n")

    @app.api_route("/clear_hicache_storage_backend", methods=["GET", "POST"])
    async def clear_hicache_storage_backend() -> Response:
        out = await tm.flush_cache(storage=True)
        if not out.success:
            raise RequestError(out.message or "cannot clear the storage tier now", 400)
        return PlainTextResponse(f"Hierarchical cache storage cleared: {out.message}.\n")

    @app.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        obj = parse_json_body(AbortReqInput, await request.body())
        if not obj.abort_all and not obj.rid:
            raise InvalidRequestError("give a rid (prefix) to abort, or abort_all: true")
        tm.abort(obj.rid, obj.abort_all)
        return Response(status_code=200)

    @read_route(app, "/metrics")
    async def get_metrics() -> Response:
        try:
            metrics.set_scheduler_states(await tm.internal_states(), tm.dp.replica_stats())
        except RequestError:
            pass  # serve the counters we have
        return Response(metrics.render(), media_type=metrics.content_type)

    app.include_router(create_openai_router(tm, server_args, model_info, tm.tokenizer))
    install_openapi(app, context_len=int(model_info.get("context_length") or tm.context_len),
                    vocab_size=getattr(tm, "vocab_size", None), api_key=bool(server_args.api_key),
                    dp_size=server_args.dp_size)
    return app


async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
    """404/405 of the router: OpenAI's error shape under ``/v1/``, the native one elsewhere; keeps
    the exception's headers (``Allow`` of a 405)."""
    message = f"{exc.detail}: {request.method} {request.url.path}"
    body = (openai_error_body(message, exc.status_code) if request.url.path.startswith("/v1/")
            else native_error_body(message, exc.status_code))
    response = json_response(body, exc.status_code)
    response.headers.update(exc.headers or {})
    return response


async def _sse(tm: TokenizerManager, prep: Any, request: Request) -> Any:
    """``data: {json}\\n\\n`` per update, then ``data: [DONE]``; errors are sent in-band."""
    try:
        async for event in tm.generate_stream(prep, request.is_disconnected):
            yield b"data: " + msgspec.json.encode(event) + b"\n\n"
    except ClientDisconnected:
        return
    except RequestError as e:
        yield b"data: " + msgspec.json.encode(native_error_body(e.message, e.status_code)) + b"\n\n"
    yield b"data: [DONE]\n\n"
