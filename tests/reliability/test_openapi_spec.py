"""The published OpenAPI document (``srt/openapi_spec.py``), in process: it declares every route
and method of the app with its bodies, statuses and media types, its JSON schemas are valid, the
API key shows as a bearer scheme on all but ``/health``, and the ``/generate`` body schema never
admits what the server rejects for its type or range (a body the schema calls invalid is a 400)."""

from __future__ import annotations

import json

import jsonschema
import pytest
from pydantic import ValidationError

from radixlm.managers.tokenizer_manager import MAX_SEQUENCES_PER_REQUEST
from radixlm.managers.validation import InvalidRequestError
from radixlm.srt.http_server import GenerateReqInput, create_app
from radixlm.srt.openapi_spec import OPERATIONS
from radixlm.srt.sampling_params import SamplingParams, SamplingParamsError
from radixlm.srt.server_args import ServerArgs

CONTEXT_LEN, VOCAB = 64, 512


class _StandInTM:
    context_len = CONTEXT_LEN
    vocab_size = VOCAB

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer


@pytest.fixture(scope="module")
def tok(stories_path):
    from radixlm.srt.model_loader import load_tokenizer

    return load_tokenizer(stories_path)


def _app(tok, api_key=None):
    info = {"served_model_name": "m", "model_path": "/models/m", "context_length": CONTEXT_LEN}
    return create_app(_StandInTM(tok), ServerArgs(api_key=api_key), info, None, "0")


@pytest.fixture(scope="module")
def app(tok):
    return _app(tok)


@pytest.fixture(scope="module")
def spec(app):
    return app.openapi()


def test_every_route_and_method_is_declared(spec):
    declared = {(m, p) for p, ms in spec["paths"].items() for m in ms}
    assert declared == {(m, p) for p, ms in OPERATIONS.items() for m in ms}
    ids = [op["operationId"] for ms in spec["paths"].values() for op in ms.values()]
    assert len(ids) == len(set(ids)), ids
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            assert "422" not in op["responses"], (method, path)  # FastAPI's; this server answers 400
            assert "security" not in op and "401" not in op["responses"]  # no --api-key
            if OPERATIONS[path][method].body:
                assert op["requestBody"]["required"] is True


def test_an_undeclared_route_fails_the_build(tok):
    app = _app(tok)

    @app.get("/undeclared")
    async def undeclared() -> dict:
        return {}

    with pytest.raises(KeyError, match="GET /undeclared"):
        app.openapi()


def test_component_schemas_are_valid_json_schema(spec):
    for name, schema in spec["components"]["schemas"].items():
        jsonschema.Draft202012Validator.check_schema(schema)
    assert spec["openapi"].startswith("3.1")


def test_api_key_is_a_bearer_scheme_on_all_but_probes_and_metrics(tok):
    spec = _app(tok, api_key="k").openapi()
    assert spec["components"]["securitySchemes"] == {"HTTPBearer": {"type": "http", "scheme": "bearer"}}
    assert spec["security"] == [{"HTTPBearer": []}]
    open_paths = {"/health", "/health_generate", "/metrics"}  # as SGLang's middleware
    assert open_paths <= set(spec["paths"])
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            if path in open_paths:
                assert op["security"] == [] and "401" not in op["responses"]
            else:
                assert "security" not in op and "401" in op["responses"], (method, path)


# ---- the /generate body schema against the server's own parsing -----------------------------------
def _validator(spec) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator({"$ref": "#/components/schemas/GenerateRequest",
                                            "components": spec["components"]})


def server_accepts(body: dict) -> bool:
    """Whether the server's parsing (request model, sampling params, their ranges) takes ``body``;
    the context-length check aside, which needs the tokenized prompt."""
    try:
        req = GenerateReqInput.model_validate_json(json.dumps(body)).to_request()
        for raw in req.sampling_params:
            params = SamplingParams.from_dict(raw)
            params.verify(VOCAB)
            if (raw or {}).get("max_new_tokens") is not None and params.max_new_tokens > CONTEXT_LEN:  # explicit only
                return False
            if params.n * len(req.prompts) > MAX_SEQUENCES_PER_REQUEST:
                return False
    except (ValidationError, InvalidRequestError, SamplingParamsError):
        return False
    return True


SCHEMA_INVALID = [
    {}, {"text": None}, {"text": "a", "input_ids": [1]}, {"text": 5}, {"input_ids": [1.5]}, {"input_ids": ["1"]},
    {"text": "a", "unknown": 1}, {"text": "a", "stream": "yes"}, {"text": "a", "rid": 5},
    *({"text": "a", "sampling_params": sp} for sp in [
        {"max_new_tokens": "5"}, {"max_new_tokens": -1}, {"max_new_tokens": CONTEXT_LEN + 1}, {"max_new_tokens": True},
        {"temperature": "0.5"}, {"temperature": -0.1}, {"top_p": 0}, {"top_p": 1.5}, {"top_k": 0}, {"top_k": -2},
        {"min_p": 2}, {"frequency_penalty": 3}, {"repetition_penalty": 0}, {"n": 0}, {"n": 1025}, {"n": "2"},
        {"ignore_eos": 1}, {"ignore_eos": "true"}, {"stop": 5}, {"stop": [1]}, {"stop_token_ids": [VOCAB]},
        {"stop_token_ids": [-1]}, {"logit_bias": {"1": "x"}}, {"temperatur": 0.5}, {"regex": 5}, "greedy", [1],
        {"sampling_seed": 2**63}, {"sampling_seed": -2**63 - 1}, {"top_k": 2**63}, {"stream_interval": 2**63},
    ]),
]
SCHEMA_VALID = [
    {"text": "a"}, {"input_ids": [1, 2]}, {"text": ["a", "b"]}, {"input_ids": [[1], [2]]}, {"text": "a", "input_ids": None},
    {"text": "a", "sampling_params": None},
    {"text": "a", "sampling_params": {"max_new_tokens": 4, "temperature": 0, "top_k": -1, "n": 2, "stop": ["x"],
                                      "ignore_eos": True, "unknown_but_null": None, "json_schema": {"type": "string"}}},
    {"text": "a", "sampling_params": {"temperature": 1, "top_p": 1, "min_p": 0, "stop_token_ids": [0, VOCAB - 1]}},
    {"text": "a", "sampling_params": {"sampling_seed": 2**63 - 1, "n": 2}},
    {"text": "a", "sampling_params": {"sampling_seed": -2**63}},
    {"text": ["a", "b"], "sampling_params": [{"max_new_tokens": 1}, None], "rid": ["x", "y"]},
]


@pytest.mark.parametrize("body", SCHEMA_INVALID, ids=lambda b: json.dumps(b)[:60])
def test_schema_invalid_bodies_are_rejected_by_the_server(spec, body):
    assert not _validator(spec).is_valid(body), "the schema should reject this body"
    assert not server_accepts(body), "the server takes a body its schema rejects"


@pytest.mark.parametrize("body", SCHEMA_VALID, ids=lambda b: json.dumps(b)[:60])
def test_schema_valid_bodies_are_accepted(spec, body):
    assert _validator(spec).is_valid(body), list(_validator(spec).iter_errors(body))[:3]
    assert server_accepts(body)
