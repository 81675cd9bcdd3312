"""``/v1/responses`` through the official ``openai`` client, against stories260K with the Hermes-style
template and ``--reasoning-parser qwen3`` (``tools_server``, shared with ``test_tools``), plus one
agent round trip on the demo model. The tiny story model never decides to call a tool, so calls come
from the grammar (``required``/named); every call must parse and validate against its schema."""

from __future__ import annotations

import json

import random

import httpx
import jsonschema
import openai
import pytest
from openai.types.responses import Response as SDKResponse
from pydantic import BaseModel, Field

from radixlm.srt.function_call import create_tool_parser
from radixlm.srt.openai_api.chat_output import ChoiceOutput
from radixlm.srt.openai_api.responses_stream import OutputBuilder
from radixlm.srt.reasoning_parser import get_reasoning_format

WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                                           "unit": {"enum": ["celsius", "fahrenheit"]}},
                          "required": ["city", "unit"]}}
TIME = {"type": "function", "name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 8}},
                       "required": ["zone"]}}
TOOLS = [WEATHER, TIME]
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}} for t in TOOLS]
SCHEMAS = {t["name"]: t["parameters"] for t in TOOLS}
ASK = "What is the weather in Paris?"
MAX = 200  # room for two whole calls of stories260K's byte-sized tokens


@pytest.fixture(scope="module")
def rc(tools_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=tools_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _create(rc, **kwargs) -> SDKResponse:
    got = rc.responses.create(model="m", input=kwargs.pop("input", ASK), temperature=0,
                              max_output_tokens=kwargs.pop("max_output_tokens", MAX), **kwargs)
    SDKResponse.model_validate(got.model_dump())  # the SDK's own types, validated (it builds them leniently)
    return got


def _calls(response, names=None) -> list[tuple[str, dict]]:
    calls = [o for o in response.output if o.type == "function_call"]
    for call in calls:
        assert call.call_id.startswith("call_") and call.id.startswith("fc_") and call.status == "completed"
        assert call.name in (names or SCHEMAS), call
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    assert len({c.call_id for c in calls}) == len(calls)
    return [(c.name, json.loads(c.arguments)) for c in calls]


def _events(server, body: dict) -> list[dict]:
    """A raw stream: each ``event:`` line names the type of the ``data:`` that follows; no ``[DONE]``."""
    out, name = [], None
    with httpx.stream("POST", server.url + "/v1/responses", json={**body, "stream": True}, timeout=120) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: "):
                event = json.loads(line[len("data: "):])
                assert event["type"] == name, (name, event)
                out.append(event)
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    return out


CALL = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
OUTPUTS = [  # (model output, the items: (type, text or arguments))
    (f"hello {CALL} world {CALL} end", [("message", "hello"), ("function_call", '{"a": 1}'), ("message", "world"),
                                        ("function_call", '{"a": 1}'), ("message", "end")]),
    (f"{CALL}\n{CALL}", [("function_call", '{"a": 1}')] * 2),
    (f"{CALL} after", [("function_call", '{"a": 1}'), ("message", "after")]),
    (f"<think>hmm</think>\n\nok {CALL}", [("reasoning", "hmm"), ("message", "ok"), ("function_call", '{"a": 1}')]),
    ("plain text", [("message", "plain text")]),
]


def _build(text: str, cuts: list[int], stream: bool) -> OutputBuilder:
    b = OutputBuilder(ChoiceOutput((get_reasoning_format("qwen3"), False), create_tool_parser("hermes")), stream)
    for start, end in zip([0, *cuts], [*cuts, len(text)]):
        b.feed(text[start:end])
    b.finish(incomplete=False)
    return b


@pytest.mark.parametrize("text,expected", OUTPUTS, ids=[t for t, _ in OUTPUTS])
def test_items_follow_the_text_whatever_the_chunking(text, expected):
    """Unit test, no server: the items of the whole text, of random chunkings, and those the stream's
    events rebuild are the same."""
    def shape(items):
        return [(i["type"], i["arguments"] if i["type"] == "function_call" else i["content"][0]["text"])
                for i in items]

    assert shape(_build(text, [], False).items) == expected
    for seed in range(20):
        cuts = sorted(random.Random(seed).sample(range(1, len(text)), min(len(text) - 1, seed % 7 + 1)))
        b = _build(text, cuts, True)
        assert shape(b.items) == expected and all(i["status"] == "completed" for i in b.items)
        events = [json.loads(e.split(b"data: ", 1)[1]) for e in b.drain()]
        rebuilt: dict[int, dict] = {}
        for e in events:
            if e["type"] == "response.output_item.added":
                rebuilt[e["output_index"]] = {**e["item"], "text": ""}
            elif e["type"].endswith(("text.delta", "arguments.delta")):
                rebuilt[e["output_index"]]["arguments" if "arguments" in e["type"] else "text"] += e["delta"]
            elif e["type"] == "response.output_item.done":
                assert e["item"]["status"] == "completed"
        assert [(r["type"], r["arguments"] if r["type"] == "function_call" else r["text"])
                for _, r in sorted(rebuilt.items())] == expected
        assert [e["sequence_number"] for e in events] == list(range(len(events)))


def test_text_input_equals_chat_and_stops_at_max_output_tokens(rc):
    got = _create(rc, max_output_tokens=24)
    chat = rc.chat.completions.create(model="m", messages=[{"role": "user", "content": ASK}], temperature=0,
                                      max_tokens=24)
    assert got.object == "response" and got.id.startswith("resp_") and got.output_text
    assert got.output_text == chat.choices[0].message.content
    (message,) = got.output
    assert message.type == "message" and message.role == "assistant" and message.content[0].type == "output_text"
    assert got.status == "incomplete" and got.incomplete_details.reason == "max_output_tokens"
    assert message.status == "incomplete" and chat.choices[0].finish_reason == "length"
    usage = got.usage
    assert (usage.input_tokens, usage.output_tokens) == (chat.usage.prompt_tokens, 24)
    assert usage.total_tokens == usage.input_tokens + 24 and usage.input_tokens_details.cached_tokens >= 0


def test_message_items_with_instructions_equal_chat(rc):
    items = [{"role": "developer", "content": "Tell a story."},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Lily"},
                                                             {"type": "input_text", "text": " and Tom"}]},
             {"role": "assistant", "content": [{"type": "output_text", "text": "Once upon a time"}]},
             {"role": "user", "content": "Go on."}]
    got = _create(rc, input=items, instructions="You are a storyteller.", max_output_tokens=32)
    messages = [{"role": "system", "content": "You are a storyteller."}, {"role": "system", "content": "Tell a story."},
                {"role": "user", "content": "Lily and Tom"}, {"role": "assistant", "content": "Once upon a time"},
                {"role": "user", "content": "Go on."}]
    chat = rc.chat.completions.create(model="m", messages=messages, temperature=0, max_tokens=32)
    assert got.output_text == chat.choices[0].message.content and got.output_text
    assert got.usage.input_tokens == chat.usage.prompt_tokens
    assert got.instructions == "You are a storyteller."


