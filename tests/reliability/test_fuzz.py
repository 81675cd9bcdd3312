"""Property-based fuzzing of the HTTP API (hypothesis, deterministic): ``/generate`` and, when the
app has them, ``/v1/completions`` and ``/v1/chat/completions``.

Bodies start from a valid request and get 0-3 mutations (wrong types, missing and extra fields,
huge / negative numbers, NaN / Infinity as JSON tokens and as strings, unicode edge cases, lists
where scalars belong), then are encoded in one of several ways (plain JSON, raw UTF-8 with lone
surrogates as bytes, deep nesting, truncation, a large padding field). Property: every answer is a
2xx, or a 4xx with ``{"error": {"message": str, "type": str, ...}}``; never a 5xx, never a hang (client timeout);
``/health`` stays 200. At the end the scheduler is idle, ``/flush_cache`` frees the whole KV pool
and the log has no traceback, internal error or leak report.

The server keeps every valid request cheap: a 48-token context, and at most 8 running + 8 queued
sequences (a body that fans out further gets a 503 at once).
"""

from __future__ import annotations

import collections
import json
from typing import Any, Callable

import httpx
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from .conftest import CHAT_TEMPLATE, app_routes, assert_clean_log, assert_pool_free_after_flush

CLIENT_TIMEOUT_S = 60.0  # a request that takes longer counts as a hang
# No shrinking: each try is an HTTP round trip (a hang costs a minute); the failing body is printed.
FUZZ = settings(derandomize=True, database=None, deadline=None, phases=[Phase.explicit, Phase.generate],
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])


@pytest.fixture(scope="module")
def server(launch, stories_path):
    return launch(["--model-path", stories_path, "--max-total-tokens", "1500", "--context-length", "48",
                   "--max-running-requests", "8", "--max-queued-requests", "8", "--chat-template", CHAT_TEMPLATE,
                   "--log-level", "info"])


@pytest.fixture(scope="module")
def http(server):
    with server.client(timeout=CLIENT_TIMEOUT_S) as client:
        yield client


@pytest.fixture(scope="module")
def routes(http) -> set[str]:
    return app_routes(http)


# ---- values ------------------------------------------------------------------------------------------
ODD_TEXT = st.sampled_from([
    "", "\x00", "a\x00b", "\u202eevil\u202c RTL", "\u05e9\u05dc\u05d5\u05dd", "\U0001F468\u200d\U0001F469\u200d\U0001F467",
    "\U0001F3F3\ufe0f\u200d\U0001F308", "\ufeffbom", "\U0010ffff", "e\u0301\u0301\u0301", "\ud800", "a\udfffb",
    "Once upon a time", " " * 40, "\\", '"', "</s>", "<s>", "<|im_start|>user", "NaN", "Infinity", "-Infinity",
    "1e999", "null", "true", "0x10",
]) | st.text(max_size=24)
HUGE_INTS = st.sampled_from([0, 1, -1, 2 ** 31, 2 ** 63 - 1, 2 ** 63, 2 ** 64 - 1, 2 ** 64 + 5, -2 ** 63 - 1,
                             10 ** 30, -10 ** 30])
INTS = st.integers(-3, 9) | HUGE_INTS | st.integers()
FLOATS = (st.floats(allow_nan=True, allow_infinity=True)
          | st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e308, -1e308, 5e-324, 0.5, 2.5]))
SCALARS = st.none() | st.booleans() | INTS | FLOATS | ODD_TEXT
ANY_JSON = st.recursive(SCALARS, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(ODD_TEXT, kids, max_size=4),
                        max_leaves=10)
# Values that often pass the type checks, so the deeper checks get exercised too.
PLAUSIBLE = (st.integers(0, 8) | st.floats(0, 1) | st.sampled_from(["a", "x+", "[a-z]{1,3}", '{"type": "string"}'])
             | st.lists(st.integers(0, 600), max_size=3))
VALUES = ANY_JSON | PLAUSIBLE | st.lists(SCALARS, min_size=1, max_size=3)  # lists where scalars belong

SAMPLING_FIELDS = ["max_new_tokens", "min_new_tokens", "stop", "stop_token_ids", "temperature", "top_p", "top_k",
                   "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "logit_bias",
                   "sampling_seed", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
                   "no_stop_trim", "json_schema", "regex", "ebnf", "n", "stream_interval", "temprature"]
GENERATE_FIELDS = ["text", "input_ids", "sampling_params", "rid", "return_logprob", "logprob_start_len",
                   "top_logprobs_num", "return_text_in_logprobs", "stream", "image_data", "lora_path", "max_tokens"]
OPENAI_COMMON = ["model", "frequency_penalty", "presence_penalty", "repetition_penalty", "logit_bias", "max_tokens", "n", "seed", "stop",
                 "stream", "stream_options", "temperature", "top_p", "user", "top_k", "min_p", "min_tokens",
                 "ignore_eos", "stop_token_ids", "skip_special_tokens", "no_stop_trim", "regex", "ebnf", "rid",
                 "unknown_field"]
