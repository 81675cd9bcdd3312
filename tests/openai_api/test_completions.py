"""/v1/completions with the official ``openai`` client against a live stories260K server."""

from __future__ import annotations

import itertools
import json

import pytest
from openai.types import Completion

from tests.conftest import STORY_PROMPTS
from tests.server.helpers import assert_pool_free_after_flush

from .conftest import MODEL, revalidate, sse_lines

PROMPT = "Once upon a time"


def _create(client, **kw):
    return client.completions.create(model=MODEL, **kw)


def _check_logprobs(choice, top: int, echo_tokens: int) -> None:
    lp = choice.logprobs
    assert lp is not None
    n = len(lp.tokens)
    assert len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n
    assert "".join(lp.tokens) == choice.text  # token strings concatenate to the text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(n)]
    if echo_tokens:
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    for lpv, alts in zip(lp.token_logprobs[1 if echo_tokens else 0:], lp.top_logprobs[1 if echo_tokens else 0:]):
        assert lpv <= 0 and len(alts) <= top and all(v <= 0 for v in alts.values())
        if top:
            assert max(alts.values()) >= lpv - 1e-4  # the best alternative is at least as likely


@pytest.mark.parametrize("n,echo,logprobs", list(itertools.product([1, 2], [False, True], [None, 2])))
def test_grid_stream_equals_non_stream(client, tok, n, echo, logprobs):
    """Shapes parse with the SDK's models, prompt_tokens is exact, streamed == non-streamed (text and
    logprobs), one finish chunk per choice, usage chunk only when asked."""
    kw = dict(prompt=PROMPT, max_tokens=4, temperature=0, n=n, echo=echo, logprobs=logprobs)
    full = _create(client, **kw)
    revalidate(full)
    assert full.object == "text_completion" and full.model == MODEL and full.id.startswith("cmpl-")
    assert full.system_fingerprint and full.created > 0
    prompt_tokens = len(tok.encode(PROMPT))
    assert full.usage.prompt_tokens == prompt_tokens
    assert full.usage.completion_tokens == 4 * n
    assert full.usage.total_tokens == prompt_tokens + 4 * n
    assert full.usage.prompt_tokens_details.cached_tokens >= 0
    assert [c.index for c in full.choices] == list(range(n))
    for c in full.choices:
        assert c.finish_reason == "length"
        assert c.text.startswith(PROMPT) == echo
        if logprobs is not None:
            _check_logprobs(c, logprobs, prompt_tokens if echo else 0)
            assert len(c.logprobs.tokens) == 4 + (prompt_tokens if echo else 0)
        else:
            assert c.logprobs is None

    include_usage = n == 2  # ask for the usage chunk in half of the grid
    chunks = list(_create(client, stream=True, stream_options={"include_usage": include_usage}, **kw))
    texts, finishes, lps = {}, {}, {}
    for chunk in chunks:
        assert isinstance(chunk, Completion) and chunk.id == chunks[0].id
        revalidate(chunk)
        if not chunk.choices:
            continue
        (c,) = chunk.choices
        texts[c.index] = texts.get(c.index, "") + c.text
        if c.finish_reason is not None:
            finishes.setdefault(c.index, []).append(c.finish_reason)
        if c.logprobs is not None:
            acc = lps.setdefault(c.index, {"tokens": [], "token_logprobs": [], "text_offset": []})
            for key in acc:
                acc[key] += getattr(c.logprobs, key)
    assert texts == {c.index: c.text for c in full.choices}
    assert finishes == {i: ["length"] for i in range(n)}
    if logprobs is not None:
        for c in full.choices:
            got = lps[c.index]
            assert (got["tokens"], got["text_offset"]) == (c.logprobs.tokens, c.logprobs.text_offset)
            # batch composition differs between the two runs: equal up to float noise
            assert got["token_logprobs"] == pytest.approx(c.logprobs.token_logprobs, abs=1e-4)
    usage_chunks = [ch for ch in chunks if ch.usage is not None]
    if include_usage and not logprobs and not echo:  # vLLM / SGLang's continuous_usage_stats: usage so far on every chunk
        cont = list(_create(client, stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True},
                            **kw))
        assert all(ch.usage is not None for ch in cont)
        done = [ch.usage.completion_tokens for ch in cont]
        assert done == sorted(done) and done[-1] == full.usage.completion_tokens and done[0] >= 1
        assert {ch.usage.prompt_tokens for ch in cont} == {full.usage.prompt_tokens}
    if include_usage:
        assert len(usage_chunks) == 1 and chunks[-1] is usage_chunks[0] and not chunks[-1].choices
        usage = usage_chunks[0].usage
        assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (
            full.usage.prompt_tokens, full.usage.completion_tokens, full.usage.total_tokens)
        assert usage.prompt_tokens_details.cached_tokens >= 0
    else:
        assert not usage_chunks