def test_streamed_text_equals_non_streamed(rc, tools_server):
    once = _create(rc, max_output_tokens=40)
    events = _events(tools_server, {"input": ASK, "temperature": 0, "max_output_tokens": 40})
    kinds = [e["type"] for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert len(deltas) > 1 and "".join(deltas) == once.output_text
    final = events[-1]["response"]
    assert final["output"][0]["content"][0]["text"] == once.output_text and final["status"] == "incomplete"
    assert events[0]["response"]["id"] == final["id"] and events[0]["response"]["status"] == "in_progress"
    # the client's typed stream
    stream = rc.responses.create(model="m", input=ASK, temperature=0, max_output_tokens=40, stream=True)
    typed = list(stream)
    assert "".join(e.delta for e in typed if e.type == "response.output_text.delta") == once.output_text
    assert typed[-1].type == "response.incomplete" and typed[-1].response.output_text == once.output_text


@pytest.mark.parametrize("parallel", [True, False])
def test_required_gives_valid_function_calls(rc, parallel):
    got = _create(rc, tools=TOOLS, tool_choice="required", parallel_tool_calls=parallel)
    assert got.status == "completed" and got.output_text == ""
    assert all(o.type == "function_call" for o in got.output)
    names = [name for name, _ in _calls(got)]
    assert names == (["get_weather", "get_time"] if parallel else ["get_weather"])  # greedy stories260K
    assert got.parallel_tool_calls is parallel and got.tools[0].strict is True


@pytest.mark.parametrize("max_tokens", [2, 11, 16])
def test_a_forced_call_cut_before_its_name_leaves_no_output_text(rc, max_tokens):
    got = _create(rc, tools=TOOLS, tool_choice="required", max_output_tokens=max_tokens)
    assert got.status == "incomplete" and got.output_text == "" and not _calls(got), got.output


def test_named_and_auto_tool_choice(rc):
    named = _create(rc, tools=TOOLS, tool_choice={"type": "function", "name": "get_time"})
    assert [name for name, _ in _calls(named, ["get_time"])] == ["get_time"]
    assert named.tool_choice.name == "get_time"
    auto = _create(rc, tools=TOOLS, max_output_tokens=24)  # the model writes text, no call
    assert [o.type for o in auto.output] == ["message"] and "<tool_call>" not in auto.output_text
    none = _create(rc, tools=TOOLS, tool_choice="none", max_output_tokens=24)
    assert none.usage.input_tokens < auto.usage.input_tokens  # none: the tools are not in the prompt


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "name": "get_weather"}])
def test_streamed_function_calls_equal_non_streamed(rc, tool_choice):
    once = _create(rc, tools=TOOLS, tool_choice=tool_choice)
    with rc.responses.stream(model="m", input=ASK, tools=TOOLS, tool_choice=tool_choice, temperature=0,
                             max_output_tokens=MAX) as stream:
        events = list(stream)
        final = stream.get_final_response()
    key = [(o.name, o.arguments) for o in once.output]
    assert [(o.name, o.arguments) for o in final.output] == key
    assert [(e.name, e.arguments) for e in events if e.type == "response.function_call_arguments.done"] == key
    for k, (_, arguments) in enumerate(key):  # each call's fragments form its arguments
        pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta" and e.output_index == k]
        assert "".join(pieces) == arguments
    assert final.status == "completed"