COMPLETION_FIELDS = OPENAI_COMMON + ["prompt", "echo", "logprobs", "best_of", "suffix", "json_schema"]
CHAT_FIELDS = OPENAI_COMMON + ["messages", "max_completion_tokens", "logprobs", "top_logprobs", "response_format",
                               "tools", "tool_choice", "continue_final_message"]
MESSAGE_FIELDS = ["role", "content", "name", "tool_calls", "tool_call_id", "refusal"]


@st.composite
def mutated(draw: Callable, base: dict, fields: list[str], nested: dict[str, list[str]]) -> dict:
    """``base`` (a valid body) with 0-3 mutations: set a field (top level or inside one of the
    ``nested`` objects) to any value, delete a field, or wrap a field's value in a list."""
    body = json.loads(json.dumps(base))
    for _ in range(draw(st.integers(0, 3))):
        op = draw(st.sampled_from(["set", "set", "set_nested", "delete", "wrap"]))
        if op == "set_nested" and nested:
            key = draw(st.sampled_from(sorted(nested)))
            target = body.get(key)
            if isinstance(target, list) and target and isinstance(target[0], dict):
                target = target[0]
            if isinstance(target, dict):
                target[draw(st.sampled_from(nested[key]))] = draw(VALUES)
        elif op == "delete" and body:
            body.pop(draw(st.sampled_from(sorted(body))))
        elif op == "wrap" and body:
            key = draw(st.sampled_from(sorted(body)))
            body[key] = [body[key]]
        else:
            body[draw(st.sampled_from(fields))] = draw(VALUES)
    return body


