"""Limits: request body size (413), a client leaving mid-body (499, no error), queue full (503 with Retry-After), max_new_tokens beyond the
context (400; the default is clamped to it), a prompt that fills the context (400), fan-out of one
request (prompts x n, 400), a burst of streams over the queue (503 before the stream). One server: 1
running + 0 queued, and servers of their own for the queue tests."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.server.helpers import ENDLESS_ARGS, endless

from .conftest import app_routes, assert_clean_log, assert_pool_free_after_flush

BODY_LIMIT = 32 << 20  # radixlm.srt.http_server.MAX_REQUEST_BODY_BYTES


@pytest.fixture(scope="module")
def server(launch, stories_path):
    return launch(["--model-path", stories_path, "--max-total-tokens", "3000", "--max-running-requests", "1",
                   "--max-queued-requests", "0", "--log-level", "info"])


@pytest.fixture(scope="module")
def http(server):
    with server.client(timeout=60) as client:
        yield client


def _still_serves(http: httpx.Client) -> None:
    resp = http.post("/generate", json={"text": "Lily", "sampling_params": {"temperature": 0, "max_new_tokens": 2}})
    assert resp.status_code == 200, resp.text


@pytest.mark.parametrize("path", ["/generate", "/v1/completions", "/v1/chat/completions"])
def test_a_client_leaving_while_its_body_is_read_is_not_a_server_error(server, http, path):
    """Half a body, then the socket closes: nobody to answer (the route never runs), and no "internal
    error" traceback in the log (the soak suite's disconnecting clients found this)."""
    import socket

    if path not in app_routes(http):
        pytest.skip(f"no {path}")
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: 500\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(head + b'{"text": "Once upon')
        time.sleep(0.3)
    time.sleep(0.5)  # the server reads the disconnect
    _still_serves(http)
    assert_clean_log(server)


