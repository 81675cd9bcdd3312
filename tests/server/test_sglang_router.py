"""SGLang's own router (``pip install sglang-router``) in front of two radixlm servers:
``python -m sglang_router.launch_router --worker-urls A B --policy cache_aware``. Its worker
registration (``/health``, ``/server_info``, ``/model_info``) passes, and ``/generate`` and ``/v1/*``
through it, streamed or not, answer what the servers answer directly.

The router re-serializes each body with SGLang's defaults filled in (``model: null``, ``log_metrics:
true``, ``background``/``no_logs``/``return_bytes``/``return_hidden_states`` false on /generate,
``return_hidden_states: false`` and ``stream_reasoning: true`` on /v1), which radixlm used to reject
with a 400; ``test_the_routers_bodies_are_accepted`` checks those bodies without the router.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.conftest import STORY_PROMPTS

from .helpers import BASE_ARGS, free_port, greedy

TEMPLATE = Path(__file__).parents[1] / "openai_api" / "chatml.jinja"
WORKER_ARGS = [*BASE_ARGS, "--cpu-threads", "1", "--chat-template", str(TEMPLATE)]
# What sglang-router 0.3.2 sends a worker for a client's {"text", "sampling_params"} (captured on the wire).
ROUTER_GENERATE_EXTRAS = {"model": None, "return_text_in_logprobs": False, "stream": False, "log_metrics": True,
                          "return_hidden_states": False, "background": False, "no_logs": False, "return_bytes": False,
                          "return_entropy": False}
ROUTER_CHAT_EXTRAS = {"logprobs": False, "stream": False, "no_stop_trim": False, "ignore_eos": False,
                      "continue_final_message": False, "skip_special_tokens": True, "separate_reasoning": True,
                      "stream_reasoning": True, "return_hidden_states": False}


@pytest.fixture(scope="module")
def workers(launch, stories_path):
    """Two stories260K servers, started side by side."""
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(lambda _: launch(["--model-path", stories_path, *WORKER_ARGS]), range(2)))


@pytest.fixture(scope="module")
def router(workers):
    pytest.importorskip("sglang_router")
    port = free_port()
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
           "--prometheus-port", str(free_port()), "--policy", "cache_aware", "--worker-urls", *[w.url for w in workers]]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    try:
        while True:  # ready once both workers are registered: each answers a request through it
            assert proc.poll() is None, proc.stdout.read().decode(errors="replace")[-3000:]
            try:
                if len(httpx.get(url + "/workers", timeout=5).json().get("workers", [])) == 2:
                    break
            except (httpx.HTTPError, ValueError):
                pass
            assert time.monotonic() < deadline, "router did not register both workers"
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _events(client: httpx.Client, path: str, body: dict) -> list:
    out = []
    with client.stream("POST", path, json={**body, "stream": True}) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append(json.loads(line[len("data: "):]))
    return out


def _strip_ids(obj: dict) -> dict:
    """A /v1 answer without what differs between two calls (id, created, cached tokens) or routes
    (the model name)."""
    out = {k: v for k, v in obj.items() if k not in ("id", "created", "model", "usage")}
    out["usage"] = {k: obj["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    return out


def test_the_routers_bodies_are_accepted(workers):
    with workers[0].client() as http:
        body = {"text": STORY_PROMPTS[0], "sampling_params": greedy(6)}
        plain = http.post("/generate", json=body).json()
        routed = http.post("/generate", json={**body, **ROUTER_GENERATE_EXTRAS})
        assert routed.status_code == 200, routed.text
        assert routed.json()["output_ids"] == plain["output_ids"]
        for field, value in (("return_bytes", True), ("background", True), ("log_metrics", False)):
            resp = http.post("/generate", json={**body, field: value})
            assert resp.status_code == 400 and field in resp.json()["error"]["message"], resp.text
        chat = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 5,
                "temperature": 0}
        resp = http.post("/v1/chat/completions", json={**chat, **ROUTER_CHAT_EXTRAS})
        assert resp.status_code == 200, resp.text
        for field, value in (("return_hidden_states", True), ("stream_reasoning", False)):
            resp = http.post("/v1/chat/completions", json={**chat, field: value})
            assert resp.status_code == 400 and resp.json()["error"]["param"] == field, resp.text


def test_generate_through_the_router_equals_direct(workers, router):
    body = {"text": STORY_PROMPTS[3], "sampling_params": greedy(12)}
    with workers[0].client() as direct, httpx.Client(base_url=router, timeout=120) as via:
        expected = direct.post("/generate", json=body).json()
        got = via.post("/generate", json=body)
        assert got.status_code == 200, got.text
        assert (got.json()["text"], got.json()["output_ids"]) == (expected["text"], expected["output_ids"])
        events = _events(via, "/generate", body)
        assert events[-1]["text"] == expected["text"] and events[-1]["output_ids"] == expected["output_ids"]
        ids = {"input_ids": expected["output_ids"][:5], "sampling_params": greedy(8)}
        assert via.post("/generate", json=ids).json()["output_ids"] == direct.post("/generate", json=ids).json()["output_ids"]
        # (a batch, "text": [...], is refused by the router itself: 422, it parses text as one string)


def test_v1_through_the_router_equals_direct(workers, router):
    chat = {"model": "stories260k", "messages": [{"role": "user", "content": STORY_PROMPTS[5]}],
            "max_tokens": 10, "temperature": 0}
    completion = {"model": "stories260k", "prompt": STORY_PROMPTS[6], "max_tokens": 10, "temperature": 0}
    with workers[1].client() as direct, httpx.Client(base_url=router, timeout=120) as via:
        for path, body in (("/v1/chat/completions", chat), ("/v1/completions", completion)):
            expected = direct.post(path, json=body).json()
            got = via.post(path, json=body)
            assert got.status_code == 200, got.text
            assert _strip_ids(got.json()) == _strip_ids(expected)
            streamed = "".join((c["choices"][0].get("delta") or {}).get("content") or c["choices"][0].get("text") or ""
                               for c in _events(via, path, body) if c["choices"])
            first = expected["choices"][0]
            assert streamed == (first["message"]["content"] if "message" in first else first["text"])
        models = via.get("/v1/models")
        assert models.status_code == 200 and models.json()["data"], models.text
