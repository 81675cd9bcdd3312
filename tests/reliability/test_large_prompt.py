"""Very large prompts: tokenized off the event loop, refused before tokenizing when they certainly
cannot fit (``managers/prompt_tokenizer.py``).

The server runs stories260K with a 500,000-token context, so a prompt of a few MB can be in either
case: one whose byte count alone proves it too long (refused at once), and one that needs the exact
count (tokenized for seconds on a worker thread, then refused) — while the latter is tokenized, the
server keeps answering other requests.
"""

from __future__ import annotations

import json
import socket
import threading

import pytest

from tests.server.helpers import ServerProcess

from .conftest import CHAT_TEMPLATE, assert_pool_free_after_flush

CONTEXT = 500_000
SENTENCE = "Once upon a time, there was a little girl named Lily. "  # 54 bytes, 15 stories260K tokens


@pytest.fixture(scope="module")
def server(launch, stories_path):
    return launch(["--model-path", stories_path, "--context-length", str(CONTEXT), "--max-total-tokens", "40000",
                   "--max-running-requests", "2", "--chat-template", CHAT_TEMPLATE, "--log-level", "info"])


@pytest.fixture(scope="module")
def http(server):
    with server.client(timeout=120) as client:
        yield client


def _send_raw(server: ServerProcess, path: str, body: dict) -> socket.socket:
    """POST ``body`` on a raw connection; returns once the whole request is handed to the kernel."""
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=300)
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode()
    sock.sendall(head + data)
    return sock


def _read_raw(sock: socket.socket) -> tuple[int, dict]:
    chunks = []
    while chunk := sock.recv(1 << 16):
        chunks.append(chunk)
    sock.close()
    head, _, payload = b"".join(chunks).partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(payload)


def test_prompt_certainly_too_long_is_refused_naming_the_context(http):
    text = SENTENCE * (5_000_000 // len(SENTENCE))  # 5 MB: more bytes than 500,000 of the longest token hold
    resp = http.post("/generate", json={"text": text, "sampling_params": {"max_new_tokens": 1}})
    assert resp.status_code == 400, resp.text[:300]
    message = resp.json()["error"]["message"]
    assert f"context length ({CONTEXT} tokens)" in message and "at least" in message, message
    for path, body in (("/v1/completions", {"model": "m", "prompt": text}),
                       ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": text}]})):
        resp = http.post(path, json=body)
        assert resp.status_code == 400, resp.text[:300]
        err = resp.json()["error"]
        assert err["code"] == "context_length_exceeded" and f"maximum context length is {CONTEXT}" in err["message"]


@pytest.mark.parametrize("path", ["/generate", "/v1/completions"])
def test_server_answers_others_while_a_large_prompt_is_tokenized(server, http, path):
    """A prompt of ~4.3 MB (about 1.2 M tokens; its byte count does not prove it too long) is
    tokenized for seconds; a small generation and /health sent after it finish before its 400."""
    text = SENTENCE * (4_300_000 // len(SENTENCE))
    body = ({"text": text, "sampling_params": {"max_new_tokens": 1}} if path == "/generate"
            else {"model": "m", "prompt": text, "max_tokens": 1})
    order: list[str] = []
    large: dict = {}

    def wait_large(sock: socket.socket) -> None:
        large["status"], large["body"] = _read_raw(sock)
        order.append("large")

    reader = threading.Thread(target=wait_large, args=(_send_raw(server, path, body),))
    reader.start()
    small = http.post("/generate", json={"text": "Lily", "sampling_params": {"temperature": 0, "max_new_tokens": 2}})
    order.append("small")
    health = http.get("/health")
    order.append("health")
    reader.join(300)
    assert small.status_code == 200 and health.status_code == 200
    assert order == ["small", "health", "large"], order
    assert large["status"] == 400, large
    message = large["body"]["error"]["message"]
    assert f"{CONTEXT}" in message and "context length" in message, message


def test_pool_free_at_the_end(http):
    assert_pool_free_after_flush(http)
