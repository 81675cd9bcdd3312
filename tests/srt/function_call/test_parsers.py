"""Tool-call parsers: what each format parses to, and that streaming at any chunking gives the same
content and calls as the one-shot parse (the driver's state depends on the text, not the chunks)."""

from __future__ import annotations

import json
import random

import pytest

from radixlm.srt.function_call import (TOOL_CALL_PARSERS, ToolCallStream, create_tool_parser,
                                       detect_tool_parser)
from radixlm.srt.function_call.base import new_call_id


def stream(parser: str, text: str, cuts: list[int]) -> tuple[str, list[tuple[str, str]], list[dict]]:
    """Feed ``text`` cut at ``cuts``; return (content, [(name, arguments)], first deltas of calls)."""
    s = ToolCallStream(create_tool_parser(parser))
    content, calls, firsts = "", {}, []
    bounds = [0, *cuts, len(text)]
    deltas = [s.feed(text[a:b]) for a, b in zip(bounds, bounds[1:])] + [s.finish()]
    for d in deltas:
        content += d.text
        for c in d.calls:
            entry = c.to_openai()
            if "id" in entry:
                firsts.append(entry)
                calls[c.index] = [entry["function"]["name"], ""]
            calls[c.index][1] += entry["function"]["arguments"]
    assert content == s.content
    assert [tuple(v) for v in calls.values()] == [(c.name, c.arguments) for c in s.calls]
    assert [f["id"] for f in firsts] == [t["id"] for t in s.tool_calls()]
    return content, [tuple(v) for v in calls.values()], firsts


CASES = [
    ("hermes", 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "n": [1, 2]}}\n'
               '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
     "Let me check.", [("get_weather", '{"city": "Paris", "n": [1, 2]}'), ("get_time", "{}")]),
    ("hermes", "Hello <tool_call>oops</tool_call> world", "Hello <tool_call>oops</tool_call> world", []),
    ("hermes", "a <tool", "a <tool", []),
    ("hermes", 'x <tool_call>{"arguments": {"a": "}"}, "name": "g"}</tool_call> after', "x after",
     [("g", '{"a": "}"}')]),
    ("hermes", '<tool_call>\n{"name": "f", "arguments": {"a": "cut', "", [("f", '{"a": "cut')]),
    ("hermes", '<tool_call>{"name": "f"}</tool_call>', "", [("f", "{}")]),
    ("hermes", '<tool_call>{"name": "f", "arguments": {}}\n</tool', "", [("f", "{}")]),  # cut in the close tag
    ("hermes", '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>', "", [("f", '{"a": 1}')]),
    ("hermes", '<tool_call>{"name": "f", "arguments": {"a": 1 2}}</tool_call> tail', "tail", [("f", '{"a": 1 2}')]),
    ("qwen25", '<tool_call>\n{"name": "f", "arguments": {"q": "ü"}}\n</tool_call>', "", [("f", '{"q": "ü"}')]),
    ("llama3", '{"name": "f", "parameters": {"a": 1}}; {"name": "g", "parameters": {}}', "",
     [("f", '{"a": 1}'), ("g", "{}")]),
    ("llama3", '<|python_tag|>{"name": "f", "parameters": {"a": [1]}}', "", [("f", '{"a": [1]}')]),
    ("llama3", 'Hi {"x": 1}', 'Hi {"x": 1}', []),
    ("llama3", '{"answer": 42}', '{"answer": 42}', []),
    ("llama3", 'so {"name": "f", "parameters": {"q": "z"}} more', "so more", [("f", '{"q": "z"}')]),
    ("mistral", '[TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {"b": "]"}}]', "",
     [("f", '{"a": 1}'), ("g", '{"b": "]"}')]),
    ("mistral", 'ok [TOOL_CALLS]f[ARGS]{"a": 1}[TOOL_CALLS]g[ARGS]{}', "ok", [("f", '{"a": 1}'), ("g", "{}")]),
    ("mistral", "[TOOL_CALLS] nope", "[TOOL_CALLS] nope", []),
    ("pythonic", "[get_weather(city=\"Paris\", days=3), get_time(zone='CET', x=[1,2], y=True, z=null)]", "",
     [("get_weather", '{"city": "Paris", "days": 3}'), ("get_time", '{"zone": "CET", "x": [1, 2], "y": true, "z": null}')]),
    ("pythonic", "see [1, 2] and [foo(bar)]", "see [1, 2] and [foo(bar)]", []),
    ("pythonic", 'I will [call(a="x]"), bad(1)] done', "I will done", [("call", '{"a": "x]"}')]),
    ("pythonic", '[f(a="unterminated', '[f(a="unterminated', []),
]