def test_stream_ends_with_done(stories_server):
    lines = sse_lines(stories_server, "/v1/completions",
                      {"model": MODEL, "prompt": PROMPT, "max_tokens": 3, "stream": True})
    assert lines[-1] == "[DONE]" and lines.count("[DONE]") == 1
    assert all(json.loads(x)["object"] == "text_completion" for x in lines[:-1])


def test_prompt_forms_give_the_same_text(client, tok):
    ids = tok.encode(PROMPT)
    kw = dict(max_tokens=5, temperature=0)
    by_str = _create(client, prompt=PROMPT, **kw).choices[0].text
    assert _create(client, prompt=ids, **kw).choices[0].text == by_str
    batch = _create(client, prompt=[PROMPT, "Lily"], **kw)
    assert [c.index for c in batch.choices] == [0, 1] and batch.choices[0].text == by_str
    assert batch.usage.prompt_tokens == len(ids) + len(tok.encode("Lily"))
    by_ids = _create(client, prompt=[ids, tok.encode("Lily")], **kw)
    assert [c.text for c in by_ids.choices] == [c.text for c in batch.choices]
    # choices of a list prompt with n: prompt-major order
    grid = _create(client, prompt=[PROMPT, "Lily"], n=2, **kw)
    assert [c.text for c in grid.choices] == [by_str, by_str, batch.choices[1].text, batch.choices[1].text]


def test_greedy_equals_native_generate_and_default_max_tokens_is_16(client, http):
    prompts = [PROMPT, "The cat sat on the mat and", "Sara had a red ball. She liked to"]
    native = http.post("/generate", json={"text": prompts, "sampling_params": {
        "temperature": 0, "max_new_tokens": 16, "ignore_eos": True}})
    assert native.status_code == 200, native.text
    got = _create(client, prompt=prompts, temperature=0, extra_body={"ignore_eos": True})  # no max_tokens
    assert [c.text for c in got.choices] == [r["text"] for r in native.json()]
    assert got.usage.completion_tokens == 3 * 16 and {c.finish_reason for c in got.choices} == {"length"}


def test_seed_reproducible_alone_and_in_batches(client):
    kw = dict(max_tokens=8, temperature=0.8, seed=1234)
    alone = _create(client, prompt="Lily", **kw).choices[0].text
    assert _create(client, prompt="Lily", **kw).choices[0].text == alone
    batch = _create(client, prompt=["Lily"] * 8, **kw)
    assert [c.text for c in batch.choices] == [alone] * 8
    n8 = _create(client, prompt="Lily", n=8, **kw)
    assert n8.choices[0].text == alone  # choice j samples with seed + j
    assert len({c.text for c in n8.choices}) > 1
    assert _create(client, prompt="Lily", **{**kw, "seed": 99}).choices[0].text != alone


