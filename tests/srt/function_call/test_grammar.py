"""Tool-call grammars: under each parser's structural tag every output parses into calls whose
arguments validate, for every mode; in auto mode free text is free until the trigger, and from the
trigger on only a whole valid call can follow. Decoding is driven by random logits (the grammar
tests' driver), so validity comes from the grammar, not from a model."""

from __future__ import annotations

import json

import jsonschema
import pytest

from radixlm.constrained import GrammarSpec
from radixlm.srt.function_call import (FunctionTool, ReasoningGrammar, ToolCallStream, create_tool_parser,
                                       tool_call_structural_tag)
from radixlm.srt.function_call.pythonic_grammar import UnsupportedSchema, kwargs_grammar
from tests.constrained.conftest import get_backend, load_model
from tests.constrained.driver import generate

WEATHER = FunctionTool("get_weather", {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                     "unit": {"enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer", "minimum": 1, "maximum": 14},
                                     "temp": {"type": "number", "minimum": -40, "maximum": 50}},
    "required": ["city", "unit"]})
TIME = FunctionTool("get_time", {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 8}},
                                 "required": ["zone"]})
NOARGS = FunctionTool("ping")
TOOLS = {t.name: t for t in (WEATHER, TIME, NOARGS)}
PARSERS = ["hermes", "llama3", "mistral", "pythonic"]


def _compile(tag: dict):
    backend = get_backend("xgrammar", "stories")
    return backend, backend.compile(GrammarSpec("structural_tag", json.dumps(tag)))


def _parse(parser: str, text: str):
    s = ToolCallStream(create_tool_parser(parser))
    s.feed(text)
    s.finish()
    return s.content, s.calls


def _check_calls(calls, names=None) -> None:
    for call in calls:
        assert call.name in (names or TOOLS), call
        jsonschema.validate(json.loads(call.arguments), TOOLS[call.name].parameters)


@pytest.mark.parametrize("parser", PARSERS)
@pytest.mark.parametrize("mode,parallel", [("named", False), ("required", False), ("required", True)])
def test_forced_modes_give_only_valid_calls(parser: str, mode: str, parallel: bool) -> None:
    model = load_model("stories")
    tools = [WEATHER] if mode == "named" else [WEATHER, TIME, NOARGS]
    tag = tool_call_structural_tag(create_tool_parser(parser), tools, mode, parallel)
    backend, compiled = _compile(tag)
    counts = set()
    for seed in range(4):
        gen = generate(backend.new_matcher(compiled), model.vocab_size, model.bias, seed, sample=True,
                       temperature=1.0, max_steps=400)
        assert gen.terminated, model.text(gen.ids)
        content, calls = _parse(parser, model.text(gen.body))
        assert content == "" and calls, model.text(gen.body)
        _check_calls(calls, ["get_weather"] if mode == "named" else None)
        counts.add(len(calls))
    if not parallel:
        assert counts == {1}


def test_parallel_required_allows_several_calls() -> None:
    """With parallel calls the grammar lets a second call follow; without, only the end."""
    parser = create_tool_parser("hermes")
    model = load_model("stories")
    two = parser.render_calls([("get_time", {"zone": "CET"}), ("ping", {})])
    for parallel, ok in ((True, True), (False, False)):
        backend, compiled = _compile(tool_call_structural_tag(parser, [WEATHER, TIME, NOARGS], "required", parallel))
        matcher = backend.new_matcher(compiled)
        ids = model.tokenizer.encode("x" + two, add_special_tokens=False)[2:]  # drop "▁x": no leading space
        assert model.text(ids) == two
        assert all(matcher.accept_token(t) for t in ids) is ok


@pytest.mark.parametrize("parser", PARSERS)
def test_auto_free_text_then_a_forced_call_after_the_trigger(parser: str) -> None:
    model = load_model("stories")
    p = create_tool_parser(parser)
    backend, compiled = _compile(tool_call_structural_tag(p, [WEATHER, TIME], "auto", parallel=False))
    plain = backend.new_matcher(compiled)
    # pythonic too: a list in prose ("[1, 2]") is text; only "[get_weather(" / "[get_time(" start a call
    text_ids = model.tokenizer.encode("Once upon a time, [x] {x} \"z\" (1) [1, 2]", add_special_tokens=False)
    assert all(plain.accept_token(t) for t in text_ids)  # any text before a call
    assert plain.accept_token(model.eos[0]) and plain.is_terminated()  # and it may end there
    for seed in range(4):
        matcher = backend.new_matcher(compiled)
        opening = p.wrapper[0] + p.call_tag(TIME)["begin"] if p.call_triggers else p.trigger  # a call's opening
        prefix = model.tokenizer.encode("Sure. " + opening, add_special_tokens=False)
        assert all(matcher.accept_token(t) for t in prefix)
        gen = generate(matcher, model.vocab_size, model.bias, seed, sample=True, temperature=1.0, max_steps=400)
        assert gen.terminated
        content, calls = _parse(parser, model.text(prefix + gen.body))
        assert content == "Sure." and len(calls) == 1, model.text(prefix + gen.body)
        _check_calls(calls, ["get_weather", "get_time"])