def test_round_trip_with_function_call_output_and_previous_response_id(rc):
    first = _create(rc, tools=TOOLS, tool_choice={"type": "function", "name": "get_weather"})
    (call,) = first.output
    result = {"type": "function_call_output", "call_id": call.call_id, "output": '{"temperature": 18}'}
    # the agent loop: the output items go back as input (as the SDK objects), then the result
    second = _create(rc, input=[{"role": "user", "content": ASK}, *first.output, result], tools=TOOLS,
                     tool_choice="none", max_output_tokens=8)
    assert second.output_text and [o.type for o in second.output] == ["message"]
    history = [{"role": "user", "content": ASK},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": call.call_id, "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments}}]},
               {"role": "tool", "tool_call_id": call.call_id, "content": '{"temperature": 18}'}]
    chat = rc.chat.completions.create(model="m", messages=history, tools=CHAT_TOOLS, tool_choice="none",
                                      temperature=0, max_tokens=8)
    assert second.output_text == chat.choices[0].message.content
    assert second.usage.input_tokens == chat.usage.prompt_tokens
    # the same conversation from the stored first response
    chained = _create(rc, previous_response_id=first.id, input=[result], tools=TOOLS, tool_choice="none",
                      max_output_tokens=8)
    assert (chained.output_text, chained.usage.input_tokens) == (second.output_text, second.usage.input_tokens)
    assert chained.previous_response_id == first.id
    again = _create(rc, previous_response_id=first.id, input=[result], tools=TOOLS, tool_choice="required")
    assert _calls(again)  # and a next call
    stored = rc.responses.retrieve(chained.id)
    assert stored.id == chained.id and stored.output_text == chained.output_text
    # sub-routes this server lacks name themselves, not a missing response (they said "resp_.../input_items
    # not found", and input_tokens was a 405)
    with pytest.raises(openai.NotFoundError, match=f"GET /v1/responses/{chained.id}/input_items is not supported"):
        rc.responses.input_items.list(chained.id)
    with pytest.raises(openai.NotFoundError, match="POST /v1/responses/input_tokens is not supported"):
        rc.post("/responses/input_tokens", body={"model": "m", "input": "Lily"}, cast_to=object)
    rc.responses.delete(chained.id)
    with pytest.raises(openai.NotFoundError):
        rc.responses.retrieve(chained.id)
    unstored = _create(rc, input="Lily", store=False, max_output_tokens=2)
    assert unstored.model_extra["store"] is False
    with pytest.raises(openai.BadRequestError, match="not found"):
        _create(rc, previous_response_id=unstored.id, input="and", max_output_tokens=2)


