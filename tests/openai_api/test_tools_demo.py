"""Function calling with the SmolLM2 demo model, whose chat template has no tool support: the
default rendering (tools in the system turn, ``<tool_call>`` blocks, results as ``<tool_response>``)
and the default hermes parser, through the official ``openai`` client."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
                   "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]


@pytest.fixture(scope="module")
def demo(demo_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=demo_server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def _ask(demo, **kwargs):
    return demo.chat.completions.create(model="m", messages=kwargs.pop("messages", ASK), temperature=0,
                                        max_tokens=kwargs.pop("max_tokens", 48), tools=[WEATHER], **kwargs)


def _city(message) -> str:
    (call,) = message.tool_calls
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, WEATHER["function"]["parameters"])
    return arguments["city"]


def test_named_call_streamed_and_not(demo):
    named = {"type": "function", "function": {"name": "get_weather"}}
    once = _ask(demo, tool_choice=named).choices[0]
    assert once.finish_reason == "tool_calls" and once.message.content is None
    assert _city(once.message)  # (SmolLM2-135M writes "..." here: valid, if not helpful)
    with demo.chat.completions.stream(model="m", messages=ASK, tools=[WEATHER], tool_choice=named, temperature=0,
                                      max_tokens=48) as stream:
        final = stream.get_final_completion().choices[0]
    assert [(c.function.name, c.function.arguments) for c in final.message.tool_calls] == [
        (c.function.name, c.function.arguments) for c in once.message.tool_calls]


def test_required_without_parallel_calls_is_one_call(demo):
    got = _ask(demo, tool_choice="required", parallel_tool_calls=False).choices[0]
    assert got.finish_reason == "tool_calls" and _city(got.message)


@pytest.mark.parametrize("stop", [["\n"], ["}"], ["Paris", "<tool_call>"]])
def test_stop_strings_do_not_cut_a_forced_call(demo, stop):
    # An agent's usual stop ["\n"] used to end the output at "<tool_call>" (no call, finish stop);
    # ["}"] cut the arguments before their closing brace. Forced calls end by their grammar alone.
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        got = _ask(demo, tool_choice=choice, stop=stop).choices[0]
        assert got.finish_reason == "tool_calls" and got.message.content is None
        assert _city(got.message)


def test_auto_is_a_valid_call_or_plain_text(demo):
    got = _ask(demo).choices[0]
    if got.message.tool_calls:
        assert got.finish_reason == "tool_calls" and _city(got.message)
    else:
        assert got.finish_reason in ("stop", "length") and got.message.content
        assert "<tool_call>" not in got.message.content


def test_round_trip_answers_from_the_tool_result(demo):
    first = _ask(demo, tool_choice="required", parallel_tool_calls=False).choices[0].message
    history = [*ASK, first.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "Sunny, 24 degrees Celsius"}]
    second = _ask(demo, messages=history, tool_choice="none", max_tokens=32).choices[0]
    assert second.message.tool_calls is None
    assert "24" in second.message.content or "sunny" in second.message.content.lower(), second.message.content