def test_pythonic_auto_lets_a_list_be_text_and_forces_a_started_call() -> None:
    # The trigger used to be "[": "Write a Python list of 1, 2 and 3" came back as a get_weather call.
    model = load_model("stories")
    backend, compiled = _compile(tool_call_structural_tag(create_tool_parser("pythonic"), [WEATHER, TIME], "auto", True))
    text = backend.new_matcher(compiled)
    assert all(text.accept_token(t) for t in model.tokenizer.encode("[1, 2, 3]", add_special_tokens=False))
    assert text.accept_token(model.eos[0])
    call = backend.new_matcher(compiled)
    assert all(call.accept_token(t) for t in model.tokenizer.encode("Ok [get_time(", add_special_tokens=False))
    assert not call.accept_token(model.eos[0])  # a started call must be finished
    two = backend.new_matcher(compiled)
    ids = model.tokenizer.encode('Ok [get_time(zone="UTC"), get_weather(city=', add_special_tokens=False)
    assert all(two.accept_token(t) for t in ids)  # parallel calls follow the first


def test_auto_trigger_rejects_a_half_formed_call() -> None:
    """After ``<tool_call>`` the model can neither stop nor write anything but a call."""
    model = load_model("stories")
    backend, compiled = _compile(tool_call_structural_tag(create_tool_parser("hermes"), [WEATHER], "auto", True))
    matcher = backend.new_matcher(compiled)
    assert all(matcher.accept_token(t) for t in model.tokenizer.encode("Hi <tool_call>", add_special_tokens=False))
    assert not matcher.accept_token(model.eos[0])
    bad = model.tokenizer.encode('x\n{"name": "nope"', add_special_tokens=False)[2:]
    fork = matcher.copy()
    assert not all(fork.accept_token(t) for t in bad)


def test_reasoning_block_comes_first_and_is_free() -> None:
    model = load_model("stories")
    reasoning = ReasoningGrammar("<think>", "</think>", starts_inside=True)
    tag = tool_call_structural_tag(create_tool_parser("hermes"), [TIME], "named", False, reasoning)
    backend, compiled = _compile(tag)
    assert not compiled.closes  # free reasoning text: JSON closing would be unsound
    matcher = backend.new_matcher(compiled)
    thought = model.tokenizer.encode('I "think" <tool_call> {', add_special_tokens=False)
    assert all(matcher.accept_token(t) for t in thought) and not matcher.accept_token(model.eos[0])
    rest = model.tokenizer.encode("x</think>\n\n", add_special_tokens=False)[2:]
    assert all(matcher.accept_token(t) for t in rest)
    gen = generate(matcher, model.vocab_size, model.bias, 0, max_steps=200)
    assert gen.terminated
    _, calls = _parse("hermes", model.text(gen.body))
    assert [c.name for c in calls] == ["get_time"]


def test_pythonic_grammar_bounds_numbers_exactly() -> None:
    from xgrammar import Grammar
    from xgrammar.testing import _is_grammar_accept_string

    grammar = Grammar.from_ebnf(kwargs_grammar(WEATHER.parameters))

    def ok(args: str) -> bool:
        return _is_grammar_accept_string(grammar, 'city="Oslo", unit="celsius", ' + args)

    assert all(ok(f"days={d}") for d in range(1, 15))
    assert not any(ok(f"days={d}") for d in ("0", "15", "-1", "01", "140", "1.0"))
    assert all(ok(f"temp={t}") for t in ("-40", "-40.0", "50", "50.000", "0", "-0.5", "12.25", "49.999999"))
    assert not any(ok(f"temp={t}") for t in ("-40.5", "50.01", "51", "-41", "1e3", "12.1234567"))
    exclusive = {"type": "object", "properties": {"n": {"type": "integer", "exclusiveMinimum": 0,
                                                        "exclusiveMaximum": 3.5}}}
    g = Grammar.from_ebnf(kwargs_grammar(exclusive))
    assert [n for n in range(-2, 6) if _is_grammar_accept_string(g, f"n={n}")] == [1, 2, 3]


def test_pythonic_grammar_rejects_schemas_it_cannot_express() -> None:
    with pytest.raises(UnsupportedSchema, match=r"parameters.properties.x: .*exclusiveMinimum=0"):
        kwargs_grammar({"type": "object", "properties": {"x": {"type": "number", "exclusiveMinimum": 0}}})
    with pytest.raises(UnsupportedSchema, match="empty integer range"):
        kwargs_grammar({"type": "object", "properties": {"x": {"type": "integer", "minimum": 5, "maximum": 2}}})
    with pytest.raises(UnsupportedSchema, match="pattern"):
        kwargs_grammar({"type": "object", "properties": {"a": {"type": "string", "pattern": "x"}}})
    with pytest.raises(UnsupportedSchema, match="keyword argument"):
        kwargs_grammar({"type": "object", "properties": {"not valid": {"type": "string"}}})
    assert kwargs_grammar({"type": "object", "properties": {}}).startswith('root ::= ""')


def test_forced_calls_skip_a_reasoning_block_the_prompt_did_not_open() -> None:
    """Only auto lets the model open <think> itself; forced calls come at once and close in time."""
    reasoning = ReasoningGrammar("<think>", "</think>", starts_inside=False)
    parser = create_tool_parser("hermes")
    forced = tool_call_structural_tag(parser, [TIME], "required", False, reasoning)
    assert forced == tool_call_structural_tag(parser, [TIME], "required", False)
    assert _compile(forced)[1].closes
    auto = tool_call_structural_tag(parser, [TIME], "auto", False, reasoning)
    assert auto["format"]["elements"][0] == {"type": "optional", "content": {
        "type": "tag", "begin": "<think>", "content": {"type": "any_text"}, "end": "</think>"}}