def test_stop_and_extras(client, http):
    base = _create(client, prompt=PROMPT, max_tokens=10, temperature=0).choices[0].text  # ", there was a little g"
    stopped = _create(client, prompt=PROMPT, max_tokens=10, temperature=0, stop=[" was"])
    c = stopped.choices[0]
    assert c.finish_reason == "stop" and c.text == base[:base.index(" was")]
    assert c.model_extra["matched_stop"] == " was"
    native = http.post("/generate", json={"text": PROMPT, "sampling_params": {"temperature": 0, "max_new_tokens": 1}})
    first_id = native.json()["output_ids"][0]
    by_id = _create(client, prompt=PROMPT, max_tokens=10, temperature=0, extra_body={"stop_token_ids": [first_id]})
    assert by_id.choices[0].finish_reason == "stop" and by_id.usage.completion_tokens == 1
    top1 = _create(client, prompt=PROMPT, max_tokens=10, temperature=1.0, seed=5,
                   extra_body={"top_k": 1, "min_p": 0.1, "min_tokens": 2})
    assert top1.choices[0].text == base  # top_k 1 is greedy
    banned = _create(client, prompt=PROMPT, max_tokens=1, temperature=0, logit_bias={str(first_id): -100},
                     presence_penalty=0.5, frequency_penalty=0.5, user="test-user")
    assert banned.usage.completion_tokens == 1 and not base.startswith(banned.choices[0].text)
    # SGLang / vLLM's repetition_penalty extra reaches the native params (story prompt 3's first
    # greedy token is one of its own, which 1.3 demotes: tests/engine/test_repetition_penalty.py)
    texts = [_create(client, prompt=STORY_PROMPTS[3], max_tokens=4, temperature=0, extra_body=extra).choices[0].text
             for extra in ({}, {"repetition_penalty": 1.3})]
    native = http.post("/generate", json={"text": STORY_PROMPTS[3], "sampling_params": {
        "temperature": 0, "max_new_tokens": 4, "repetition_penalty": 1.3}}).json()["text"]
    assert texts[1] == native and texts[1] != texts[0]


def test_constrained_extras(client):
    got = _create(client, prompt="Lily", max_tokens=10, temperature=0, extra_body={"regex": "[a-z ]+\\."})
    text = got.choices[0].text
    assert text and all(ch.islower() or ch in " ." for ch in text)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    got = _create(client, prompt="Lily", max_tokens=12, temperature=0, extra_body={"json_schema": schema})
    if got.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(got.choices[0].text)["a"], int)
    else:
        assert got.choices[0].text.startswith('{"a":')


def test_models(client):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL] and models[0].model_extra["max_model_len"] == 2048
    assert client.models.retrieve(MODEL).id == MODEL


