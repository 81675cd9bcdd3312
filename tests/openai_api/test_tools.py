"""Function calling and reasoning through the official ``openai`` client, against stories260K with a
Hermes-style template (``tools_server``). The tiny story model never decides to call a tool, so the
calls here come from the grammar (``required``/named); ``auto`` must answer with plain text. Every
call must parse, and its arguments validate against its tool's schema."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from .conftest import HERMES_TEMPLATE, sse_lines

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 8}},
                                       "required": ["zone"]}}}
TOOLS = [WEATHER, TIME]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
MAX = 200  # room for two whole calls of stories260K's byte-sized tokens


@pytest.fixture(scope="module")
def tc(tools_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=tools_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _create(tc, **kwargs):
    return tc.chat.completions.create(model="m", messages=kwargs.pop("messages", ASK), temperature=0,
                                      max_tokens=kwargs.pop("max_tokens", MAX), **kwargs)


def _valid_calls(message, names=None) -> list[tuple[str, dict]]:
    calls = []
    for call in message.tool_calls or []:
        assert call.type == "function" and call.id.startswith("call_"), call
        assert call.function.name in (names or SCHEMAS), call
        arguments = json.loads(call.function.arguments)
        jsonschema.validate(arguments, SCHEMAS[call.function.name])
        calls.append((call.function.name, arguments))
    assert len({c.id for c in message.tool_calls or []}) == len(calls)  # ids are unique
    return calls


@pytest.mark.parametrize("parallel", [False, True])
def test_required_gives_valid_calls(tc, parallel):
    got = _create(tc, tools=TOOLS, tool_choice="required", parallel_tool_calls=parallel)
    choice = got.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None
    calls = _valid_calls(choice.message)
    assert len(calls) == 1 if not parallel else len(calls) >= 1, calls


def test_arguments_text_uses_comma_space_and_colon_space(tc):
    """``arguments`` is the JSON the model wrote under the grammar: one line, ``", "`` between members
    and ``": "`` after keys (xgrammar's default JSON whitespace), i.e. ``json.dumps``'s own layout
    (docs/api.md)."""
    got = _create(tc, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False)
    [call] = got.choices[0].message.tool_calls
    text = call.function.arguments
    assert text == json.dumps(json.loads(text), ensure_ascii=False), text
    assert '", "unit": "' in text and "\n" not in text, text


def test_parallel_calls_are_several_for_this_prompt(tc):
    """Greedy stories260K under the grammar writes two calls when allowed (one when not, above)."""
    got = _create(tc, tools=TOOLS, tool_choice="required")
    assert [name for name, _ in _valid_calls(got.choices[0].message)] == ["get_weather", "get_time"]


def test_named_function_is_the_only_call(tc):
    got = _create(tc, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}})
    choice = got.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert [name for name, _ in _valid_calls(choice.message, ["get_time"])] == ["get_time"]


def test_auto_answers_with_text_when_the_model_calls_nothing(tc):
    got = _create(tc, tools=TOOLS, max_tokens=24)
    choice = got.choices[0]
    assert choice.finish_reason in ("stop", "length") and choice.message.tool_calls is None
    assert choice.message.content and "<tool_call>" not in choice.message.content
    plain = _create(tc, tools=TOOLS, tool_choice="none", max_tokens=24)
    assert plain.choices[0].message.tool_calls is None and plain.choices[0].message.content
    assert plain.usage.prompt_tokens < got.usage.prompt_tokens  # none: the tools are not in the prompt


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_streamed_calls_equal_non_streamed(tc, tool_choice):
    once = _create(tc, tools=TOOLS, tool_choice=tool_choice).choices[0]
    with tc.chat.completions.stream(model="m", messages=ASK, tools=TOOLS, tool_choice=tool_choice, temperature=0,
                                    max_tokens=MAX) as stream:
        done = [e for e in stream if e.type == "tool_calls.function.arguments.done"]
        final = stream.get_final_completion().choices[0]
    key = [(c.function.name, c.function.arguments) for c in once.message.tool_calls]
    assert [(c.function.name, c.function.arguments) for c in final.message.tool_calls] == key
    assert [(e.name, e.arguments) for e in done] == key  # the helper's per-call events
    assert final.finish_reason == once.finish_reason == "tool_calls"


def _forced_auto(tc, regex: str, stream: bool):
    """auto with a regex: the constraint wins, calls are only parsed (stories260K writes the regex)."""
    if not stream:
        return _create(tc, tools=TOOLS, tool_choice="auto", extra_body={"regex": regex}).choices[0].message
    with tc.chat.completions.stream(model="m", messages=ASK, tools=TOOLS, temperature=0, max_tokens=MAX,
                                    extra_body={"regex": regex}) as s:
        return s.get_final_completion().choices[0].message


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("text,calls", [
    ('<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>', [("get_time", {"zone": "UTC"})]),
    # Not allowed: a function that is not among the tools, arguments that are not JSON, not an object.
    ('<tool_call>\n{"name": "nope", "arguments": {"zone": "UTC"}}\n</tool_call>', []),
    ('<tool_call>\n{"name": "get_time", "arguments": {"zone": UTC}}\n</tool_call>', []),
    ('<tool_call>\n{"name": "get_time", "arguments": [1]}\n</tool_call>', []),
    ('<tool_call>\n{"name": "get_time", "arguments": {"zone": "UT', []),  # cut: the regex ends there
])
def test_only_parsed_calls_are_the_allowed_ones(tc, stream, text, calls):
    import re
    message = _forced_auto(tc, re.escape(text), stream)
    got = [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]
    assert got == calls
    if not calls:  # the text stays: the answer is not lost
        assert message.content == text


@pytest.mark.parametrize("max_tokens", [1, 4, 11, 14, 20])
def test_a_forced_call_cut_before_its_name_leaves_no_content(tools_server, tc, max_tokens):
    """stories260K's byte-sized tokens: 1-11 tokens end inside "<tool_call>", 14-20 inside its name.
    The reply has content null, no call, finish_reason length, streamed or not (a newcomer saw "<",
    "<tool", "<tool_call" as content, and "" for the cut name)."""
    got = _create(tc, tools=TOOLS, tool_choice="required", max_tokens=max_tokens).choices[0]
    assert got.finish_reason == "length" and got.message.content is None and not got.message.tool_calls, got
    body = {"messages": ASK, "tools": TOOLS, "tool_choice": "required", "temperature": 0,
            "max_tokens": max_tokens, "stream": True}
    lines = sse_lines(tools_server, "/v1/chat/completions", body)
    pieces = [json.loads(x)["choices"][0] for x in lines[:-1]]
    assert "".join(p["delta"].get("content") or "" for p in pieces) == ""
    assert not any(p["delta"].get("tool_calls") for p in pieces)
    assert [p["finish_reason"] for p in pieces if p["finish_reason"]] == ["length"]


def test_stream_delta_shape(tools_server):
    body = {"messages": ASK, "tools": TOOLS, "tool_choice": "required", "temperature": 0, "max_tokens": MAX,
            "stream": True}
    lines = sse_lines(tools_server, "/v1/chat/completions", body)
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(x) for x in lines[:-1]]
    pieces = [c["choices"][0] for c in chunks]
    assert pieces[0]["delta"] == {"role": "assistant", "content": ""}
    deltas = [d for p in pieces for d in p["delta"].get("tool_calls") or []]
    firsts = [d for d in deltas if "id" in d]
    assert [d["index"] for d in firsts] == list(range(len(firsts))) and len(firsts) == 2
    for d in firsts:
        assert d["type"] == "function" and d["function"]["arguments"] == "" and d["function"]["name"] in SCHEMAS
    for d in deltas:
        if "id" not in d:
            assert set(d) == {"index", "function"} and set(d["function"]) == {"arguments"}
    for k, first in enumerate(firsts):  # each call's fragments form valid, schema-valid JSON
        text = "".join(d["function"]["arguments"] for d in deltas if d["index"] == k)
        jsonschema.validate(json.loads(text), SCHEMAS[first["function"]["name"]])
    assert [p["finish_reason"] for p in pieces if p["finish_reason"]] == ["tool_calls"]
    assert all("reasoning_content" not in p["delta"] for p in pieces)


def test_two_turn_round_trip_with_a_tool_result(tc, tok):
    first = _create(tc, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    message = first.choices[0].message
    (call,) = message.tool_calls
    history = [*ASK, message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 18}'}]
    second = _create(tc, messages=history, tools=TOOLS, tool_choice="none", max_tokens=8)
    assert second.choices[0].finish_reason in ("stop", "length") and second.choices[0].message.content
    # the prompt is the template's rendering of the whole history, tool call and result included
    rendered = [*ASK, {"role": "assistant", "content": "", "tool_calls": [
        {"id": call.id, "type": "function",
         "function": {"name": call.function.name, "arguments": json.loads(call.function.arguments)}}]},
        history[-1]]
    text = tok.apply_chat_template(rendered, chat_template=HERMES_TEMPLATE.read_text(), tokenize=False,
                                   add_generation_prompt=True)
    assert '<tool_response>\n{"temperature": 18}\n</tool_response>' in text
    assert second.usage.prompt_tokens == len(tok.encode(text, add_special_tokens=False))
    again = _create(tc, messages=history, tools=TOOLS, tool_choice="required")  # and a next call
    assert again.choices[0].finish_reason == "tool_calls" and _valid_calls(again.choices[0].message)


def _tool(name: str, parameters) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


INVALID = [
    ("parameters not an object schema", {"tools": [_tool("f", {"type": "string"})]}, "tools.0.function.parameters"),
    ("unknown type", {"tools": [_tool("f", {"type": "object", "properties": {"x": {"type": "foo"}}})]},
     "tools.0.function.parameters"),
    ("bad pattern", {"tools": [TIME, _tool("g", {"type": "object", "properties": {"x": {"type": "string",
                                                                                      "pattern": "(("}}})]},
     "tools.1.function.parameters"),
    ("duplicate names", {"tools": [TIME, TIME]}, "tools.1.function.name"),
    ("bad name", {"tools": [_tool("get time", {"type": "object"})]}, "tools.0.function.name"),
    ("unknown named function", {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name"),
    ("required without tools", {"tool_choice": "required"}, "tool_choice"),
    ("named without tools", {"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
    ("unknown tool_choice", {"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ("required with response_format", {"tools": TOOLS, "tool_choice": "required",
                                       "response_format": {"type": "json_object"}}, "response_format"),
]


def test_a_cut_call_fed_back_is_accepted(tools_server):
    """A call cut by max_tokens has arguments that are not JSON; an agent sends it back with the next
    turn as it came, and OpenAI accepts that: so does this server (it was a 400)."""
    cut = [*ASK, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a": 1'}}]},
        {"role": "tool", "tool_call_id": "c", "content": "cut off"}]
    with httpx.Client(base_url=tools_server.url, timeout=60) as http:
        resp = http.post("/v1/chat/completions", json={"messages": cut, "tools": TOOLS, "max_tokens": 2})
        assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 2, resp.text


@pytest.mark.parametrize("case,body,param", INVALID, ids=[c[0] for c in INVALID])
@pytest.mark.parametrize("stream", [False, True])
def test_invalid_tool_requests_are_400_before_generation(tools_server, case, body, param, stream):
    with httpx.Client(base_url=tools_server.url, timeout=60) as http:
        resp = http.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 4, "stream": stream, **body})
        assert resp.status_code == 400, resp.text
        err = resp.json()["error"]
        assert err["param"] == param and err["type"] == "invalid_request_error", err
        assert http.get("/health").status_code == 200
        ok = http.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 2})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2


# The model starts inside <think> (the template opens it); the regex makes even stories260K close it.
THINK = {"chat_template_kwargs": {"enable_thinking": True}, "regex": r"[a-z]{3,8}( [a-z]{3,8}){2}</think>\n\nYes[.]"}


def test_reasoning_is_split_from_the_answer(tc):
    got = _create(tc, max_tokens=64, extra_body=THINK).choices[0]
    reasoning = got.message.model_extra["reasoning_content"]
    assert len(reasoning.split(" ")) == 3 and "<think>" not in reasoning and "</think>" not in reasoning
    assert got.message.content == "Yes." and got.finish_reason == "stop"
    inline = _create(tc, max_tokens=64, extra_body={**THINK, "separate_reasoning": False}).choices[0]
    assert inline.message.content == f"{reasoning}</think>\n\nYes."
    assert inline.message.model_extra.get("reasoning_content") is None
    stream = tc.chat.completions.create(model="m", messages=ASK, temperature=0, max_tokens=64, stream=True,
                                        extra_body=THINK)
    parts = {"reasoning_content": "", "content": ""}
    for chunk in stream:
        delta = chunk.choices[0].delta
        parts["content"] += delta.content or ""
        parts["reasoning_content"] += (delta.model_extra or {}).get("reasoning_content") or ""
    assert parts == {"reasoning_content": reasoning, "content": "Yes."}


def test_without_thinking_everything_is_content(tc):
    got = _create(tc, max_tokens=12).choices[0]
    assert got.message.content and got.message.model_extra.get("reasoning_content") is None


def test_reasoning_then_a_forced_call(tc):
    """A prompt that opens <think>: the reasoning is free, then the grammar forces the call."""
    got = _create(tc, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}},
                  max_tokens=300, extra_body={"chat_template_kwargs": {"enable_thinking": True}}).choices[0]
    # stories260K never writes </think> itself: all of it is reasoning, and no half call appears
    assert got.finish_reason == "length" and got.message.tool_calls is None and got.message.content is None
    assert got.message.model_extra["reasoning_content"]


class Weather(BaseModel):
    city: str = Field(max_length=12)
    days: int


def test_structured_output_helper_returns_a_parsed_object(tc):
    got = tc.chat.completions.parse(model="m", messages=ASK, temperature=0, max_tokens=MAX, response_format=Weather)
    parsed = got.choices[0].message.parsed
    assert isinstance(parsed, Weather) and got.choices[0].finish_reason == "stop"
    assert Weather.model_validate_json(got.choices[0].message.content) == parsed


def test_parse_helper_with_a_pydantic_tool(tc):
    tool = openai.pydantic_function_tool(Weather, name="report_weather")
    got = tc.chat.completions.parse(model="m", messages=ASK, temperature=0, max_tokens=MAX, tools=[tool],
                                    tool_choice="required", parallel_tool_calls=False)
    (call,) = got.choices[0].message.tool_calls
    assert call.function.name == "report_weather" and isinstance(call.function.parsed_arguments, Weather)
