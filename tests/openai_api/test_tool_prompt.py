"""In-process: tools and tool-use history in prompts (native for tool-aware templates, the default
rendering otherwise) and the per-choice output assembly (content, reasoning, calls, finish reason)."""

from __future__ import annotations

import json

import pytest

from radixlm.srt.function_call import FunctionTool, create_tool_parser
from radixlm.srt.openai_api.chat_output import ChoiceOutput
from radixlm.srt.openai_api.chat_template import ChatTemplate
from radixlm.srt.openai_api.protocol import ChatMessage, OpenAIError
from radixlm.srt.openai_api.tool_prompt import default_messages, native_messages, template_supports_tools
from radixlm.srt.reasoning_parser import get_reasoning_format

from .conftest import HERMES_TEMPLATE, TEMPLATE

TOOL = FunctionTool("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}}, "Weather")
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
HISTORY = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"},
           {"role": "assistant", "content": "", "tool_calls": [CALL, {**CALL, "id": "call_2"}]},
           {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
           {"role": "tool", "tool_call_id": "call_2", "content": "19C"}]


def test_default_rendering_puts_tools_in_the_system_turn_and_calls_in_the_format():
    hermes = create_tool_parser("hermes")
    out = default_messages(HISTORY, [TOOL], hermes)
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert out[0]["content"].startswith("Be brief.\n\n# Tools")
    assert json.dumps(TOOL.to_openai()) in out[0]["content"] and "<tool_call>" in out[0]["content"]
    assert out[2]["content"] == hermes.render_calls([("get_weather", {"city": "Paris"})] * 2)
    assert out[3]["content"] == "<tool_response>\n18C\n</tool_response>\n<tool_response>\n19C\n</tool_response>"
    assert all(set(m) == {"role", "content"} for m in out)
    no_system = default_messages(HISTORY[1:2], [TOOL], create_tool_parser("mistral"))
    assert no_system[0]["role"] == "system" and "[TOOL_CALLS] [" in no_system[0]["content"]
    assert default_messages(HISTORY[1:], [], hermes)[0]["role"] == "user"  # history only: no tool section


def test_native_rendering_decodes_arguments_and_checks_them():
    native = native_messages(HISTORY)
    assert native[2]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    # a call the token limit cut, fed back as it came: kept as its text (OpenAI accepts it), not a 400
    cut = [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": '{"x": 1'}}]}]
    assert native_messages(cut)[0]["tool_calls"][0]["function"]["arguments"] == '{"x": 1'
    hermes = create_tool_parser("hermes")
    assert '{"name": "f", "arguments": "{\\"x\\": 1"}' in default_messages(cut, [], hermes)[0]["content"]
    with pytest.raises(OpenAIError, match="function name"):
        native_messages([{"role": "assistant", "content": "", "tool_calls": [{"function": {}}]}])


def test_templates_with_and_without_tools(tok):
    assert ChatTemplate(tok, str(HERMES_TEMPLATE)).supports_tools
    assert not ChatTemplate(tok, str(TEMPLATE)).supports_tools
    assert template_supports_tools("{% if tools %}x{% endif %}") and not template_supports_tools(None)
    messages = [ChatMessage(**m) for m in HISTORY]
    hermes = create_tool_parser("hermes")
    native = ChatTemplate(tok, str(HERMES_TEMPLATE)).render_text(messages, tools=[TOOL], tool_parser=hermes)
    assert "Tools you can call" in native and '"arguments": {"city": "Paris"}' in native
    default = ChatTemplate(tok, str(TEMPLATE)).render_text(messages, tools=[TOOL], tool_parser=hermes)
    assert "<|im_start|>system\nBe brief.\n\n# Tools" in default and "<|im_start|>tool" not in default


def test_choice_output_parts_and_finish_reason():
    text = "<think>hmm</think>\n\nSure.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>"
    whole = ChoiceOutput((get_reasoning_format("qwen3"), False), create_tool_parser("hermes"))
    whole.feed(text)
    whole.finish()
    message = whole.message()
    assert (message.reasoning_content, message.content) == ("hmm", "Sure.")
    assert [c["function"] for c in message.tool_calls] == [{"name": "f", "arguments": "{}"}]
    assert whole.finish_reason("stop") == "tool_calls" and whole.finish_reason("length") == "length"
    pieces = ChoiceOutput((get_reasoning_format("qwen3"), False), create_tool_parser("hermes"))
    deltas = [pieces.feed(ch) for ch in text] + [pieces.finish()]
    assert "".join(d.reasoning for d in deltas) == "hmm" and "".join(d.content for d in deltas) == "Sure."
    plain = ChoiceOutput(None, None)
    plain.feed("just text")
    plain.finish()
    assert plain.message().content == "just text" and plain.finish_reason("stop") == "stop"
