"""Error bodies, in process (no server): native routes answer ``{"error": {"message", "type",
"code": <status>}}``, ``/v1/*`` answers OpenAI's ``{"error": {"message", "type", "param", "code"}}``,
for handler errors (400, 503), router errors (404, 405 with ``Allow``), a missing API key (401) and
an oversized body (413). A stand-in TokenizerManager refuses every request with 503."""

from __future__ import annotations

import asyncio

import pytest
from fastapi.testclient import TestClient

from radixlm.srt.http_server import LimitsMiddleware, create_app
from radixlm.srt.server_args import ServerArgs
from tests.fakes import OverloadedTokenizerManager

NATIVE_KEYS = {"message", "type", "code"}
OPENAI_KEYS = {"message", "type", "param", "code"}
KEY = "shape-test-key"


def _client(tok, api_key=None) -> TestClient:
    info = {"served_model_name": "m", "model_path": "/models/m", "context_length": 2048}
    return TestClient(create_app(OverloadedTokenizerManager(tok), ServerArgs(api_key=api_key), info, None, "0"))


@pytest.fixture(scope="module")
def tok(stories_path):
    from radixlm.srt.model_loader import load_tokenizer

    return load_tokenizer(stories_path)


@pytest.fixture(scope="module")
def client(tok):
    with _client(tok) as c:
        yield c


def native_error(resp, status: int, err_type: str) -> dict:
    """Assert the native shape with ``status`` and ``err_type``; returns the error object."""
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"] == "application/json", resp.headers
    err = resp.json()["error"]
    assert set(err) == NATIVE_KEYS and err["code"] == status and err["type"] == err_type, err
    assert isinstance(err["message"], str) and err["message"], err
    return err


def openai_error(resp, status: int, err_type: str) -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == OPENAI_KEYS and err["type"] == err_type, err
    assert isinstance(err["message"], str) and err["message"], err
    return err


def test_bad_body_is_a_native_400(client):
    err = native_error(client.post("/generate", json={"text": "a", "input_ids": [1]}), 400, "invalid_request_error")
    assert "exactly one of text and input_ids" in err["message"]
    native_error(client.post("/generate", content=b"{not json"), 400, "invalid_request_error")
    native_error(client.post("/abort_request", json={}), 400, "invalid_request_error")


def test_overload_is_a_native_503_with_retry_after(client):
    resp = client.post("/generate", json={"text": "Lily"})
    err = native_error(resp, 503, "service_unavailable_error")
    assert "queue is full" in err["message"] and resp.headers["retry-after"].isdigit()


@pytest.mark.parametrize("path", ["/nothing", "/generate/x", "/healthz", "/v1"])
def test_unknown_native_path_is_a_native_404(client, path):
    err = native_error(client.get(path), 404, "not_found_error")
    assert path in err["message"]


def test_wrong_method_on_a_native_route_is_a_native_405_with_allow(client):
    resp = client.delete("/generate")
    native_error(resp, 405, "invalid_request_error")
    assert set(resp.headers["allow"].replace(" ", "").split(",")) == {"POST", "PUT"}
    native_error(client.post("/health"), 405, "invalid_request_error")


def test_v1_router_errors_are_openai_shaped(client):
    openai_error(client.get("/v1/nothing"), 404, "not_found_error")
    resp = client.delete("/v1/completions")
    openai_error(resp, 405, "invalid_request_error")
    assert resp.headers["allow"] == "POST"
    openai_error(client.post("/v1/completions", json={"prompt": "a"}), 503, "service_unavailable_error")


def test_missing_or_wrong_key_is_401_in_each_shape(tok):
    with _client(tok, api_key=KEY) as c:
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": KEY}):
            native_error(c.get("/get_model_info", headers=headers), 401, "authentication_error")
            err = openai_error(c.get("/v1/models", headers=headers), 401, "authentication_error")
            assert err["code"] == "invalid_api_key"
        assert c.get("/get_model_info", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
        assert c.get("/health").status_code == 200


def test_browser_preflight_and_cross_origin_requests_are_allowed(tok):
    """CORS as SGLang's server has it: a preflight OPTIONS from any origin gets 200 with the allow
    headers (before the API key check: a preflight carries no key), and responses name the origin."""
    origin = {"Origin": "http://localhost:5173"}
    preflight = {**origin, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization,content-type"}
    with _client(tok, api_key=KEY) as c:
        for path in ("/v1/chat/completions", "/generate"):
            resp = c.options(path, headers=preflight)
            assert resp.status_code == 200, resp.text
            assert resp.headers["access-control-allow-origin"] == "http://localhost:5173"
            assert "POST" in resp.headers["access-control-allow-methods"]
            assert "authorization" in resp.headers["access-control-allow-headers"].lower()
        ok = c.get("/v1/models", headers={**origin, "Authorization": f"Bearer {KEY}"})
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "http://localhost:5173"
        refused = c.get("/v1/models", headers=origin)  # still 401 without the key, readable by the page
        assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == "http://localhost:5173"


@pytest.mark.parametrize("path, shape", [("/generate", NATIVE_KEYS), ("/v1/completions", OPENAI_KEYS)])
def test_body_over_the_limit_is_413_in_each_shape(path, shape):
    async def echo(scope, receive, send):  # never reached: the middleware answers first
        raise AssertionError("the body should have been refused")

    sent: list[dict] = []
    body = [{"type": "http.request", "body": b"x" * 11, "more_body": False}]

    async def receive():
        return body.pop()

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "path": path, "method": "POST", "headers": []}
    asyncio.run(LimitsMiddleware(echo, max_body=10)(scope, receive, send))
    assert sent[0]["status"] == 413
    import json

    err = json.loads(sent[1]["body"])["error"]
    assert set(err) == shape and "larger than 10 bytes" in err["message"]
    if shape is NATIVE_KEYS:
        assert err["code"] == 413
