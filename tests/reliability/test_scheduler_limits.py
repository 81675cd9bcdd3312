"""Scheduler limits: ``--max-running-requests`` bounds the running batch under concurrent load, and
``--grammar-compile-timeout`` ends a request whose grammar compiles too slowly with a 400, leaving
the server healthy and the KV pool free. One server: 2 running requests, a 1 ms compile limit."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from tests.conftest import STORY_PROMPTS
from tests.server.helpers import BASE_ARGS, sse_events

from .conftest import assert_clean_log, assert_pool_free_after_flush

MAX_RUNNING = 2
COMPILE_TIMEOUT_S = 0.001
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def server(launch, stories_path):
    return launch(["--model-path", stories_path, *BASE_ARGS, "--max-running-requests", str(MAX_RUNNING),
                   "--grammar-compile-timeout", str(COMPILE_TIMEOUT_S)])


@pytest.fixture(scope="module")
def http(server):
    with server.client(timeout=120) as client:
        yield client


def _body(prompt: str) -> dict:
    return {"text": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}}


def test_running_batch_never_exceeds_max_running_requests(server, http):
    prompts = STORY_PROMPTS[:8]
    results: dict[int, httpx.Response] = {}

    def send(i: int) -> None:
        with server.client(timeout=300) as c:
            results[i] = c.post("/generate", json=_body(prompts[i]))

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    samples = []
    while any(t.is_alive() for t in threads):
        state = http.get("/get_server_info").json()["internal_state"]
        samples.append((state["num_running_reqs"], state["num_waiting_reqs"]))
        time.sleep(0.02)
    for t in threads:
        t.join()
    assert max(running for running, _ in samples) == MAX_RUNNING, samples
    assert any(running == MAX_RUNNING and waiting > 0 for running, waiting in samples), samples  # the limit held others back
    for i, prompt in enumerate(prompts):  # each equals the same request run alone
        assert results[i].status_code == 200, results[i].text
        alone = http.post("/generate", json=_body(prompt)).json()
        out = results[i].json()
        assert out["meta_info"]["finish_reason"] == {"type": "length", "length": NEW_TOKENS}
        assert out["output_ids"] == alone["output_ids"] and out["text"] == alone["text"], prompt


def _slow_schema(tag: str) -> str:
    """A JSON schema that takes xgrammar far longer than 30 ms to compile (1,000 bounded strings);
    ``tag`` makes each distinct (a compiled grammar is cached, a late one included)."""
    props = {f"{tag}{i}": {"type": "string", "maxLength": 50} for i in range(1000)}
    return json.dumps({"type": "object", "properties": props, "required": list(props)})


def _compile_timeout_message() -> str:
    return f"grammar compilation took longer than --grammar-compile-timeout {COMPILE_TIMEOUT_S:g} s"


def test_grammar_compile_timeout_is_a_400(http):
    body = {"text": "Lily", "sampling_params": {"max_new_tokens": 8, "json_schema": _slow_schema("native")}}
    resp = http.post("/generate", json=body)
    assert resp.status_code == 400, resp.text[:300]
    assert resp.json()["error"]["message"] == _compile_timeout_message()

    resp = http.post("/v1/completions", json={"model": "m", "prompt": "Lily", "max_tokens": 8,
                                              "json_schema": _slow_schema("openai")})
    assert resp.status_code == 400, resp.text[:300]
    assert resp.json()["error"]["message"] == _compile_timeout_message()


def test_streamed_grammar_compile_timeout_is_an_in_band_400(server):
    body = {"text": "Lily", "sampling_params": {"max_new_tokens": 8, "json_schema": _slow_schema("stream")}}
    with server.client(timeout=60) as c:
        events = sse_events(c, body)
    assert len(events) == 2 and events[1] == "[DONE]", events
    assert events[0]["error"]["message"] == _compile_timeout_message() and events[0]["error"]["code"] == 400


def test_server_healthy_and_pool_free_after_the_timeouts(server, http):
    assert http.get("/health").status_code == 200
    resp = http.post("/generate", json={"text": "Lily", "sampling_params": {"temperature": 0, "max_new_tokens": 4}})
    assert resp.status_code == 200, resp.text
    assert_pool_free_after_flush(http)
    assert_clean_log(server)