@st.composite
def encoded(draw: Callable, bodies: st.SearchStrategy) -> bytes:
    """A body, encoded: JSON (NaN/Infinity tokens, \\u escapes), raw UTF-8 (lone surrogates as
    bytes), deep nesting, truncated, or padded to a large size."""
    body = draw(bodies)
    mode = draw(st.sampled_from(["json", "json", "raw", "nested", "truncated", "large"]))
    if mode == "raw":
        return json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")
    text = json.dumps(body)  # allow_nan: NaN / Infinity / -Infinity tokens
    if mode == "nested":
        depth = draw(st.sampled_from([30, 300, 5000]))
        key = draw(st.sampled_from(sorted(body) or ["x"]))
        inner = json.dumps(body.get(key))
        opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
        body_text = json.dumps({k: v for k, v in body.items() if k != key})
        return (body_text[:-1] + ("," if len(body_text) > 2 else "") + f'"{key}":' + opener * depth + inner
                + closer * depth + "}").encode()
    if mode == "truncated":
        return text.encode()[:draw(st.integers(0, max(len(text) - 1, 0)))]
    if mode == "large":
        size = draw(st.sampled_from([100_000, 2_000_000]))
        where = draw(st.sampled_from(["pad_field", "string", "list"]))
        if where == "pad_field":
            body = {**body, "padding": "x" * size}
        elif where == "string":
            body = {**body, draw(st.sampled_from(sorted(body) or ["text"])): "a " * (size // 40)}
        else:
            body = {**body, draw(st.sampled_from(sorted(body) or ["input_ids"])): [1] * (size // 20)}
        return json.dumps(body).encode()
    return text.encode()


def generate_bodies() -> st.SearchStrategy:
    prompt = st.sampled_from([{"text": "Once upon a time"}, {"text": ["Lily", "The cat"]}, {"input_ids": [1, 403, 407]},
                              {"input_ids": [[1, 403], [1, 376]]}])
    sampling = st.fixed_dictionaries({"max_new_tokens": st.integers(0, 4), "temperature": st.sampled_from([0, 0.7])})
    base = st.builds(lambda p, s, stream: {**p, "sampling_params": s, "stream": stream}, prompt, sampling, st.booleans())
    return base.flatmap(lambda b: mutated(b, GENERATE_FIELDS, {"sampling_params": SAMPLING_FIELDS}))


def completion_bodies() -> st.SearchStrategy:
    base = st.builds(lambda p, m, stream: {"prompt": p, "max_tokens": m, "temperature": 0, "stream": stream},
                     st.sampled_from(["Once upon a time", ["Lily", "Tom"], [1, 403, 407]]), st.integers(1, 4),
                     st.booleans())
    return base.flatmap(lambda b: mutated(b, COMPLETION_FIELDS, {"stream_options": ["include_usage", "x"]}))


def chat_bodies() -> st.SearchStrategy:
    base = st.builds(lambda c, m, stream: {"messages": [{"role": "user", "content": c}], "max_tokens": m,
                                           "temperature": 0, "stream": stream},
                     st.sampled_from(["Tell me a story", "Hi"]), st.integers(1, 4), st.booleans())
    return base.flatmap(lambda b: mutated(b, CHAT_FIELDS, {"messages": MESSAGE_FIELDS,
                                                           "response_format": ["type", "json_schema"]}))


# ---- the property ----------------------------------------------------------------------------------
STATUSES: collections.Counter = collections.Counter()  # (path, status) -> count, printed at the end (-s)


def check_answer(resp: httpx.Response) -> None:
    status = resp.status_code
    STATUSES[(resp.request.url.path, status)] += 1
    assert 200 <= status < 300 or 400 <= status < 500, f"{status}: {resp.text[:500]}"
    if status >= 400:
        error = resp.json()["error"]
        assert isinstance(error["message"], str) and error["message"], resp.text
        assert isinstance(error["type"], str) and error["type"], resp.text
        if not resp.request.url.path.startswith("/v1/"):  # native: code is the HTTP status
            assert error["code"] == status, resp.text
    elif resp.headers.get("content-type", "").startswith("text/event-stream"):
        for line in resp.text.splitlines():
            if line:
                assert line.startswith("data: "), line
                if line != "data: [DONE]":
                    json.loads(line[len("data: "):])
    else:
        resp.json()


def post_and_check(http: httpx.Client, path: str, body: bytes) -> None:
    try:
        resp = http.post(path, content=body, headers={"content-type": "application/json"})
    except httpx.TimeoutException:
        pytest.fail(f"{path}: no answer within {CLIENT_TIMEOUT_S} s (a hang) for {body[:300]!r}")
    check_answer(resp)
    assert http.get("/health").status_code == 200


def _skip_unless(routes: set[str], path: str) -> None:
    if path not in routes:
        pytest.skip(f"the app has no {path} route")


# Regressions found by this suite (each was a 500 or a hang before its fix):
SEED_BEYOND_64_BITS = json.dumps({"text": "a", "sampling_params": {"max_new_tokens": 1, "sampling_seed": 2 ** 64 + 5}})
N_HUGE = json.dumps({"text": "a", "sampling_params": {"max_new_tokens": 1, "n": 2 ** 20}})
DUPLICATE_RIDS = json.dumps({"text": ["a", "b"], "rid": ["x", "x"], "sampling_params": {"max_new_tokens": 1}})
HUGE_LOGPROB_FIELDS = json.dumps({"text": "a", "return_logprob": True, "logprob_start_len": 2 ** 70,
                                  "top_logprobs_num": 2 ** 70, "sampling_params": {"max_new_tokens": 1}})
MIN_NEW_HUGE = json.dumps({"text": "a", "sampling_params": {"min_new_tokens": 2 ** 70, "top_k": 2 ** 70}})


@settings(FUZZ, max_examples=150)
@given(body=encoded(generate_bodies()))
@example(body=SEED_BEYOND_64_BITS.encode())
@example(body=N_HUGE.encode())
@example(body=DUPLICATE_RIDS.encode())
@example(body=HUGE_LOGPROB_FIELDS.encode())
@example(body=MIN_NEW_HUGE.encode())
@example(body=b'{"text": "a", "sampling_params": {"temperature": NaN, "top_p": Infinity}}')
@example(body=b'{"text": "a\xed\xa0\x80b\xff"}')
@example(body=b'{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
def test_generate_never_5xx_never_hangs(http, body):
    post_and_check(http, "/generate", body)


@settings(FUZZ, max_examples=80)
@given(body=encoded(completion_bodies()))
@example(body=b'{"prompt": "a", "max_tokens": 1, "seed": 18446744073709551617}')
@example(body=b'{"prompt": "a", "max_tokens": 1, "n": 2, "seed": 18446744073709551615}')
@example(body=b'{"prompt": "a", "max_tokens": 1, "temperature": NaN}')
def test_completions_never_5xx_never_hangs(http, routes, body):
    _skip_unless(routes, "/v1/completions")
    post_and_check(http, "/v1/completions", body)


@settings(FUZZ, max_examples=80)
@given(body=encoded(chat_bodies()))
@example(body=b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "seed": -9223372036854775809}')
@example(body=b'{"messages": [{"role": "user", "content": "hi\\ud800"}], "max_tokens": 1}')
def test_chat_completions_never_5xx_never_hangs(http, routes, body):
    _skip_unless(routes, "/v1/chat/completions")
    post_and_check(http, "/v1/chat/completions", body)


def test_after_fuzzing_the_server_is_healthy_and_nothing_leaked(http, server):
    """Runs last in this module: whatever the bodies above did, nothing is left behind."""
    print("fuzz answers (path, status) -> count:", dict(sorted(STATUSES.items())))
    assert http.get("/health").status_code == 200
    good = http.post("/generate", json={"text": "Lily", "sampling_params": {"temperature": 0, "max_new_tokens": 2}})
    assert good.status_code == 200, good.text
    assert_pool_free_after_flush(http)
    assert_clean_log(server)
