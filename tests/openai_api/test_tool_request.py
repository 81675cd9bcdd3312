"""In-process: a chat request's tool plan (mode, grammar, 400s) for each grammar backend."""

from __future__ import annotations

import json

import pytest

from radixlm.srt.function_call import ReasoningGrammar, ToolCallStream, create_tool_parser
from radixlm.srt.function_call.checked import CheckedParser
from radixlm.srt.function_call.forced import ForcedParser
from radixlm.srt.function_call.triggered import TriggeredParser
from radixlm.srt.openai_api.protocol import ChatCompletionRequest, OpenAIError
from radixlm.srt.openai_api.tool_request import ToolValidator, output_tool_parser, plan_tools, request_tools

TOOL = {"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}
HERMES = create_tool_parser("hermes")


def _plan(backend: str = "xgrammar", other=None, reasoning=None, **body):
    req = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], **body})
    return plan_tools(req, request_tools(req), HERMES, ToolValidator(backend), reasoning, other)


def test_modes_and_their_grammars():
    assert _plan().mode == "none" and _plan().structural_tag is None
    auto = _plan(tools=[TOOL])
    assert auto.mode == "auto" and json.loads(auto.structural_tag)["format"]["type"] == "triggered_tags"
    required = json.loads(_plan(tools=[TOOL], tool_choice="required", parallel_tool_calls=False).structural_tag)
    assert required["format"]["type"] == "tags_with_separator" and required["format"]["stop_after_first"]
    named = json.loads(_plan(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "f"}}).structural_tag)
    assert named["format"]["type"] == "tag" and '"name": "f"' in named["format"]["begin"]
    none = _plan(tools=[TOOL], tool_choice="none")
    assert none.mode == "none" and not none.parse
    inside = ReasoningGrammar("<think>", "</think>", True)
    assert json.loads(_plan(tools=[TOOL], tool_choice="required", reasoning=inside).structural_tag)[
        "format"]["type"] == "sequence"


@pytest.mark.parametrize("backend", ["outlines", "none"])
def test_without_structural_tags_auto_is_parsed_and_forced_modes_are_400(backend):
    auto = _plan(backend, tools=[TOOL])
    assert auto.parse and auto.structural_tag is None
    with pytest.raises(OpenAIError, match="xgrammar") as e:
        _plan(backend, tools=[TOOL], tool_choice="required")
    assert e.value.status == 400 and e.value.param == "tool_choice"


def test_another_constraint_wins_in_auto_and_conflicts_with_forced():
    auto = _plan(other="regex", tools=[TOOL])
    assert auto.parse and auto.structural_tag is None
    with pytest.raises(OpenAIError, match="cannot be combined with regex"):
        _plan(other="regex", tools=[TOOL], tool_choice="required")


def test_validator_caches_accepted_tags_and_reports_bad_ones():
    validator = ToolValidator("xgrammar", max_entries=2)
    good = json.dumps({"type": "structural_tag", "format": {"type": "const_string", "value": "x"}})
    assert validator.check(good) is None and validator.check(good) is None and len(validator._ok) == 1
    bad = json.dumps({"type": "structural_tag", "format": {"type": "json_schema", "json_schema": {"type": "foo"}}})
    assert "foo" in validator.check(bad) and len(validator._ok) == 1


def test_the_output_parser_follows_the_plan():
    llama3, pythonic = create_tool_parser("llama3"), create_tool_parser("pythonic")

    def parser_for(parser, backend="xgrammar", **body):
        req = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], **body})
        plan = plan_tools(req, request_tools(req), parser, ToolValidator(backend), None, None)
        return output_tool_parser(parser, plan)

    assert parser_for(llama3) is None  # no tools: nothing is parsed
    assert isinstance(parser_for(llama3, tools=[TOOL]), TriggeredParser)  # auto, grammar: calls at triggers
    assert isinstance(parser_for(pythonic, tools=[TOOL]), TriggeredParser)
    assert parser_for(HERMES, tools=[TOOL]) is HERMES  # its trigger is its own marker
    forced = parser_for(llama3, tools=[TOOL], tool_choice="required")  # the grammar makes the calls
    assert isinstance(forced, ForcedParser) and forced.parser is llama3
    # a forced call cut by the token limit before its name was whole: no content, no call
    # (or sooner, inside its opener: "<", "<tool", "<tool_call" with max_tokens 1-3; a newcomer's finding)
    cuts = [("hermes", "<tool_call>\n"), ("llama3", '{"name": "'), ("hermes", "<"), ("hermes", "<tool"),
            ("hermes", "<tool_call"), ("hermes", "<tool_call>\n{\"na"), ("llama3", "{")]
    for name, cut in cuts:
        parser = {"hermes": HERMES, "llama3": llama3}[name]
        for pieces in ([cut], list(cut)):  # whole, and one character at a time
            stream = ToolCallStream(parser_for(parser, tools=[TOOL], tool_choice="required"))
            deltas = [stream.feed(p) for p in pieces] + [stream.finish()]
            assert stream.content == "" and not stream.calls and not any(d.text or d.calls for d in deltas), cut
        plain = ToolCallStream(parser)
        plain.feed(cut)
        plain.finish()
        assert plain.content.strip() == cut.strip()  # what the format's parser alone showed
    assert isinstance(parser_for(llama3, "outlines", tools=[TOOL]), CheckedParser)  # parsed only
    json_answer = '{"name": "Alice", "age": 3}'
    stream = ToolCallStream(parser_for(llama3, tools=[TOOL]))
    stream.feed(json_answer)
    stream.finish()
    assert stream.content == json_answer and not stream.calls


def test_parallel_tool_calls_false_keeps_the_first_parsed_call():
    # Without a grammar (outlines: calls are only parsed) the model may write several calls; OpenAI's
    # parallel_tool_calls: false allows one, so the later ones are dropped, streamed or not.
    def stream_for(parallel, pieces):
        req = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}],
                                                    "tools": [TOOL], "parallel_tool_calls": parallel})
        plan = plan_tools(req, request_tools(req), HERMES, ToolValidator("outlines"), None, None)
        stream = ToolCallStream(output_tool_parser(HERMES, plan))
        deltas = [stream.feed(p) for p in pieces] + [stream.finish()]
        return stream, deltas

    text = ('Sure.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\n'
            '<tool_call>\n{"name": "f", "arguments": {"a": 2}}\n</tool_call>')
    both, _ = stream_for(True, [text])
    assert [json.loads(c.arguments)["a"] for c in both.calls] == [1, 2]
    for pieces in ([text], [text[i:i + 7] for i in range(0, len(text), 7)]):
        one, deltas = stream_for(False, pieces)
        assert [(c.name, json.loads(c.arguments)) for c in one.calls] == [("f", {"a": 1})]
        assert one.content == "Sure." and "".join(d.text for d in deltas) == "Sure."
        assert {c.index for d in deltas for c in d.calls} == {0}
    # an invalid first region does not use up the one call
    bad_first = '<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>\n' + text.split("\n", 1)[1]
    one, _ = stream_for(False, [bad_first])
    assert [json.loads(c.arguments)["a"] for c in one.calls] == [1]
