"""Bad input -> 400 with a useful message (then the server still answers), --api-key, and
--max-queued-requests -> 503. One server: --api-key, 2 running + 2 queued at most."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from .helpers import BASE_ARGS, ENDLESS_ARGS, assert_pool_free_after_flush, endless, greedy

KEY = "test-secret"


@pytest.fixture(scope="module")
def server(launch, stories_path):
    return launch(["--model-path", stories_path, *BASE_ARGS, "--api-key", KEY, "--max-running-requests", "2",
                   "--max-queued-requests", "2"], api_key=KEY)


def _ok(http: httpx.Client) -> None:
    resp = http.post("/generate", json={"text": "Lily", "sampling_params": greedy(2)})
    assert resp.status_code == 200, resp.text
    assert resp.json()["meta_info"]["completion_tokens"] == 2


LONG_IDS = list(range(5, 505)) * 5  # 2500 tokens > the 2048-token context

BAD_BODIES = [
    ("malformed JSON", b'{"text": "Lily", ', "malformed JSON"),
    ("not an object", b'["Lily"]', "should be an object"),
    ("empty body", b"", "malformed JSON"),
    ("neither text nor ids", {"sampling_params": {}}, "exactly one of text and input_ids"),
    ("both text and ids", {"text": "a", "input_ids": [1, 2]}, "exactly one of text and input_ids"),
    ("text of wrong type", {"text": 5}, "text"),
    ("ids of wrong type", {"input_ids": [1, "2"]}, "input_ids"),
    ("bool stream flag as str", {"text": "a", "stream": "yes"}, "stream"),
    ("unknown field", {"text": "a", "max_tokens": 3}, "max_tokens"),
    ("unsupported field", {"text": "a", "image_data": "x.png"}, "image_data"),
    ("sampling_params not an object", {"text": "a", "sampling_params": 3}, "sampling_params"),
    ("unknown sampling field", {"text": "a", "sampling_params": {"temprature": 0}}, "temprature"),
    ("sampling value of wrong type", {"text": "a", "sampling_params": {"temperature": "hot"}}, "temperature"),
    ("negative temperature", {"text": "a", "sampling_params": {"temperature": -1}}, "temperature must be >= 0"),
    ("top_p out of range", {"text": "a", "sampling_params": {"top_p": 1.5}}, "top_p must be in (0, 1]"),
    ("top_k zero", {"text": "a", "sampling_params": {"top_k": 0}}, "top_k"),
    ("min_p out of range", {"text": "a", "sampling_params": {"min_p": 2}}, "min_p"),
    ("penalty out of range", {"text": "a", "sampling_params": {"frequency_penalty": 3}}, "frequency_penalty"),
    ("negative max_new_tokens", {"text": "a", "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
    ("n zero", {"text": "a", "sampling_params": {"n": 0}}, "n must be >= 1"),
    ("stop id outside vocab", {"text": "a", "sampling_params": {"stop_token_ids": [512]}}, "stop_token_ids"),
    ("logit_bias key not an id", {"text": "a", "sampling_params": {"logit_bias": {"x": 1}}}, "logit_bias"),
    ("input id outside vocab", {"input_ids": [1, 512]}, "outside the vocabulary [0, 512)"),
    ("negative input id", {"input_ids": [1, -3]}, "outside the vocabulary"),
    ("empty input_ids", {"input_ids": []}, "empty"),
    ("empty batch", {"text": []}, "empty"),
    ("prompt longer than context", {"input_ids": LONG_IDS},
     "2500 tokens) is longer than the model's context length (2048"),
    ("max_new_tokens beyond context", {"text": "Lily", "sampling_params": {"max_new_tokens": 2047}},
     "max_new_tokens is 2047"),
    ("sampling_params list of wrong length", {"text": ["a", "b"], "sampling_params": [{}]}, "sampling_params"),
    ("rid list of wrong length", {"text": ["a", "b"], "rid": ["x"]}, "rid"),
    ("rid twice in one batch", {"text": ["a", "b"], "rid": ["x", "x"]}, "request id 'x' is given twice in this request"),
    ("repetition_penalty 0", {"text": "a", "sampling_params": {"repetition_penalty": 0}}, "repetition_penalty must be in (0, 2]"),
    ("different n in one batch", {"text": ["a", "b"], "sampling_params": [{"n": 1}, {"n": 2}]}, "share n"),
    ("negative top_logprobs_num", {"text": "a", "return_logprob": True, "top_logprobs_num": -1}, "top_logprobs_num"),
]


@pytest.mark.parametrize("body,needle", [(b, n) for _, b, n in BAD_BODIES], ids=[c for c, _, _ in BAD_BODIES])
def test_bad_input_is_400_with_message_then_server_still_works(http, body, needle):
    if isinstance(body, bytes):
        resp = http.post("/generate", content=body, headers={"content-type": "application/json"})
    else:
        resp = http.post("/generate", json=body)
    assert resp.status_code == 400, resp.text
    message = resp.json()["error"]["message"]
    assert needle in message, message
    _ok(http)


# A JSON escape of a lone UTF-16 surrogate is valid JSON but not Unicode (no tokenizer can encode it): a
# 400 naming the field (issue: "malformed JSON body: unexpected end of hex escape at line 1 column 20").
SURROGATES = [
    (rb'{"text": "abc\ud800", "sampling_params": {"max_new_tokens": 2}}', "text", "\\ud800 at character 3"),
    (rb'{"text": ["Lily", "x\udc00y"]}', "text.1", "\\udc00 at character 1"),
    (rb'{"text": "Lily", "sampling_params": {"stop": ["a", "\udfff"]}}', "sampling_params.stop.1",
     "\\udfff at character 0"),
    (rb'{"text": "Lily", "stream": true, "rid": "r\ud83d"}', "rid", "\\ud83d at character 1"),
]


@pytest.mark.parametrize("raw,field,where", SURROGATES, ids=[f for _, f, _ in SURROGATES])
def test_lone_surrogate_is_a_400_naming_the_field(http, raw, field, where):
    resp = http.post("/generate", content=raw, headers={"content-type": "application/json"})
    assert resp.status_code == 400, resp.text
    assert resp.json() == {"error": {"message": (
        f"invalid request: {field}: the string contains an unpaired UTF-16 surrogate ({where}), which is not valid "
        "Unicode; send the text as UTF-8, or escape a character above U+FFFF as a surrogate pair (\\ud83d\\ude00)"),
        "type": "invalid_request_error", "code": 400}}
    paired = http.post("/generate", content=rb'{"text": "Lily \ud83d\ude00", "sampling_params": {"max_new_tokens": 2}}')
    assert paired.status_code == 200 and paired.json()["meta_info"]["completion_tokens"] == 2, paired.text
    _ok(http)
    assert_pool_free_after_flush(http)


BIG = 10**23  # beyond int64: the wire to the scheduler cannot carry it
INT64 = "[-9223372036854775808, 9223372036854775807]"
# (case, sampling_params, the whole message): the field sent and its allowed range (issue: a huge seed was
# "a value of the request is out of range: can't serialize ints < -2**63 or > 2**64 - 1", no field named).
HUGE_INTS = [
    ("max_new_tokens", {"max_new_tokens": BIG}, "Requested token count exceeds the model's context length: the input "
     f"has 3 tokens and max_new_tokens is {BIG}, together more than 2048: max_new_tokens must be in [0, 2045] for "
     "this input"),
    ("sampling_seed", {"sampling_seed": BIG}, f"sampling_seed must be in {INT64} (a 64-bit integer), got {BIG}"),
    ("negative sampling_seed", {"sampling_seed": -BIG},
     f"sampling_seed must be in {INT64} (a 64-bit integer), got {-BIG}"),
    ("top_k", {"top_k": BIG}, f"top_k must be -1 (disabled) or in [1, 9223372036854775807], got {BIG}"),
    ("stream_interval", {"stream_interval": BIG}, f"stream_interval must be in [1, 9223372036854775807], got {BIG}"),
]


@pytest.mark.parametrize("params,message", [c[1:] for c in HUGE_INTS], ids=[c[0] for c in HUGE_INTS])
def test_huge_integer_is_a_400_naming_the_field_and_its_range(http, params, message):
    resp = http.post("/generate", json={"input_ids": [1, 400, 401], "sampling_params": {"max_new_tokens": 2, **params}})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["message"] == message
    _ok(http)


def test_seeds_at_the_ends_of_the_64_bit_range_sample(http):
    """The largest seed with n = 2: copy 1 samples with seed + 1 wrapped to the smallest seed (the
    sampler takes seeds modulo 2**64), so it equals a single request with that seed."""
    sp = {"max_new_tokens": 8, "temperature": 1.0, "ignore_eos": True}
    pair = http.post("/generate", json={"text": "Lily", "sampling_params": {**sp, "sampling_seed": 2**63 - 1, "n": 2}})
    assert pair.status_code == 200, pair.text
    lowest = http.post("/generate", json={"text": "Lily", "sampling_params": {**sp, "sampling_seed": -2**63}})
    assert lowest.status_code == 200, lowest.text
    assert pair.json()[1]["text"] == lowest.json()["text"] and pair.json()[0]["text"] != pair.json()[1]["text"]
    assert_pool_free_after_flush(http)


def test_bad_streaming_request_is_a_plain_400(http):
    resp = http.post("/generate", json={"text": "a", "stream": True, "sampling_params": {"top_p": 0}})
    assert resp.status_code == 400 and "top_p" in resp.json()["error"]["message"]
    _ok(http)


def test_default_max_new_tokens_is_clamped_not_refused(http):
    prompt = list(range(5, 505)) * 4  # 2000 tokens: default 128 would not fit, so it is clamped
    resp = http.post("/generate", json={"input_ids": prompt, "sampling_params": {"temperature": 0, "ignore_eos": True}})
    assert resp.status_code == 200, resp.text
    assert resp.json()["meta_info"]["completion_tokens"] == 2048 - 2000


def test_api_key_is_required_except_for_probes_and_metrics(server):
    with httpx.Client(base_url=server.url, timeout=30) as anon:
        for path in ("/health", "/health_generate", "/metrics"):  # open, as SGLang's
            assert anon.get(path).status_code == 200, path
        for method, path in [("POST", "/generate"), ("GET", "/get_model_info"), ("GET", "/server_info"),
                             ("POST", "/flush_cache")]:
            resp = anon.request(method, path, json={"text": "a"})
            assert resp.status_code == 401, (path, resp.text)
            assert "API key" in resp.json()["error"]["message"]
        wrong = anon.get("/get_model_info", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        right = anon.get("/get_model_info", headers={"Authorization": f"Bearer {KEY}"})
        assert right.status_code == 200


@pytest.fixture(scope="module")
def endless_server(launch, stories_path):
    """The module's server settings with a context whose requests outlast the test (ENDLESS_ARGS)."""
    return launch(["--model-path", stories_path, *BASE_ARGS, *ENDLESS_ARGS, "--api-key", KEY,
                   "--max-running-requests", "2", "--max-queued-requests", "2"], api_key=KEY)


