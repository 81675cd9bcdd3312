"""``auto`` mode for formats whose grammar triggers on a whole call opening (llama3, pythonic): text
that only resembles a call stays content, in the grammar and in the parser alike, and a call that
opens with a trigger streams as the format's parser reads it."""

from __future__ import annotations

import json

import pytest

from radixlm.constrained import GrammarSpec
from radixlm.srt.function_call import FunctionTool, ToolCallStream, create_tool_parser, tool_call_structural_tag
from radixlm.srt.function_call.triggered import TriggeredParser
from tests.constrained.conftest import get_backend, load_model

TIME = FunctionTool("get_time", {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 8}},
                                 "required": ["zone"]})
PING = FunctionTool("ping")


def _parse(parser, text: str, chunk: int = 0):
    s = ToolCallStream(parser)
    for i in range(0, len(text), chunk or len(text) or 1):
        s.feed(text[i:i + (chunk or len(text))])
    s.finish()
    return s.content, [(c.name, json.loads(c.arguments)) for c in s.calls]


LLAMA3_CASES = [
    ('{"name": "Alice", "age": 3}', '{"name": "Alice", "age": 3}', []),  # a JSON answer, not a call
    ('Here: {"name": "get_weather", "parameters": {}}', 'Here: {"name": "get_weather", "parameters": {}}', []),
    ('{"name": "get_time", "parameters": {"zone": "UTC"}}', "", [("get_time", {"zone": "UTC"})]),
    ('Sure. {"name": "get_time", "parameters": {"zone": "CET"}}', "Sure.", [("get_time", {"zone": "CET"})]),
    ('<|python_tag|>{"name": "ping", "parameters": {}}', "", [("ping", {})]),
]


@pytest.mark.parametrize("text,content,calls", LLAMA3_CASES)
@pytest.mark.parametrize("chunk", [0, 1, 3])
def test_llama3_regions_open_only_at_a_tool_trigger(text, content, calls, chunk):
    parser = TriggeredParser(create_tool_parser("llama3"), [TIME, PING])
    got_content, got_calls = _parse(parser, text, chunk)
    assert got_content.strip() == content and got_calls == calls


def test_the_bare_parsers_took_such_text_for_calls():
    # what TriggeredParser is for: the format parsers alone read these as calls to "Alice" and "foo"
    assert _parse(create_tool_parser("llama3"), '{"name": "Alice", "age": 3}') == ("", [("Alice", {})])
    assert _parse(create_tool_parser("pythonic"), "Use [foo(x=1)] or [1, 2].")[1] == [("foo", {"x": 1})]


@pytest.mark.parametrize("chunk", [0, 1])
def test_pythonic_calls_to_other_functions_stay_text(chunk):
    parser = TriggeredParser(create_tool_parser("pythonic"), [TIME, PING])
    assert _parse(parser, 'Use [foo(x=1)] or [1, 2].', chunk) == ('Use [foo(x=1)] or [1, 2].', [])
    assert _parse(parser, 'Ok [get_time(zone="UTC"), ping()]', chunk) == (
        "Ok", [("get_time", {"zone": "UTC"}), ("ping", {})])


def test_llama3_auto_grammar_leaves_a_json_answer_free():
    model = load_model("stories")
    backend = get_backend("xgrammar", "stories")
    tag = tool_call_structural_tag(create_tool_parser("llama3"), [TIME, PING], "auto", parallel=False)
    compiled = backend.compile(GrammarSpec("structural_tag", json.dumps(tag)))
    answer = backend.new_matcher(compiled)
    ids = model.tokenizer.encode('{"name": "Alice", "age": 3}', add_special_tokens=False)
    assert all(answer.accept_token(t) for t in ids) and answer.accept_token(model.eos[0])
    call = backend.new_matcher(compiled)
    ids = model.tokenizer.encode('Ok {"name": "get_time", "parameters": ', add_special_tokens=False)
    assert all(call.accept_token(t) for t in ids)
    assert not call.accept_token(model.eos[0])  # a started call must be finished
