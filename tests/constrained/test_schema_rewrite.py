"""Schema rewrites: integer/number range regexes (exhaustive), the xgrammar string patch, the
number bounds, and the outlines placeholder splice; plus ``import radixlm.constrained`` staying
light."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from typing import Any

import pytest

from radixlm.constrained import GrammarError
from radixlm.constrained.schema_rewrite import (
    ANY_OBJECT_SCHEMA,
    bound_number,
    digits_limit,
    integer_range_regex,
    number_range_regex,
    patch_xgrammar_schema,
    prepare_outlines_schema,
    splice_regex,
)

RANGES = [(0, 100), (-50, -10), (6, 8), (None, 5), (3, None), (None, -3), (-7, None), (0, 0),
          (-1, 1), (1, 1), (123, 98765), (None, None), (0, None), (-1000, 999), (10, 10), (9, 10)]


def test_integer_range_regex_exhaustive() -> None:
    rng = random.Random(0)
    cases = RANGES + [(a, a + rng.choice([0, 3, 40, 4000])) for a in
                      (rng.randint(-3000, 3000) for _ in range(40))]
    for lo, hi in cases:
        rx = re.compile(integer_range_regex(lo, hi))
        for x in range(-11000, 11000):
            inside = (lo is None or x >= lo) and (hi is None or x <= hi)
            assert bool(rx.fullmatch(str(x))) == inside, (lo, hi, x)
        assert not rx.fullmatch("-0") and not rx.fullmatch("007")
    with pytest.raises(GrammarError):
        integer_range_regex(3, 2)


def test_number_range_regex_sound_and_complete() -> None:
    rng = random.Random(1)
    for lo, hi in [(0, 1), (-5, 3), (2, 7), (None, 4), (-3, None), (-9, -2), (0, 0)]:
        rx = re.compile(number_range_regex(lo, hi))
        for _ in range(3000):
            text = f"{rng.uniform(-12, 12):.{rng.choice([0, 1, 3])}f}"
            value = float(text)
            inside = (lo is None or value >= lo) and (hi is None or value <= hi)
            if text.startswith("-") and value == 0:
                continue  # "-0.0": either answer is a valid JSON number equal to 0
            assert bool(rx.fullmatch(text)) == inside, (lo, hi, text)


def test_xgrammar_patch_only_touches_bounded_strings() -> None:
    schema: dict[str, Any] = {"type": "object", "properties": {
        "a": {"type": "string", "minLength": 2, "maxLength": 5},
        "b": {"type": "string", "maxLength": 10000},  # too large for the regex path: kept
        "c": {"type": "string", "minLength": 1, "pattern": "^x+$"},
        "d": {"const": {"type": "string", "minLength": 1}},  # data, not a schema
    }}
    patched = json.loads(patch_xgrammar_schema(json.dumps(schema)))
    assert patched["properties"]["a"] == {"type": "string", "pattern": "^[\\s\\S]{2,5}$"}
    for key in "bcd":
        assert patched["properties"][key] == schema["properties"][key]
    assert patch_xgrammar_schema("INVALID") == "INVALID"
    plain = '{"type": "string"}'
    assert patch_xgrammar_schema(plain) is plain


LIMIT = 10 ** 16


@pytest.mark.parametrize("node,added", [
    ({"type": "integer"}, {"exclusiveMinimum": -LIMIT, "exclusiveMaximum": LIMIT}),
    ({"type": "number"}, {"exclusiveMinimum": -LIMIT, "exclusiveMaximum": LIMIT}),
    ({"type": "integer", "minimum": 1}, {"exclusiveMaximum": LIMIT}),
    ({"type": "number", "exclusiveMinimum": -2.5}, {"exclusiveMaximum": LIMIT}),
    ({"type": "integer", "maximum": -3}, {"exclusiveMinimum": -LIMIT}),
    ({"type": "number", "maximum": 7.5}, {"exclusiveMinimum": -LIMIT}),
    # A one-sided bound with more digits keeps its digit count on the open side.
    ({"type": "integer", "minimum": 10 ** 20}, {"exclusiveMaximum": 10 ** 21}),
    ({"type": "integer", "maximum": -(10 ** 20)}, {"exclusiveMinimum": -(10 ** 21)}),
    ({"type": "integer", "minimum": -(10 ** 20)}, {"exclusiveMaximum": LIMIT}),
])
def test_bound_number_fills_the_open_sides(node: dict[str, Any], added: dict[str, Any]) -> None:
    assert bound_number(node) == {**node, **added}


@pytest.mark.parametrize("node", [
    {"type": "integer", "minimum": 0, "maximum": 5},
    {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    {"type": "integer", "enum": [1, 2]},
    {"type": "number", "const": 3},
    {"type": ["integer", "null"]},
    {"type": "number", "minimum": 0, "exclusiveMinimum": True},  # draft 4: left to the backend
    {"type": "string"},
])
def test_bound_number_leaves_bounded_and_other_schemas(node: dict[str, Any]) -> None:
    assert bound_number(node) == node


def test_xgrammar_patch_bounds_numbers_everywhere() -> None:
    schema: dict[str, Any] = {
        "$defs": {"n": {"type": "number"}},
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"$ref": "#/$defs/n"},
                       "c": {"type": "array", "items": {"type": "integer", "minimum": 0}},
                       "d": {"anyOf": [{"type": "number"}, {"type": "string"}]},
                       "e": {"type": "integer", "minimum": 0, "maximum": 9}},
    }
    patched = json.loads(patch_xgrammar_schema(json.dumps(schema)))
    both = {"exclusiveMinimum": -LIMIT, "exclusiveMaximum": LIMIT}
    assert patched["$defs"]["n"] == {"type": "number", **both}
    props = patched["properties"]
    assert props["a"] == {"type": "integer", **both}
    assert props["b"] == {"$ref": "#/$defs/n"}
    assert props["c"]["items"] == {"type": "integer", "minimum": 0, "exclusiveMaximum": LIMIT}
    assert props["d"]["anyOf"] == [{"type": "number", **both}, {"type": "string"}]
    assert props["e"] == schema["properties"]["e"]
    any_object = json.loads(patch_xgrammar_schema(json.dumps(ANY_OBJECT_SCHEMA)))
    assert {"type": "number", **both} in any_object["$defs"]["value"]["anyOf"]


def test_open_range_regexes_cap_digits() -> None:
    assert digits_limit(0) == LIMIT and digits_limit(-123.5) == LIMIT
    assert digits_limit(10 ** 17) == 10 ** 18
    integer = re.compile(integer_range_regex(None, None))
    number = re.compile(number_range_regex(None, None))
    for rx in (integer, number):
        assert rx.fullmatch("9" * 16) and rx.fullmatch("-" + "9" * 16) and rx.fullmatch("0")
        assert not rx.fullmatch("1" + "0" * 16) and not rx.fullmatch("-" + "1" * 17)
    assert number.fullmatch("-12.123456") and not number.fullmatch("12.1234567")
    assert not number.fullmatch("1e5") and not integer.fullmatch("1.5")
    assert re.fullmatch(integer_range_regex(3, None), "9" * 16)
    assert not re.fullmatch(integer_range_regex(3, None), "1" * 17)
    wide = re.compile(integer_range_regex(10 ** 20, None))
    assert wide.fullmatch("9" * 21) and not wide.fullmatch("1" * 22)
    bounded = re.compile(number_range_regex(0, 1))  # bounded numbers: fraction capped too
    assert bounded.fullmatch("0.333333") and not bounded.fullmatch("0.3333333")
    assert bounded.fullmatch("1.000000") and not bounded.fullmatch("1.0000000")


def test_outlines_unbounded_numbers_become_placeholders() -> None:
    schema = {"type": "object", "properties": {"i": {"type": "integer"}, "n": {"type": "number"},
                                               "e": {"type": "integer", "enum": [1, 2]}}}
    text, splices = prepare_outlines_schema(json.dumps(schema))
    props = json.loads(text)["properties"]
    assert set(splices.values()) == {integer_range_regex(None, None), number_range_regex(None, None)}
    assert props["e"] == schema["properties"]["e"] and "const" in props["i"] and "const" in props["n"]


def test_outlines_placeholders_splice_into_the_regex() -> None:
    from outlines_core.json_schema import build_regex_from_schema

    schema = {"$defs": {"age": {"type": "integer", "minimum": 0, "maximum": 120},
                        "unused": {"type": "integer", "minimum": 1}},
              "type": "object",
              "properties": {"a": {"$ref": "#/$defs/age"}, "b": {"$ref": "#/$defs/age"},
                             "r": {"type": "number", "minimum": 0, "maximum": 1}},
              "required": ["a", "b", "r"]}
    text, splices = prepare_outlines_schema(json.dumps(schema))
    assert len(splices) == 3
    regex = splice_regex(build_regex_from_schema(text, r"[ ]?"), splices)
    assert "__radixlm_bound_" not in regex
    rx = re.compile(regex)
    assert rx.fullmatch('{"a":7, "b":120, "r":0.25}')
    assert not rx.fullmatch('{"a":7, "b":121, "r":0.25}')
    assert not rx.fullmatch('{"a":-1, "b":1, "r":0.25}')
    assert not rx.fullmatch('{"a":1, "b":1, "r":1.5}')
    with pytest.raises(GrammarError, match="uniqueItems"):
        prepare_outlines_schema('{"type": "array", "uniqueItems": true}')
    assert prepare_outlines_schema('{"type": "array", "uniqueItems": false}')[1] == {}


def test_import_is_light() -> None:
    code = ("import sys, radixlm.constrained, radixlm.constrained.cache; "
            "print(sorted(m for m in ('torch', 'xgrammar', 'outlines_core') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("bounds,admits", [
    ({"exclusiveMinimum": 0, "exclusiveMaximum": 1e-9}, False),  # was lowered to an empty value: {"n": }
    ({"minimum": 1e-9, "maximum": 2e-9}, False),
    ({"exclusiveMinimum": 0, "exclusiveMaximum": 0.000001}, False),
    ({"exclusiveMinimum": 0, "exclusiveMaximum": 0.000002}, True),  # 0.000001
    ({"minimum": 0.5, "maximum": 0.5}, True),
    ({"minimum": 0.1234565, "maximum": 0.1234569}, False),
    ({"minimum": 0.1234565, "maximum": 0.123457}, True),
    ({"exclusiveMinimum": 0}, True),
    ({"minimum": 1e300}, True),  # many integer digits, but writable (the bound keeps its digit count)
])
def test_number_ranges_the_grammar_cannot_write_are_errors(bounds, admits):
    _check_range({"type": "object", "properties": {"n": {"type": "number", **bounds}}}, admits,
                 "no number of at most 6 fraction digits")


@pytest.mark.parametrize("bounds,admits", [
    ({"minimum": 1.2, "maximum": 1.8}, False), ({"exclusiveMinimum": 1, "exclusiveMaximum": 2}, False),
    ({"minimum": 3, "maximum": 2}, False), ({"minimum": 1.2, "maximum": 2}, True),
    ({"exclusiveMinimum": 1, "exclusiveMaximum": 3}, True),
])
def test_integer_ranges_without_an_integer_are_errors(bounds, admits):
    _check_range({"type": "integer", **bounds}, admits, "no integer lies within")


def _check_range(schema: dict[str, Any], admits: bool, error: str) -> None:
    if admits:
        patch_xgrammar_schema(json.dumps(schema))
    else:
        with pytest.raises(GrammarError, match=error):
            patch_xgrammar_schema(json.dumps(schema))


@pytest.mark.parametrize("schema,fragment", [
    ({"type": "array", "items": {"enum": [1, 2]}, "uniqueItems": True}, "'uniqueItems'"),
    ({"type": "integer", "multipleOf": 7}, "'multipleOf'"),
    ({"allOf": [{"type": "object"}, {"required": ["b"]}]}, "'allOf' of several schemas"),
    ({"type": "object", "properties": {"a": {"type": "string"}}, "if": {"required": ["a"]},
      "then": {"required": ["b"]}}, "'if'"),
    ({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}, "'not'"),
    ({"type": "array", "contains": {"const": 5}}, "'contains'"),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "dependentRequired": {"a": ["b"]}},
     "'dependentRequired'"),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "ghost"]},
     "required names ['ghost']"),
])
def test_keywords_xgrammar_would_ignore_are_refused(schema, fragment):
    # xgrammar compiles these and ignores them: sampled outputs violated each (uniqueItems [1, 1],
    # a missing required "ghost", ...), where every output is promised to validate.
    with pytest.raises(GrammarError, match=re.escape(fragment)):
        patch_xgrammar_schema(json.dumps({"type": "object", "properties": {"x": schema}, "required": ["x"]}))


@pytest.mark.parametrize("schema", [
    {"type": "array", "uniqueItems": False}, {"type": "integer", "multipleOf": 1},
    {"allOf": [{"$ref": "#/$defs/a"}]}, {"type": "object", "properties": {"a": {}}, "required": ["a"]},
])
def test_neutral_uses_of_those_keywords_pass(schema):
    patch_xgrammar_schema(json.dumps({"$defs": {"a": {"type": "string"}}, **schema}))