def test_stop_at_the_start_of_the_output(client, http):
    """A stop string matching the first output characters (the first token's leading space, the
    whole first token) ends the output at once, natively and on /v1/completions."""
    prompt = "The cat sat on the mat and"
    native = http.post("/generate", json={"text": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": 6}}).json()
    first = native["text"].split(" ")[1]  # the output reads " <word> ...": stop on " " and " <word>"
    for stop in (" ", " " + first):
        got = http.post("/generate", json={"text": prompt, "sampling_params": {
            "temperature": 0, "max_new_tokens": 6, "stop": [stop]}}).json()
        assert got["text"] == "" and got["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
        c = _create(client, prompt=prompt, max_tokens=6, temperature=0, stop=[stop]).choices[0]
        assert c.text == "" and c.finish_reason == "stop" and c.model_extra["matched_stop"] == stop


def test_max_tokens_zero_with_echo_scores_the_prompt(client, http, tok):
    """vLLM's (and OpenAI's legacy) way to score a prompt: max_tokens 0 with echo returns the prompt as
    the text, finish_reason length, no completion tokens, and with logprobs the prompt tokens' logprobs
    (the first null): the values /generate gives for the same prompt. Streamed the same. Without echo,
    max_tokens 0 stays a 400."""
    prompt_tokens = len(tok.encode(PROMPT))
    full = _create(client, prompt=PROMPT, max_tokens=0, echo=True, logprobs=2)
    revalidate(full)
    (c,) = full.choices
    assert c.text == PROMPT and c.finish_reason == "length"
    assert (full.usage.prompt_tokens, full.usage.completion_tokens, full.usage.total_tokens) == (
        prompt_tokens, 0, prompt_tokens)
    _check_logprobs(c, 2, prompt_tokens)
    assert len(c.logprobs.tokens) == prompt_tokens and c.logprobs.token_logprobs[0] is None
    native = http.post("/generate", json={"text": PROMPT, "sampling_params": {"max_new_tokens": 0},
                                          "return_logprob": True, "logprob_start_len": 0}).json()["meta_info"]
    expected = [lp for lp, _, _ in native["input_token_logprobs"]]
    assert expected[0] is None and len(expected) == prompt_tokens
    assert c.logprobs.token_logprobs[1:] == pytest.approx(expected[1:], abs=1e-4)
    generated = _create(client, prompt=PROMPT, max_tokens=2, echo=True, logprobs=2, temperature=0).choices[0]
    assert c.logprobs.tokens == generated.logprobs.tokens[:prompt_tokens]

    stream = _create(client, prompt=PROMPT, max_tokens=0, echo=True, logprobs=2, stream=True)
    chunks = [ch for ch in stream if ch.choices]
    assert "".join(ch.choices[0].text for ch in chunks) == PROMPT
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices[0].finish_reason] == ["length"]
    streamed = [lp for ch in chunks if ch.choices[0].logprobs for lp in ch.choices[0].logprobs.token_logprobs]
    assert streamed[0] is None and streamed[1:] == pytest.approx(c.logprobs.token_logprobs[1:], abs=1e-4)

    plain = _create(client, prompt=[PROMPT, "Lily"], max_tokens=0, echo=True, n=2)
    assert [x.text for x in plain.choices] == [PROMPT, PROMPT, "Lily", "Lily"]
    assert {x.logprobs is None and x.finish_reason == "length" for x in plain.choices} == {True}
    assert plain.usage.completion_tokens == 0
    refused = http.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT, "max_tokens": 0})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "max_tokens"
    assert "0 only with echo: true" in refused.json()["error"]["message"]
    assert_pool_free_after_flush(http)


@pytest.mark.parametrize("stop", [".", "e", " the", "ly"])
def test_logprob_tokens_join_to_text_cut_by_a_stop_string(client, stop):
    """The text leaves the matched stop string out, a stop string may end inside a token ("e" in
    " the"), and a stream holds back a possible start of one: the logprob token strings still join to
    the text (the stop string's tokens keep their logprobs with their strings cut to ""), streamed or
    not, and a stream never sends a token before its text (a newcomer found the tokens running one
    past the text, text_offset past its end)."""
    for prompt in STORY_PROMPTS[:3]:
        kw = dict(prompt=prompt, max_tokens=40, temperature=0, logprobs=1, stop=[stop])
        full = _create(client, **kw).choices[0]
        _check_logprobs(full, 1, 0)
        got = {"text": "", "tokens": []}
        for chunk in _create(client, stream=True, **kw):
            for c in chunk.choices:
                got["text"] += c.text
                got["tokens"] += c.logprobs.tokens if c.logprobs else []
                assert got["text"].startswith("".join(got["tokens"])), (got, stop)  # never ahead of the text
        assert got["text"] == full.text and got["tokens"] == full.logprobs.tokens
        if full.finish_reason == "stop":
            plain = _create(client, prompt=prompt, max_tokens=40, temperature=0, logprobs=1).choices[0]
            n = len(full.logprobs.tokens)  # the tokens up to the stop string's are the unstopped run's
            assert full.logprobs.token_logprobs == pytest.approx(plain.logprobs.token_logprobs[:n], abs=1e-6)
            assert "".join(plain.logprobs.tokens[:n]).startswith(full.text + stop)  # its tokens: the stop string's
        messages = [{"role": "user", "content": prompt}]
        chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=40, temperature=0,
                                              logprobs=True, stop=[stop]).choices[0]
        assert "".join(t.token for t in chat.logprobs.content) == chat.message.content
        assert all(bytes(t.bytes) == t.token.encode() for t in chat.logprobs.content)