@pytest.mark.parametrize("path", ["/generate", "/v1/completions"])
def test_body_over_the_limit_is_413(http, path):
    if path not in app_routes(http):
        pytest.skip(f"no {path}")
    text = "a " * ((BODY_LIMIT // 2) + 10)
    field = "text" if path == "/generate" else "prompt"
    resp = http.post(path, json={field: text})  # with Content-Length: refused before it is read
    assert resp.status_code == 413, resp.text[:300]
    assert "larger than" in resp.json()["error"]["message"]
    _still_serves(http)


def test_chunked_body_over_the_limit_is_413(http):
    chunk = b" " * (1 << 20)

    def body():  # no Content-Length: the limit is enforced while reading
        yield b'{"text": "a"'
        for _ in range(BODY_LIMIT // len(chunk) + 2):
            yield chunk
        yield b"}"

    try:
        resp = http.post("/generate", content=body(), headers={"content-type": "application/json"})
        assert resp.status_code == 413, resp.text[:300]
    except httpx.WriteError:
        pass  # the server answered and closed while we were still sending: also a refusal
    _still_serves(http)


def test_body_under_the_limit_is_served(http):
    resp = http.post("/generate", content=b'{"text": "Lily", "sampling_params": {"max_new_tokens": 1}}'
                     + b" " * (4 << 20), headers={"content-type": "application/json"})
    assert resp.status_code == 200, resp.text


def test_queue_full_is_503_with_retry_after(launch, stories_path):
    """1 running + 0 queued, with a request that outlasts the test (ENDLESS_ARGS) holding the slot."""
    server = launch(["--model-path", stories_path, *ENDLESS_ARGS, "--max-running-requests", "1",
                     "--max-queued-requests", "0", "--log-level", "info"])
    with server.client(timeout=60) as http:
        _queue_full(server, http)


def test_a_burst_of_streams_over_the_queue_is_refused_before_the_stream(launch, stories_path):
    """1 running + 2 queued, then 12 streamed requests at once (native, completions, chat): each is
    either an HTTP 200 stream that ends with its finish_reason and [DONE], or a 503 before any byte of
    a stream. (Before, all 12 passed the check before any was counted: 9 got a 200, then the "queue
    is full" error inside the stream, and a chat stream's role chunk went out with no finish_reason.)"""
    import asyncio
    import json

    server = launch(["--model-path", stories_path, "--max-running-requests", "1", "--max-queued-requests", "2",
                     "--log-level", "info"])
    chat = {"messages": [{"role": "user", "content": "Lily"}], "max_tokens": 4}
    with server.client(timeout=60) as http:
        routes = app_routes(http)
        if "/v1/chat/completions" in routes and http.post("/v1/chat/completions", json=chat).status_code != 200:
            routes.remove("/v1/chat/completions")  # a model without a chat template
    bodies = [("/generate", {"text": "Lily", "stream": True, "sampling_params": {"max_new_tokens": 4}})]
    if "/v1/completions" in routes:
        bodies.append(("/v1/completions", {"prompt": "Lily", "max_tokens": 4, "stream": True}))
    if "/v1/chat/completions" in routes:
        bodies.append(("/v1/chat/completions", {**chat, "stream": True}))

    async def one(client: httpx.AsyncClient, path: str, body: dict) -> tuple[int, list[dict]]:
        async with client.stream("POST", path, json=body) as resp:
            if resp.status_code != 200:
                await resp.aread()
                return resp.status_code, [resp.json()]
            events = [line[6:] async for line in resp.aiter_lines() if line.startswith("data: ")]
            assert events and events[-1] == "[DONE]", (path, events)
            return 200, [json.loads(e) for e in events[:-1]]

    async def burst() -> list[tuple[str, int, list[dict]]]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60,
                                     limits=httpx.Limits(max_connections=16)) as client:
            jobs = [bodies[i % len(bodies)] for i in range(12)]
            got = await asyncio.gather(*(one(client, p, b) for p, b in jobs))
            return [(p, *g) for (p, _), g in zip(jobs, got)]

    results = asyncio.run(burst())
    codes = [code for _, code, _ in results]
    assert set(codes) <= {200, 503} and 1 <= codes.count(200) <= 3, codes
    for path, code, events in results:
        if code == 503:
            assert "queue is full" in events[0]["error"]["message"]
            continue
        assert not any("error" in e for e in events), (path, events)
        if path == "/generate":
            assert events[-1]["meta_info"]["finish_reason"]["type"] == "length"
        else:
            finishes = [c["finish_reason"] for e in events for c in e["choices"] if c.get("finish_reason")]
            assert finishes == ["length"], (path, events)
    with server.client(timeout=60) as http:
        assert_pool_free_after_flush(http)


def _queue_full(server, http) -> None:
    done: list = []

    def long_request() -> None:
        with server.client(timeout=120) as c:
            done.append(c.post("/generate", json={"text": "Once", "rid": "hog",
                                                  "sampling_params": endless()}))

    thread = threading.Thread(target=long_request)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while http.get("/get_server_info").json()["internal_state"]["num_running_reqs"] == 0:
            assert time.monotonic() < deadline, "the long request never started"
            time.sleep(0.05)
        paths = [("/generate", {"text": "Lily"})]
        if "/v1/completions" in app_routes(http):
            paths.append(("/v1/completions", {"prompt": "Lily", "max_tokens": 2}))
        for path, body in paths:
            resp = http.post(path, json=body)
            assert resp.status_code == 503, resp.text
            assert resp.headers.get("retry-after", "").isdigit(), (path, dict(resp.headers))
            assert resp.json()["error"]["message"]
    finally:
        http.post("/abort_request", json={"rid": "hog"})
        thread.join(60)
    assert done and done[0].status_code == 200 and done[0].json()["meta_info"]["finish_reason"]["type"] == "abort"
    _still_serves(http)


def test_max_new_tokens_beyond_context_is_400(http):
    resp = http.post("/generate", json={"text": "Lily", "sampling_params": {"max_new_tokens": 5000}})
    assert resp.status_code == 400 and "context length" in resp.json()["error"]["message"]
    if "/v1/completions" in app_routes(http):
        resp = http.post("/v1/completions", json={"prompt": "Lily", "max_tokens": 5000})
        assert resp.status_code == 400, resp.text


CONTEXT = 2048  # stories260K
FILLER_IDS = list(range(5, 505)) * 5  # 2,500 in-vocabulary token ids


def test_prompt_that_fills_the_context_is_400(http):
    resp = http.post("/generate", json={"input_ids": FILLER_IDS[:CONTEXT], "sampling_params": {"max_new_tokens": 1}})
    assert resp.status_code == 400
    assert f"({CONTEXT} tokens) is longer than the model's context length ({CONTEXT} tokens)" in resp.json()["error"]["message"]
    if "/v1/completions" in app_routes(http):
        resp = http.post("/v1/completions", json={"prompt": FILLER_IDS[:CONTEXT]})
        assert resp.status_code == 400 and resp.json()["error"]["code"] == "context_length_exceeded", resp.text


def test_default_max_new_tokens_is_clamped_to_the_last_context_slot(http):
    body = {"input_ids": FILLER_IDS[:CONTEXT - 1], "sampling_params": {"temperature": 0, "ignore_eos": True}}
    resp = http.post("/generate", json=body)
    assert resp.status_code == 200, resp.text
    meta = resp.json()["meta_info"]
    assert meta["completion_tokens"] == 1 and meta["finish_reason"] == {"type": "length", "length": 1}
    resp = http.post("/generate", json={**body, "sampling_params": {**body["sampling_params"], "max_new_tokens": 2}})
    assert resp.status_code == 400 and "max_new_tokens is 2" in resp.json()["error"]["message"]  # explicit: no clamp


@pytest.mark.parametrize("body", [
    {"text": "a", "sampling_params": {"max_new_tokens": 1, "n": 1025}},
    {"text": ["a"] * 513, "sampling_params": {"max_new_tokens": 1, "n": 2}},
    {"input_ids": [[5]] * 1025, "sampling_params": {"max_new_tokens": 1}},
], ids=["n", "prompts-x-n", "prompts"])
def test_fan_out_of_one_request_is_bounded(http, body):
    resp = http.post("/generate", json=body)
    assert resp.status_code == 400, resp.text[:300]
    assert "1024" in resp.json()["error"]["message"]


def test_pool_free_at_the_end(http):
    assert_pool_free_after_flush(http)
