"""Request time limits: ``--request-timeout`` and the per-request ``timeout`` field (native
``/generate`` and an extra body field of ``/v1/completions`` and ``/v1/chat/completions``).

On expiry the request is aborted in the scheduler (its KV freed) and ends exactly once with
finish_reason ``{"type": "abort", "message": "request timed out after X s"}`` (OpenAI: ``"abort"``),
keeping its partial output; the limit is the smaller of the two where both are set.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from typing import Any, Callable

import pytest

from tests.server.helpers import BASE_ARGS, ENDLESS_ARGS, ENDLESS_TOKENS, endless, sse_events

from .conftest import CHAT_TEMPLATE, assert_pool_free_after_flush

SERVER_TIMEOUT_S = 6
LONG = endless()  # cannot finish before any limit here, whatever the CPU


@pytest.fixture(scope="module")
def server(launch, stories_path):
    return launch(["--model-path", stories_path, *BASE_ARGS, *ENDLESS_ARGS, "--request-timeout", str(SERVER_TIMEOUT_S),
                   "--chat-template", CHAT_TEMPLATE])


@pytest.fixture(scope="module")
def http(server):
    with server.client(timeout=120) as client:
        yield client


def _timed_out(seconds: float) -> dict:
    return {"type": "abort", "message": f"request timed out after {seconds:g} s"}


def _concurrently(*calls: Callable[[], Any]) -> list[Any]:
    """Run ``calls`` in threads at once; their results in order (an exception is re-raised)."""
    results: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        try:
            results[i] = calls[i]()
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


def test_timeout_aborts_keeping_partial_output_and_spares_the_others(server, http):
    def timed() -> Any:
        with server.client(timeout=60) as c:
            return c.post("/generate", json={"text": "Once upon a time", "sampling_params": LONG, "timeout": 0.5})

    def normal() -> Any:
        with server.client(timeout=60) as c:
            return c.post("/generate", json={"text": "Lily", "sampling_params": {"temperature": 0, "max_new_tokens": 8}})

    timed_resp, normal_resp = _concurrently(timed, normal)
    assert timed_resp.status_code == 200, timed_resp.text
    out = timed_resp.json()
    meta = out["meta_info"]
    assert meta["finish_reason"] == _timed_out(0.5)
    assert meta["completion_tokens"] == len(out["output_ids"]) < LONG["max_new_tokens"]
    assert normal_resp.status_code == 200, normal_resp.text
    assert normal_resp.json()["meta_info"]["finish_reason"] == {"type": "length", "length": 8}


def test_streamed_timeout_ends_with_one_final_event_then_done(server):
    with server.client(timeout=60) as c:
        events = sse_events(c, {"text": "Lily", "sampling_params": LONG, "timeout": 1.5})
    assert events[-1] == "[DONE]"
    outputs = events[:-1]
    assert all("error" not in e for e in outputs), outputs[-1]
    finished = [e for e in outputs if e["meta_info"]["finish_reason"] is not None]
    assert finished == [outputs[-1]]  # exactly one finish reason, on the last event
    assert outputs[-1]["meta_info"]["finish_reason"] == _timed_out(1.5)
    final = outputs[-1]
    assert final["output_ids"], "the partial output is kept"
    assert all(final["text"].startswith(e["text"]) for e in outputs)  # cumulative: nothing lost


def test_timeout_ends_every_sample_of_n(http):
    resp = http.post("/generate", json={"text": "Lily", "sampling_params": {**LONG, "temperature": 1.0, "n": 2},
                                        "timeout": 0.5})
    assert resp.status_code == 200, resp.text
    results = resp.json()
    assert len(results) == 2
    assert [r["meta_info"]["finish_reason"] for r in results] == [_timed_out(0.5)] * 2


def test_server_limit_caps_every_request(server):
    """No field, a larger field, and an OpenAI request: all end at the server's limit."""
    def native(extra: dict) -> Callable[[], Any]:
        def call() -> Any:
            with server.client(timeout=120) as c:
                return c.post("/generate", json={"text": "Lily", "sampling_params": LONG, **extra}).json()
        return call

    def completion() -> Any:
        with server.client(timeout=120) as c:
            return c.post("/v1/completions", json={"model": "m", "prompt": "Lily", "max_tokens": ENDLESS_TOKENS,
                                                    "ignore_eos": True, "temperature": 0}).json()

    plain, larger, openai = _concurrently(native({}), native({"timeout": 100}), completion)
    assert plain["meta_info"]["finish_reason"] == _timed_out(SERVER_TIMEOUT_S)
    assert larger["meta_info"]["finish_reason"] == _timed_out(SERVER_TIMEOUT_S)
    assert openai["choices"][0]["finish_reason"] == "abort"
    assert 0 < openai["usage"]["completion_tokens"] < ENDLESS_TOKENS


def test_openai_timeout_field(server, http):
    resp = http.post("/v1/completions", json={"model": "m", "prompt": "Lily", "max_tokens": ENDLESS_TOKENS,
                                              "ignore_eos": True, "timeout": 0.5})
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["finish_reason"] == "abort"
    assert resp.json()["usage"]["completion_tokens"] < ENDLESS_TOKENS

    body = {"model": "m", "messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": ENDLESS_TOKENS,
            "ignore_eos": True, "timeout": 0.5, "stream": True}
    lines = []
    with http.stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200, resp.read()
        lines = [line[len("data: "):] for line in resp.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(x) for x in lines[:-1]]
    reasons = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert reasons == ["abort"], chunks[-3:]


@pytest.mark.parametrize("value", ["0", "-1", '"1"', "true", "NaN", "1e999", "[1]"])
def test_invalid_timeout_is_400(http, value):
    for path, body in (("/generate", '{"text": "Lily", "timeout": %s}'),
                       ("/v1/completions", '{"model": "m", "prompt": "Lily", "timeout": %s}'),
                       ("/v1/chat/completions", '{"model": "m", "messages": [{"role": "user", "content": "x"}], '
                                                '"timeout": %s}')):
        resp = http.post(path, content=body % value, headers={"content-type": "application/json"})
        assert resp.status_code == 400, (path, value, resp.text)
        assert "timeout" in resp.json()["error"]["message"], (path, value, resp.text)


def test_invalid_server_timeout_is_a_usage_error():
    for value in ("0", "-2", "nan"):
        proc = subprocess.run([sys.executable, "-m", "radixlm.srt.launch_server", "--request-timeout", value],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and "--request-timeout must be a number of seconds > 0" in proc.stderr, proc.stderr


def test_pool_free_at_the_end(http):
    assert_pool_free_after_flush(http)
