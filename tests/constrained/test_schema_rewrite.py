"""Schema rewrites: integer/number range regexes (exhaustive), the xgrammar string patch, and the
outlines placeholder splice; plus ``import radixlm.constrained`` staying light."""

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
