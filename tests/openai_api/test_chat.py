"""/v1/chat/completions with the official ``openai`` client: stories260K with the test ChatML
template for mechanics (the model has no template of its own)."""

from __future__ import annotations

import itertools
import json

import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from .conftest import MODEL, chat_prompt_ids, revalidate, sse_lines

MESSAGES = [{"role": "system", "content": "You tell short stories."}, {"role": "user", "content": "Tell me one."}]


def _chat(client, messages=MESSAGES, **kw):
    return client.chat.completions.create(model=MODEL, messages=messages, **kw)


@pytest.mark.parametrize("n,logprobs", list(itertools.product([1, 2], [False, True])))
def test_grid_stream_equals_non_stream(client, tok, n, logprobs):
    """Shapes, exact prompt_tokens, streamed == non-streamed content and logprobs, role first,
    exactly one finish chunk per choice, usage chunk only when asked."""
    kw = dict(max_tokens=4, temperature=0, n=n, logprobs=logprobs, top_logprobs=2 if logprobs else None)
    full = _chat(client, **kw)
    revalidate(full)
    assert isinstance(full, ChatCompletion) and full.object == "chat.completion" and full.model == MODEL
    assert full.id.startswith("chatcmpl-") and full.system_fingerprint and full.created > 0
    prompt_tokens = len(chat_prompt_ids(tok, MESSAGES, add_generation_prompt=True))
    assert full.usage.prompt_tokens == prompt_tokens
    assert full.usage.completion_tokens == 4 * n and full.usage.total_tokens == prompt_tokens + 4 * n
    assert full.usage.prompt_tokens_details.cached_tokens >= 0
    assert [c.index for c in full.choices] == list(range(n))
    for c in full.choices:
        assert c.finish_reason == "length" and c.message.role == "assistant" and c.message.content
        if logprobs:
            content = c.logprobs.content
            assert len(content) == 4 and "".join(t.token for t in content) == c.message.content
            for t in content:
                assert t.logprob <= 0 and t.bytes == list(t.token.encode()) and len(t.top_logprobs) == 2
                assert t.top_logprobs[0].logprob >= t.logprob - 1e-4
        else:
            assert c.logprobs is None

    include_usage = n == 1  # ask for the usage chunk in half of the grid
    chunks = list(_chat(client, stream=True, stream_options={"include_usage": include_usage}, **kw))
    first, content, finishes, tokens = {}, {}, {}, {}
    for chunk in chunks:
        assert isinstance(chunk, ChatCompletionChunk) and chunk.object == "chat.completion.chunk"
        assert chunk.id == chunks[0].id
        revalidate(chunk)
        for c in chunk.choices:
            first.setdefault(c.index, c.delta)
            content[c.index] = content.get(c.index, "") + (c.delta.content or "")
            if c.finish_reason is not None:
                finishes.setdefault(c.index, []).append(c.finish_reason)
                assert not c.delta.content
            if c.logprobs is not None:
                tokens.setdefault(c.index, []).extend(t.token for t in c.logprobs.content)
    assert all(d.role == "assistant" for d in first.values()) and sorted(first) == list(range(n))
    assert content == {c.index: c.message.content for c in full.choices}
    assert finishes == {i: ["length"] for i in range(n)}
    if logprobs:
        assert tokens == {c.index: [t.token for t in c.logprobs.content] for c in full.choices}
    usage_chunks = [ch for ch in chunks if ch.usage is not None]
    assert len(usage_chunks) == int(include_usage)
    if include_usage:
        assert chunks[-1] is usage_chunks[0] and chunks[-1].choices == []
        assert chunks[-1].usage.prompt_tokens == prompt_tokens and chunks[-1].usage.completion_tokens == 4 * n


def test_vllm_extras_add_generation_prompt_and_include_stop_str_in_output(client, tok):
    """vLLM's add_generation_prompt (false: no assistant-turn opener) and include_stop_str_in_output
    (SGLang's no_stop_trim) are applied, not 400s."""
    with_turn = _chat(client, max_tokens=2, temperature=0)
    without = _chat(client, max_tokens=2, temperature=0, extra_body={"add_generation_prompt": False})
    assert with_turn.usage.prompt_tokens == len(chat_prompt_ids(tok, MESSAGES, add_generation_prompt=True))
    assert without.usage.prompt_tokens == len(chat_prompt_ids(tok, MESSAGES, add_generation_prompt=False))
    assert without.usage.prompt_tokens < with_turn.usage.prompt_tokens
    base = _chat(client, max_tokens=12, temperature=0).choices[0].message.content
    stop = base.split()[2]
    trimmed, kept = (_chat(client, max_tokens=12, temperature=0, stop=[stop], extra_body=extra).choices[0]
                     for extra in ({}, {"include_stop_str_in_output": True}))
    assert trimmed.finish_reason == kept.finish_reason == "stop"
    assert kept.message.content == trimmed.message.content + stop and not trimmed.message.content.endswith(stop)


def test_stream_continuous_usage_stats(client):
    """vLLM / SGLang's stream_options.continuous_usage_stats: every chunk carries the usage so far
    (completion tokens never decreasing), then the final usage chunk as with include_usage alone."""
    kw = dict(messages=MESSAGES, max_tokens=5, temperature=0, n=2, stream=True)
    chunks = list(_chat(client, stream_options={"include_usage": True, "continuous_usage_stats": True}, **kw))
    assert all(ch.usage is not None for ch in chunks)
    prompt = chunks[-1].usage.prompt_tokens
    completions = [ch.usage.completion_tokens for ch in chunks]
    assert completions == sorted(completions) and completions[0] == 0 and completions[-1] == 10
    assert all(ch.usage.prompt_tokens == prompt and ch.usage.total_tokens == prompt + ch.usage.completion_tokens
               for ch in chunks)
    assert chunks[-1].choices == [] and all(ch.choices for ch in chunks[:-1])
    plain = list(_chat(client, stream_options={"include_usage": True, "continuous_usage_stats": False}, **kw))
    assert [ch.usage is not None for ch in plain] == [False] * (len(plain) - 1) + [True]