def test_queue_limit_answers_503(endless_server):
    server = endless_server
    results: list = [None] * 4

    def long_request(i: int) -> None:
        with server.client() as c:
            body = {"text": f"Lily {i}", "sampling_params": endless()}
            results[i] = c.post("/generate", json=body)

    threads = [threading.Thread(target=long_request, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    http = server.client()
    deadline = time.monotonic() + 60
    while True:  # 2 running + 2 queued: the limit
        state = http.get("/get_server_info").json()["internal_states"][0]
        if state["num_running_reqs"] == 2 and state["num_waiting_reqs"] == 2:
            break
        assert time.monotonic() < deadline, state
        time.sleep(0.05)
    refused = http.post("/generate", json={"text": "Lily", "sampling_params": greedy(2)})
    assert refused.status_code == 503
    assert "queue is full" in refused.json()["error"]["message"]
    assert http.post("/abort_request", json={"abort_all": True}).status_code == 200
    for t in threads:
        t.join(30)
    assert all(r.json()["meta_info"]["finish_reason"]["type"] == "abort" for r in results)
    _ok(http)
    # More sequences than running + queued can ever hold: a 400 (no Retry-After), even when idle.
    never = http.post("/generate", json={"text": "Lily", "sampling_params": {**greedy(2), "n": 5}})
    assert never.status_code == 400 and "retry-after" not in never.headers
    assert "more than this server holds at once (4" in never.json()["error"]["message"]
    four = http.post("/generate", json={"text": "Lily", "sampling_params": {**greedy(2), "n": 4}})
    assert four.status_code == 200 and len(four.json()) == 4, four.text
    http.close()