# The model starts inside <think> (the template opens it); the regex makes even stories260K close it.
THINK = {"chat_template_kwargs": {"enable_thinking": True}, "regex": r"[a-z]{3,8}( [a-z]{3,8}){2}</think>\n\nYes[.]"}


def test_reasoning_item_before_the_message(rc, tools_server):
    got = _create(rc, input="Lily", max_output_tokens=64, extra_body=THINK)
    reasoning, message = got.output
    assert reasoning.type == "reasoning" and reasoning.id.startswith("rs_") and reasoning.summary == []
    (text,) = reasoning.content
    assert text.type == "reasoning_text" and len(text.text.split(" ")) == 3 and "think>" not in text.text
    assert got.output_text == "Yes." and got.status == "completed"
    assert 0 < got.usage.output_tokens_details.reasoning_tokens < got.usage.output_tokens
    events = _events(tools_server, {"input": "Lily", "temperature": 0, "max_output_tokens": 64, **THINK})
    assert "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta") == text.text
    assert [e["item"]["type"] for e in events if e["type"] == "response.output_item.done"] == ["reasoning", "message"]


class Weather(BaseModel):
    city: str = Field(max_length=12)
    days: int


def test_parse_helper_with_a_text_format(rc):
    got = rc.responses.parse(model="m", input=ASK, temperature=0, max_output_tokens=MAX, text_format=Weather)
    assert isinstance(got.output_parsed, Weather) and got.status == "completed"
    assert Weather.model_validate_json(got.output_text) == got.output_parsed


BAD = [
    ("built-in tool", {"tools": [{"type": "web_search"}]}, "tools.0.type"),
    ("background", {"background": True}, "background"),
    ("unknown previous response", {"previous_response_id": "resp_nope"}, "previous_response_id"),
    ("image input", {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input.0.content.0.type"),
    ("output without its call", {"input": [{"type": "function_call_output", "call_id": "c1", "output": "1"}]},
     "input.0.call_id"),
    ("unknown item type", {"input": [{"type": "telepathy"}]}, "input.0"),
    ("message without content", {"input": [{"role": "user"}]}, "input.0.content"),
    ("chat-shaped tool", {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools.0"),
    ("schema not an object", {"tools": [{"type": "function", "name": "f", "parameters": {"type": "string"}}]},
     "tools.0.parameters"),
    ("unknown named function", {"tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}},
     "tool_choice.name"),
    ("required with a text format", {"tools": TOOLS, "tool_choice": "required",
                                     "text": {"format": {"type": "json_object"}}}, "text.format"),
    ("too many output tokens", {"max_output_tokens": 10 ** 6}, "max_output_tokens"),
    ("unknown field", {"temprature": 0}, "temprature"),
]


@pytest.mark.parametrize("case,body,param", BAD, ids=[c[0] for c in BAD])
def test_bad_requests_are_400_and_the_server_stays_healthy(tools_server, case, body, param):
    with httpx.Client(base_url=tools_server.url, timeout=60) as http:
        for stream in (False, True):
            resp = http.post("/v1/responses", json={"input": ASK, "max_output_tokens": 4, "stream": stream, **body})
            assert resp.status_code == 400, resp.text
            err = resp.json()["error"]
            assert err["param"] == param and err["type"] == "invalid_request_error", err
        assert http.get("/health").status_code == 200
        ok = http.post("/v1/responses", json={"input": ASK, "max_output_tokens": 2})
        assert ok.status_code == 200 and ok.json()["usage"]["output_tokens"] == 2


def test_demo_agent_round_trip(demo_server):
    """A sensible model: call the tool, get its result, answer from it."""
    demo = openai.OpenAI(base_url=demo_server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    tool = {**WEATHER, "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
                                      "required": ["city"]}}
    ask = "What is the weather like in Paris today?"
    first = demo.responses.create(model="m", input=ask, tools=[tool], tool_choice="required",
                                  parallel_tool_calls=False, temperature=0, max_output_tokens=48)
    (call,) = first.output
    assert call.type == "function_call" and call.status == "completed"
    jsonschema.validate(json.loads(call.arguments), tool["parameters"])
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 24 degrees Celsius"}
    second = demo.responses.create(model="m", previous_response_id=first.id, input=[result], tools=[tool],
                                   tool_choice="none", temperature=0, max_output_tokens=32)
    text = second.output_text
    assert "24" in text or "sunny" in text.lower(), second.output