@pytest.mark.parametrize("parser,text,content,calls", CASES)
def test_parse_and_every_chunking_agree(parser: str, text: str, content: str, calls: list) -> None:
    assert stream(parser, text, [])[:2] == (content, calls)
    for i in range(1, len(text)):  # every single cut
        assert stream(parser, text, [i])[:2] == (content, calls), i
    rng = random.Random(0)
    for _ in range(30):  # and random chunkings, down to single characters
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, min(len(text) - 1, 12))))
        assert stream(parser, text, cuts)[:2] == (content, calls), cuts
    assert stream(parser, text, list(range(1, len(text))))[:2] == (content, calls)


def test_first_delta_of_a_call_has_id_type_name_and_empty_arguments() -> None:
    text = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call><tool_call>{"name": "g"}</tool_call>'
    _, calls, firsts = stream("hermes", text, list(range(1, len(text))))
    assert [(f["index"], f["type"], f["function"]) for f in firsts] == [
        (0, "function", {"name": "f", "arguments": ""}), (1, "function", {"name": "g", "arguments": ""})]
    assert all(f["id"].startswith("call_") and len(f["id"]) == 29 for f in firsts)
    assert firsts[0]["id"] != firsts[1]["id"]
    assert calls == [("f", '{"a": 1}'), ("g", "{}")]


def test_arguments_stream_in_fragments() -> None:
    s = ToolCallStream(create_tool_parser("hermes"))
    s.feed('<tool_call>\n{"name": "f", "arguments": {"city": "Pa')
    d = s.feed('ris", "days": 3}}\n</tool_call>')
    assert [c.arguments for c in d.calls] == ['ris", "days": 3}']
    assert s.calls[0].arguments == '{"city": "Paris", "days": 3}' and s.content == ""


def test_call_ids_are_unique() -> None:
    ids = {new_call_id() for _ in range(1000)}
    assert len(ids) == 1000 and all(i.startswith("call_") for i in ids)


def test_render_calls_round_trip_through_each_parser() -> None:
    """What a format writes into prompts (history, default rendering) parses back to the same calls."""
    calls = [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {})]
    for name in TOOL_CALL_PARSERS:
        parser = create_tool_parser(name)
        text = parser.render_calls(calls)
        content, parsed, _ = stream(name, text, [])
        assert content == "" and [(n, json.loads(a)) for n, a in parsed] == calls, (name, text)


@pytest.mark.parametrize("template,expected", [
    ("{% for m in messages %}<|im_start|>{{ m.role }}<tool_call>{% endfor %}", "qwen25"),
    ("{{ '<tool_call>' }}", "hermes"),
    ("[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS][TOOL_CALLS]", "mistral"),
    ("<|start_header_id|>ipython<|end_header_id|><|python_tag|>", "llama3"),
    ("[func_name1(params_name1=params_value1)]", "pythonic"),
    ("{% for m in messages %}{{ m.content }}{% endfor %}", None),
    (None, None),
])
def test_detect_tool_parser(template, expected) -> None:
    assert detect_tool_parser(template) == expected


def test_unknown_parser_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="hermes, qwen25, llama3, mistral, pythonic"):
        create_tool_parser("nope")
