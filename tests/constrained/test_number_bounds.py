"""Numbers the schema leaves unbounded are capped in each backend's compiled grammar: at most 16
integer digits (RFC 8259 section 6) and 6 fraction digits, no exponent; ``json_object`` too.

Values are fed byte by byte on stories260K (``<0xNN>`` tokens), so each check is about one character.
"""

from __future__ import annotations

import pytest

from radixlm.constrained import GrammarMatcher, GrammarSpec
from tests.constrained.conftest import Model, get_backend, load_model

BACKENDS = ("xgrammar", "outlines")
INTEGER = {"type": "integer"}
NUMBER = {"type": "number"}
OBJECT = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}, "required": ["n"]}
NUMBERS = {"type": "object", "properties": {"x": NUMBER, "r": {"type": "number", "minimum": 0,
                                                                "maximum": 1}},
           "required": ["x", "r"]}


def byte_token(m: Model, b: int) -> int:
    """stories260K's token for the single byte ``b``."""
    return m.tokenizer.convert_tokens_to_ids(f"<0x{b:02X}>")


def feed(m: Model, matcher: GrammarMatcher, text: str) -> int:
    """Accept ``text`` byte by byte; returns how many bytes were accepted before a rejection."""
    for i, b in enumerate(text.encode()):
        if not matcher.accept_token(byte_token(m, b)):
            return i
    return len(text.encode())


def spec(schema) -> GrammarSpec:
    """The schema's spec; None: ``json_object``."""
    return GrammarSpec.json_object() if schema is None else GrammarSpec.json_schema(schema)


# outlines-core cannot leave an accepting state for a non-accepting one (outlines_backend), so
# a fraction after a top-level number's digits is tested inside an object.
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("schema,prefix,suffix", [
    (INTEGER, "", ""), (NUMBER, "", ""), (NUMBERS, '{"x": -', '.5, "r": 0}'),
    (OBJECT, '{"n": ', "}"), (None, '{"a": [', "]}"),  # json_object
])
def test_integer_part_has_at_most_16_digits(backend: str, schema, prefix: str, suffix: str) -> None:
    m = load_model("stories")
    be = get_backend(backend, "stories")
    compiled = be.compile(spec(schema))
    ok = be.new_matcher(compiled)
    text = prefix + "9" * 16 + suffix
    assert feed(m, ok, text) == len(text) and ok.is_completed()
    long = be.new_matcher(compiled)
    assert feed(m, long, prefix + "1" * 17) == len(prefix) + 16  # the 17th digit is rejected


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("schema,prefix,suffix", [
    (NUMBERS, '{"x": 12', ', "r": 0}'), (NUMBERS, '{"x": 0, "r": 0', "}"),  # r in [0, 1]
    (None, '{"x": 3', "}"),
])
def test_fraction_has_at_most_6_digits(backend: str, schema, prefix: str, suffix: str) -> None:
    m = load_model("stories")
    be = get_backend(backend, "stories")
    compiled = be.compile(spec(schema))
    ok = be.new_matcher(compiled)
    text = prefix + ".123456" + suffix
    assert feed(m, ok, text) == len(text) and ok.is_completed()
    long = be.new_matcher(compiled)
    assert feed(m, long, prefix + ".1234567") == len(prefix) + 7
    exponent = be.new_matcher(compiled)
    assert feed(m, exponent, prefix + "e5") == len(prefix)


def test_top_level_bounded_integer_takes_all_its_digits() -> None:
    """outlines-core prefers the first regex alternative: [0, 100] once stopped after one digit."""
    m = load_model("stories")
    be = get_backend("outlines", "stories")
    compiled = be.compile(GrammarSpec.json_schema({"type": "integer", "minimum": 0, "maximum": 100}))
    for value in ("7", "42", "100"):
        matcher = be.new_matcher(compiled)
        assert feed(m, matcher, value) == len(value) and matcher.is_completed(), value
    assert feed(m, be.new_matcher(compiled), "101") == 2
