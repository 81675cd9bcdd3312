"""/generate over a real server (stories260K), checked against the offline Engine."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from radixlm.managers.validation import InvalidRequestError
from radixlm.srt.engine import Engine
from tests.conftest import STORY_PROMPTS

from .helpers import assert_pool_free_after_flush, greedy, sse_events, wait_idle


@pytest.fixture(scope="module")
def engine(stories_path):
    return Engine(stories_path, dtype="float32", max_total_tokens=8192)


def _strip(result: dict) -> tuple:
    return result["text"], result["output_ids"], result["meta_info"]["finish_reason"]


def test_greedy_text_and_ids_match_engine(http, engine):
    prompts = STORY_PROMPTS[:6]
    for prompt in prompts:
        want = engine.generate(prompt, greedy(24))
        got = http.post("/generate", json={"text": prompt, "sampling_params": greedy(24)})
        assert got.status_code == 200, got.text
        body = got.json()
        assert _strip(body) == _strip(want)
        meta = body["meta_info"]
        assert meta["prompt_tokens"] == want["meta_info"]["prompt_tokens"]
        assert meta["completion_tokens"] == len(body["output_ids"])
        assert meta["e2e_latency"] > 0 and isinstance(meta["id"], str)
    ids = engine.tokenizer.encode(prompts[0])
    by_ids = http.post("/generate", json={"input_ids": ids, "sampling_params": greedy(24)}).json()
    assert _strip(by_ids) == _strip(engine.generate(input_ids=ids, sampling_params=greedy(24)))


def test_batch_is_list_in_list_out_in_order(http, engine):
    prompts = STORY_PROMPTS[6:10]
    want = engine.generate(prompts, greedy(12))
    got = http.post("/generate", json={"text": prompts, "sampling_params": greedy(12)}).json()
    assert isinstance(got, list) and [_strip(g) for g in got] == [_strip(w) for w in want]
    ids = [engine.tokenizer.encode(p) for p in prompts]
    got_ids = http.post("/generate", json={"input_ids": ids, "sampling_params": [greedy(12)] * 4}).json()
    assert [_strip(g) for g in got_ids] == [_strip(w) for w in want]


def test_32_concurrent_requests_equal_sequential(http, engine):
    prompts = [f"{p} {i}" if i >= len(STORY_PROMPTS) else p
               for i, p in enumerate(STORY_PROMPTS * 2)][:32]
    sequential = [_strip(engine.generate(p, greedy(16))) for p in prompts]

    def one(prompt: str) -> tuple:
        resp = http.post("/generate", json={"text": prompt, "sampling_params": greedy(16)})
        assert resp.status_code == 200, resp.text
        return _strip(resp.json())

    with ThreadPoolExecutor(32) as pool:
        concurrent = list(pool.map(one, prompts))
    assert concurrent == sequential


@pytest.mark.parametrize("prompt", [STORY_PROMPTS[0], STORY_PROMPTS[3], STORY_PROMPTS[11]])
def test_stream_deltas_concatenate_to_full_text(http, prompt):
    body = {"text": prompt, "sampling_params": greedy(40, stop=["park"])}
    full = http.post("/generate", json=body).json()
    events = sse_events(http, body)
    assert events[-1] == "[DONE]" and "[DONE]" not in events[:-1]
    data = events[:-1]
    texts = [e["text"] for e in data]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:])), "text must be cumulative"
    assert texts[-1] == full["text"] and data[-1]["output_ids"] == full["output_ids"]
    assert all(e["meta_info"]["finish_reason"] is None for e in data[:-1])
    assert data[-1]["meta_info"]["finish_reason"] == full["meta_info"]["finish_reason"]


def test_a_stream_read_slowly_still_ends_with_its_finish_event(http, server):
    # The client reads nothing until the generation is over: the server's writes block (the events are
    # cumulative, ~4 MB in all) while the last outputs arrive. The stream ended with [DONE] and no
    # finish event (finish_reason null, the text cut at ~1,100 of 1,900 tokens): a newcomer's finding.
    import json

    body = {"text": "Once upon a time", "stream": True, "sampling_params": greedy(1900, ignore_eos=True)}
    full = http.post("/generate", json={**body, "stream": False}).json()
    assert full["meta_info"]["finish_reason"]["type"] == "length"
    with httpx.Client(base_url=server.url, timeout=60) as client:
        with client.stream("POST", "/generate", json=body) as resp:
            assert resp.status_code == 200
            wait_idle(http, 60)  # the scheduler is done; the HTTP process still holds most events
            lines = [line for line in resp.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    last = json.loads(lines[-2][len("data: "):])
    assert last["meta_info"]["finish_reason"] == full["meta_info"]["finish_reason"]
    assert last["text"] == full["text"] and last["meta_info"]["completion_tokens"] == 1900


@pytest.mark.parametrize("interval", [3, 7])
def test_stream_interval_batches_tokens_and_keeps_the_text(http, interval):
    """sampling_params.stream_interval: the first token at once, then chunks of `interval` tokens
    (the last may be shorter or carry the finish); the concatenation equals the unstreamed output.
    Events are sent only at 1 + k * interval tokens and at the finish; a client that reads slower
    than the server decodes may get two of them in one (the newest state is sent, nothing is lost)."""
    body = {"text": STORY_PROMPTS[1], "sampling_params": greedy(20, stream_interval=interval, ignore_eos=True)}
    full = http.post("/generate", json=body).json()
    data = sse_events(http, body)[:-1]
    counts = [e["meta_info"]["completion_tokens"] for e in data]
    # The first event is the first emission point (1 token) unless the client fell behind and got the
    # newest state instead (7 or 8 tokens in one fresh-clone CI run): either way an emission point.
    assert counts[-1] == 20
    assert all(a < b for a, b in zip(counts, counts[1:])), counts
    assert all((c - 1) % interval == 0 for c in counts[:-1]), counts  # never between two emission points
    assert len(counts) <= 20 // interval + 2, counts  # chunked: not one event per token
    assert data[-1]["text"] == full["text"] and data[-1]["output_ids"] == full["output_ids"]
    bad = http.post("/generate", json={"text": "x", "sampling_params": {"stream_interval": 0}})
    assert bad.status_code == 400 and "stream_interval" in bad.json()["error"]["message"]


def _forced_bytes_body(tokenizer, max_new_tokens: int, bias: float) -> dict:
    """Greedy output pushed towards the byte tokens of 世 (E4 B8 96): a logit bias on the three,
    graded by 0.5 so that with frequency_penalty 2 they tend to cycle in order. Bias 28 mixes whole
    characters, broken byte runs and ordinary words; bias 41 gives bytes only."""
    vocab = tokenizer.get_vocab()
    biases = {str(vocab["<0xE4>"]): bias + 1, str(vocab["<0xB8>"]): bias + 0.5, str(vocab["<0x96>"]): bias}
    return {"text": "Lily said café", "sampling_params": greedy(
        max_new_tokens, logit_bias=biases, frequency_penalty=2.0)}


@pytest.mark.parametrize("max_new_tokens,bias", [(40, 28.0), (12, 41.0), (13, 41.0)])
def test_stream_of_byte_fallback_output_never_splits_a_character(http, engine, max_new_tokens, bias):
    body = _forced_bytes_body(engine.tokenizer, max_new_tokens, bias)
    full = http.post("/generate", json=body).json()
    assert full["text"] == engine.generate(body["text"], body["sampling_params"])["text"]
    events = sse_events(http, body)
    texts = [e["text"] for e in events[:-1]]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:])), "streamed text was retracted"
    assert texts[-1] == full["text"]
    if max_new_tokens == 40:  # whole characters streamed before the end, after broken runs
        assert any("世" in t for t in texts[:-1]) and "\ufffd" in full["text"], full["text"]
    if max_new_tokens == 12:
        assert full["text"] == "世世世世"
    if max_new_tokens == 13:  # a dangling lead byte: SentencePiece decodes the whole run as U+FFFD
        assert "世" not in full["text"] and all(t == "" for t in texts[:-1])


def test_a_bias_beyond_float32_forces_its_token_when_sampling(http):
    """1e39 is finite in JSON and Python but inf in float32: the sampled rows must pick the biased
    token (it was the NaN row's token 0, three times, with empty text)."""
    r = http.post("/generate", json={"text": "Lily", "sampling_params": {
        "max_new_tokens": 3, "temperature": 1.0, "top_p": 0.9, "logit_bias": {"42": 1e39}}})
    assert r.status_code == 200, r.text
    assert r.json()["output_ids"] == [42, 42, 42]


def test_n_samples_share_the_prompt_prefix(http, engine):
    prompt = STORY_PROMPTS[4]
    want = _strip(engine.generate(prompt, greedy(10)))
    got = http.post("/generate", json={"text": prompt, "sampling_params": greedy(10, n=3)}).json()
    assert isinstance(got, list) and len(got) == 3
    assert [_strip(g) for g in got] == [want] * 3
    assert len({g["meta_info"]["id"] for g in got}) == 3
    prompt_len = got[0]["meta_info"]["prompt_tokens"]
    # The prompt was prefilled once (max_new_tokens 0) before the copies were sent.
    assert all(g["meta_info"]["cached_tokens"] == prompt_len - 1 for g in got)
    batch = http.post("/generate", json={"text": [prompt, STORY_PROMPTS[5]],
                                         "sampling_params": greedy(4, n=2)}).json()
    assert len(batch) == 4 and batch[0]["text"] == batch[1]["text"] and batch[2]["text"] == batch[3]["text"]


def test_n_seeded_samples_differ_and_repeat(http):
    """n copies of a seeded request sample with seed, seed + 1, ... (as /v1's choices do): different
    texts, the same ones on every call, and copy j equals a single request with seed + j."""
    sp = {"max_new_tokens": 12, "temperature": 1.0, "sampling_seed": 40, "n": 3}
    texts = [[g["text"] for g in http.post("/generate", json={"text": "Lily", "sampling_params": sp}).json()]
             for _ in range(2)]
    assert texts[0] == texts[1] and len(set(texts[0])) == 3
    one = {**sp, "n": 1, "sampling_seed": 42}
    assert http.post("/generate", json={"text": "Lily", "sampling_params": one}).json()["text"] == texts[0][2]


def test_rid_is_echoed_and_expanded_for_batches(http):
    one = http.post("/generate", json={"text": "Lily", "rid": "my-req", "sampling_params": greedy(2)}).json()
    assert one["meta_info"]["id"] == "my-req"
    batch = http.post("/generate", json={"text": ["Lily", "Mom said"], "rid": "b",
                                         "sampling_params": greedy(2)}).json()
    assert [b["meta_info"]["id"] for b in batch] == ["b_0", "b_1"]
    listed = http.post("/generate", json={"text": ["Lily", "Mom said"], "rid": ["x", "y"],
                                          "sampling_params": greedy(2)}).json()
    assert [b["meta_info"]["id"] for b in listed] == ["x", "y"]


def test_max_new_tokens_zero_prefills_and_caches(http):
    prompt = STORY_PROMPTS[13]
    first = http.post("/generate", json={"text": prompt, "sampling_params": {"max_new_tokens": 0}}).json()
    meta = first["meta_info"]
    assert first["text"] == "" and first["output_ids"] == [] and meta["completion_tokens"] == 0
    assert meta["finish_reason"] == {"type": "length", "length": 0}
    again = http.post("/generate", json={"text": prompt, "sampling_params": greedy(3)}).json()
    assert again["meta_info"]["cached_tokens"] == meta["prompt_tokens"] - 1


def test_cached_tokens_after_flush(http):
    assert http.post("/flush_cache").status_code == 200
    base = list(range(10, 60))  # 50 tokens

    def cached(ids: list[int]) -> int:
        resp = http.post("/generate", json={"input_ids": ids, "sampling_params": greedy(1)})
        assert resp.status_code == 200, resp.text
        return resp.json()["meta_info"]["cached_tokens"]

    assert cached(base) == 0
    assert cached(base) == len(base) - 1  # the last token is always computed
    assert cached(base + list(range(100, 120))) == len(base)
    assert cached(list(range(10, 40)) + [7, 8, 9]) == 30
    assert cached(list(range(200, 230))) == 0
    assert http.post("/flush_cache").status_code == 200
    assert cached(base) == 0


def test_logprobs_shapes_and_values(http, engine):
    prompt = STORY_PROMPTS[2]
    body = {"text": prompt, "sampling_params": greedy(8), "return_logprob": True, "logprob_start_len": 2,
            "top_logprobs_num": 3, "return_text_in_logprobs": True}
    got = http.post("/generate", json=body).json()
    meta = got["meta_info"]
    want = engine.generate(prompt, greedy(8), return_logprob=True, logprob_start_len=2, top_logprobs_num=3)
    assert len(meta["input_token_logprobs"]) == meta["prompt_tokens"] - 2
    assert [t[1] for t in meta["output_token_logprobs"]] == got["output_ids"]
    assert all(isinstance(t[2], str) for t in meta["output_token_logprobs"])
    assert [t[0] for t in meta["output_token_logprobs"]] == pytest.approx(
        [t[0] for t in want["meta_info"]["output_token_logprobs"]], abs=1e-4)
    assert [t[0] for t in meta["input_token_logprobs"]] == pytest.approx(
        [t[0] for t in want["meta_info"]["input_token_logprobs"]], abs=1e-4)
    ids = engine.tokenizer.encode(prompt)
    assert [t[1] for t in meta["input_token_logprobs"]] == ids[2:]
    assert all(isinstance(t[2], str) for t in meta["input_token_logprobs"])
    for top, chosen in zip(meta["output_top_logprobs"], got["output_ids"]):
        assert len(top) == 3 and top[0][1] == chosen  # greedy: the top-1 is the sampled token
    from_start = http.post("/generate", json={**body, "logprob_start_len": 0}).json()["meta_info"]
    assert from_start["input_token_logprobs"][0][0] is None
    assert len(from_start["input_token_logprobs"]) == from_start["prompt_tokens"]


def test_null_sampling_fields_mean_default(http, engine):
    params = {"max_new_tokens": 6, "temperature": 0, "top_p": None, "top_k": -1, "min_p": None, "stop": None,
              "stop_token_ids": None, "frequency_penalty": None, "presence_penalty": None,
              "ignore_eos": None, "regex": None, "json_schema": None, "n": None, "stop_regex": None}
    got = http.post("/generate", json={"text": "Lily", "sampling_params": params})
    assert got.status_code == 200, got.text
    assert _strip(got.json()) == _strip(engine.generate("Lily", greedy(6)))


def test_logprob_start_len_must_be_a_prompt_position(http, engine):
    """SGLang's rule: with return_logprob, logprob_start_len < the input length (or -1); beyond it is a
    400 naming both numbers (it used to be clamped silently), nothing is queued, nothing leaks."""
    prompt = STORY_PROMPTS[1]
    n = len(engine.tokenizer.encode(prompt))
    base = {"text": prompt, "sampling_params": greedy(2), "return_logprob": True}
    for start in (n, n + 7):
        resp = http.post("/generate", json={**base, "logprob_start_len": start})
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["message"].startswith(
            f"logprob_start_len ({start}) should be less than the input length ({n} tokens)"), resp.text
    batch = http.post("/generate", json={**base, "text": [prompt, "Lily"], "logprob_start_len": [0, n]})
    assert batch.status_code == 400 and "should be less than the input length" in batch.text, batch.text
    with pytest.raises(InvalidRequestError, match=r"logprob_start_len \(\d+\) should be less than"):
        engine.generate(prompt, greedy(2), return_logprob=True, logprob_start_len=n)
    last = http.post("/generate", json={**base, "logprob_start_len": n - 1}).json()["meta_info"]
    assert [t[1] for t in last["input_token_logprobs"]] == engine.tokenizer.encode(prompt)[-1:]
    # Without return_logprob the start is unused, so not checked (as in SGLang).
    unused = http.post("/generate", json={"text": prompt, "sampling_params": greedy(2), "logprob_start_len": n + 7})
    assert unused.status_code == 200, unused.text
    assert_pool_free_after_flush(http)