def test_stream_raw_lines(stories_server):
    lines = sse_lines(stories_server, "/v1/chat/completions",
                      {"model": MODEL, "messages": MESSAGES, "max_tokens": 3, "stream": True})
    assert lines[-1] == "[DONE]" and lines.count("[DONE]") == 1
    events = [json.loads(x) for x in lines[:-1]]
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "usage" not in events[-1]
    assert [e["choices"][0]["finish_reason"] for e in events].count("length") == 1


def test_greedy_equals_native_on_the_rendered_prompt(client, http, tok):
    ids = chat_prompt_ids(tok, MESSAGES, add_generation_prompt=True)
    greedy = {"temperature": 0, "max_new_tokens": 12}
    native = http.post("/generate", json={"input_ids": ids, "sampling_params": greedy})
    got = _chat(client, max_completion_tokens=12, temperature=0)
    assert got.choices[0].message.content == native.json()["text"]
    # max_completion_tokens wins over max_tokens
    assert _chat(client, max_completion_tokens=3, max_tokens=9, temperature=0).usage.completion_tokens == 3


def test_roles_and_content_parts(client, tok):
    parts = [{"role": "developer", "content": "You tell short stories."},
             {"role": "user", "content": [{"type": "text", "text": "Tell me"}, {"type": "text", "text": " one."}]}]
    got = _chat(client, parts, max_tokens=4, temperature=0)
    assert got.usage.prompt_tokens == len(chat_prompt_ids(tok, MESSAGES, add_generation_prompt=True))
    assert got.choices[0].message.content == _chat(client, max_tokens=4, temperature=0).choices[0].message.content
    tool_turns = [*MESSAGES, {"role": "assistant", "content": "Let me look."},
                  {"role": "tool", "content": "A cat found a hat.", "tool_call_id": "call_1"},
                  {"role": "user", "content": "Go on."}]
    got = _chat(client, tool_turns, max_tokens=4, temperature=0)
    # chatml.jinja has no tool support: the default rendering makes a tool result a user turn
    rendered = [*tool_turns[:-2], {"role": "user", "content": "<tool_response>\nA cat found a hat.\n</tool_response>"},
                tool_turns[-1]]
    assert got.usage.prompt_tokens == len(chat_prompt_ids(tok, rendered, add_generation_prompt=True))


def test_continue_final_message_prefill(client, http, tok):
    prefill = [*MESSAGES, {"role": "assistant", "content": "Once upon a time"}]
    ids = chat_prompt_ids(tok, prefill, continue_final_message=True)
    assert tok.decode(ids).endswith("assistant\nOnce upon a time")
    native = http.post("/generate", json={"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": 8}})
    got = _chat(client, prefill, max_tokens=8, temperature=0, extra_body={"continue_final_message": True})
    assert got.usage.prompt_tokens == len(ids)
    assert got.choices[0].message.content == native.json()["text"]  # only the continuation
    # by default (OpenAI, vLLM, SGLang) a final assistant message is history: the reply is a new turn
    for extra in ({}, {"continue_final_message": False}):
        got = _chat(client, prefill, max_tokens=8, temperature=0, extra_body=extra)
        assert got.usage.prompt_tokens == len(chat_prompt_ids(tok, prefill, add_generation_prompt=True))


def test_stop_seed_and_json_object(client):
    base = _chat(client, max_tokens=8, temperature=0).choices[0].message.content
    stop = base[len(base) // 2:len(base) // 2 + 2]
    stopped = _chat(client, max_tokens=8, temperature=0, stop=[stop])
    assert stopped.choices[0].finish_reason == "stop" and stopped.choices[0].message.content == base[:base.index(stop)]
    kw = dict(max_tokens=6, temperature=0.8, seed=7)
    alone = _chat(client, **kw).choices[0].message.content
    two = _chat(client, n=2, **kw)
    assert two.choices[0].message.content == alone and _chat(client, **kw).choices[0].message.content == alone
    obj = _chat(client, max_tokens=4, temperature=0, response_format={"type": "json_object"})
    assert obj.choices[0].message.content.startswith("{")  # constrained: a JSON object begins
    text = _chat(client, max_tokens=4, temperature=0, response_format={"type": "text"})
    assert text.choices[0].message.content == base[:len(text.choices[0].message.content)]


def test_multi_turn_cached_tokens_cover_previous_turns(client, tok):
    """Each turn resends everything; the radix cache holds the previous prompt and reply."""
    messages = [{"role": "system", "content": "You are a story teller."}]
    previous = None
    for question in ["Tell me a story.", "What happened next?", "And then?", "Thanks."]:
        messages.append({"role": "user", "content": question})
        got = _chat(client, messages, max_tokens=6, temperature=0)
        usage = got.usage
        assert usage.prompt_tokens == len(chat_prompt_ids(tok, messages, add_generation_prompt=True))
        if previous is not None:
            # everything but the reply's last token, whose KV was never computed
            assert usage.prompt_tokens_details.cached_tokens >= previous.prompt_tokens + previous.completion_tokens - 1
        messages.append({"role": "assistant", "content": got.choices[0].message.content})
        previous = usage
