"""A server with --speculative-algorithm NGRAM: streamed and unstreamed output equal decoding without
speculation (the offline Engine), meta_info carries SGLang's spec fields, /metrics the counters."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from radixlm.srt.engine import Engine
from tests.conftest import STORY_PROMPTS

from .helpers import BASE_ARGS, greedy, sse_events, wait_idle


@pytest.fixture(scope="module")
def engine(stories_path):
    return Engine(stories_path, dtype="float32", max_total_tokens=8192)


@pytest.fixture(scope="module")
def http(launch, stories_path):
    server = launch(["--model-path", stories_path, *BASE_ARGS, "--speculative-algorithm", "NGRAM",
                     "--speculative-num-draft-tokens", "6", "--page-size", "16"])
    with server.client() as client:
        yield client


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} missing from /metrics:\n{text}")


@pytest.mark.parametrize("prompt,stop", [(STORY_PROMPTS[0], None), (STORY_PROMPTS[3], ["park"]),
                                         (STORY_PROMPTS[5], ["."])])
def test_stream_equals_unstreamed_and_no_speculation(http, engine, prompt, stop):
    sp = greedy(40, stop=stop) if stop else greedy(40, ignore_eos=True)
    want = engine.generate(prompt, sp)
    for _ in range(2):  # the second time the tree drafts whole runs
        full = http.post("/generate", json={"text": prompt, "sampling_params": sp}).json()
        events = sse_events(http, {"text": prompt, "sampling_params": sp})
        assert events[-1] == "[DONE]"
        data = events[:-1]
        texts = [e["text"] for e in data]
        assert all(b.startswith(a) for a, b in zip(texts, texts[1:])), "text must be cumulative"
        for got in (full, data[-1]):
            assert (got["text"], got["output_ids"], got["meta_info"]["finish_reason"]) == \
                (want["text"], want["output_ids"], want["meta_info"]["finish_reason"])
    meta = data[-1]["meta_info"]
    assert "spec_verify_ct" in meta and "spec_accept_length" in meta
    if stop is None:  # 40 tokens, the last 24+ of them in the tree's 16-token pages: drafts accepted
        assert meta["spec_verify_ct"] > 0 and meta["spec_accept_length"] > 1, meta
        assert full["meta_info"]["spec_accept_length"] > 1


def test_concurrent_requests_equal_sequential_and_metrics_count(http, engine):
    before = http.get("/metrics").text
    prompts = STORY_PROMPTS[:12]
    want = [engine.generate(p, greedy(24))["output_ids"] for p in prompts]

    def one(prompt: str) -> list[int]:
        resp = http.post("/generate", json={"text": prompt, "sampling_params": greedy(24)})
        assert resp.status_code == 200, resp.text
        return resp.json()["output_ids"]

    for _ in range(2):
        with ThreadPoolExecutor(12) as pool:
            assert list(pool.map(one, prompts)) == want
    state = wait_idle(http)
    assert state["num_spec_verify_steps"] > 0
    after = http.get("/metrics").text
    steps = _metric(after, "radixlm:spec_verify_steps_total")
    drafted = _metric(after, "radixlm:spec_draft_tokens_total")
    accepted = _metric(after, "radixlm:spec_accepted_tokens_total")
    emitted = _metric(after, "radixlm:spec_verify_output_tokens_total")
    assert steps > _metric(before, "radixlm:spec_verify_steps_total")
    assert 0 < accepted <= drafted and steps < emitted <= accepted + steps  # a stop may cut a run
    assert _metric(after, "radixlm:spec_accept_length") == pytest.approx(emitted / steps)
    assert _metric(after, "radixlm:spec_accept_rate") == pytest.approx(accepted / drafted)
    assert http.get("/flush_cache").status_code == 200
