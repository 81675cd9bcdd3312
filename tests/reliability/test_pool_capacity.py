"""Outputs that outgrow the whole KV pool (issue: one such request killed the server; a chat request
without max_tokens was refused with 503 whenever the pool was smaller than the context).

The issue's configuration: stories260K, ``--page-size 16 --chunked-prefill-size 32
--max-total-tokens 1024`` (the model's context is 2048). A request whose output cannot fit beside
its prompt gets its output up to the pool's capacity with ``finish_reason`` length and a message;
the server stays up, other requests are served, and no KV page leaks.
"""

from __future__ import annotations

import concurrent.futures as cf

import pytest

from .conftest import CHAT_TEMPLATE, assert_clean_log, assert_pool_free_after_flush

POOL = 1024
PROMPT = "Once upon a time, there was a dog named Max. Max loved to run and play. One day, Max found a bone. " * 4


@pytest.fixture(scope="module")
def server(launch, stories_path):
    return launch(["--model-path", stories_path, "--page-size", "16", "--chunked-prefill-size", "32",
                   "--max-total-tokens", str(POOL), "--chat-template", CHAT_TEMPLATE, "--log-level", "info"])


@pytest.fixture(scope="module")
def http(server):
    with server.client(timeout=300) as client:
        yield client


def _long(http, **extra):
    return http.post("/generate", json={"text": PROMPT, "sampling_params": {
        "temperature": 0, "max_new_tokens": 1000, "ignore_eos": True, **extra}})


def test_lone_request_longer_than_the_pool_gets_length(http, server):
    resp = _long(http)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    meta = body["meta_info"]
    n_prompt = meta["prompt_tokens"]
    assert 80 <= n_prompt <= 200
    assert meta["finish_reason"]["type"] == "length"
    assert meta["finish_reason"]["length"] == meta["completion_tokens"] == POOL - n_prompt
    assert "KV cache" in meta["finish_reason"]["message"] and "--max-total-tokens" in meta["finish_reason"]["message"]
    assert len(body["output_ids"]) == POOL - n_prompt and body["text"]
    again = http.post("/generate", json={"text": "Lily", "sampling_params": {"temperature": 0, "max_new_tokens": 4}})
    assert again.status_code == 200 and again.json()["meta_info"]["completion_tokens"] == 4
    assert_pool_free_after_flush(http)
    assert_clean_log(server)


def test_streamed_and_concurrent_overflows_all_end_once(http, server):
    def one(i: int):
        if i % 2:
            return _long(http, sampling_seed=i).json()["meta_info"]["finish_reason"]
        finishes = []
        with http.stream("POST", "/generate", json={"text": PROMPT, "stream": True, "sampling_params": {
                "temperature": 0, "max_new_tokens": 1000, "ignore_eos": True}}) as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():
                if line.startswith("data: {"):
                    import json
                    fin = json.loads(line[6:])["meta_info"]["finish_reason"]
                    if fin is not None:
                        finishes.append(fin)
        assert len(finishes) == 1, finishes
        return finishes[0]

    with cf.ThreadPoolExecutor(4) as pool:
        finishes = list(pool.map(one, range(4)))
    assert all(f["type"] == "length" for f in finishes), finishes
    assert http.get("/health").status_code == 200
    assert_pool_free_after_flush(http)
    assert_clean_log(server)


def test_chat_without_max_tokens_is_served(http):
    """No max_tokens: the reply may use the rest of the context, limited by what fits in the pool."""
    resp = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": PROMPT}],
                                                   "temperature": 0, "ignore_eos": True})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    usage = body["usage"]
    assert body["choices"][0]["finish_reason"] == "length"
    assert usage["prompt_tokens"] + usage["completion_tokens"] == POOL
    plain = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Lily"}],
                                                    "temperature": 0})
    assert plain.status_code == 200 and plain.json()["choices"][0]["finish_reason"] in ("stop", "length")


def test_completion_max_tokens_beyond_the_pool(http):
    resp = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1500, "temperature": 0,
                                              "ignore_eos": True})
    assert resp.status_code == 200, resp.text
    usage = resp.json()["usage"]
    assert resp.json()["choices"][0]["finish_reason"] == "length"
    assert usage["prompt_tokens"] + usage["completion_tokens"] == POOL
