"""Regex (both backends, both tokenizers) and EBNF (xgrammar) constrained decoding."""

from __future__ import annotations

import re

import pytest

from radixlm.constrained import GrammarError, GrammarSpec
from radixlm.constrained.vocab import decode_bytes
from tests.constrained.conftest import get_backend, load_model
from tests.constrained.driver import generate

REGEXES = {
    "email": r"[a-z0-9._]{1,12}@[a-z0-9]{1,10}\.(com|org|net)",
    "iso_date": r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])",
    "ipv4": r"((25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])",
    "phone": r"\+1 \([0-9]{3}\) [0-9]{3}-[0-9]{4}",
    "hex_colour": r"#[0-9a-fA-F]{6}",
    "words": r"(apple|banana|cherry|date)( (apple|banana|cherry|date)){0,3}",
    "unicode_literal": "café 世界 🙂",
    "unicode_class": r"[αβγ]{2,4}[月日]",
}
BACKENDS = ("xgrammar", "outlines")
MODELS = ("smollm2", "stories")


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(REGEXES))
def test_regex_outputs_fully_match(backend: str, model: str, name: str) -> None:
    m = load_model(model)
    be = get_backend(backend, model)
    pattern = REGEXES[name]
    compiled = be.compile(GrammarSpec("regex", pattern))
    for sample in (False, True):
        for seed in range(3):
            out = generate(be.new_matcher(compiled), m.vocab_size, m.bias, seed, sample=sample)
            assert out.terminated
            assert out.allowed_after == list(m.eos)
            raw = decode_bytes(m.table, out.body)
            text = raw.decode("utf-8")  # strict: a split multi-byte character would raise
            assert re.fullmatch(pattern, text), (text, pattern)
            assert m.text(out.body) == text  # the tokenizer's own decode agrees
            assert "\ufffd" not in text


def test_literal_regex_streams_without_replacement_at_character_boundaries() -> None:
    """Byte-fallback (stories260K): each emoji/CJK byte is its own token; the incremental text
    only ever lacks a character's tail, never contains U+FFFD in its completed part."""
    m = load_model("stories")
    be = get_backend("xgrammar", "stories")
    out = generate(be.new_matcher(be.compile(GrammarSpec("regex", "café 世界 🙂"))), m.vocab_size,
                   m.bias, 0)
    assert len(out.body) > len("café 世界 🙂")  # byte tokens were needed
    for i in range(1, len(out.body) + 1):
        prefix = decode_bytes(m.table, out.body[:i]).decode("utf-8", errors="ignore")
        assert "café 世界 🙂".startswith(prefix)


ARITHMETIC = r'''
root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= number | "(" expr ")"
number ::= [1-9] [0-9]{0,2}
'''

JSON_LIKE = r'''
root ::= object
value ::= object | array | string | number | ("true" | "false" | "null")
object ::= "{" ( pair ( ", " pair )* )? "}"
pair ::= string ": " value
array ::= "[" ( value ( ", " value )* )? "]"
string ::= "\"" [a-z ]{0,12} "\""
number ::= "-"? [0-9]{1,4}
'''


def _arith_ok(text: str) -> bool:
    if not re.fullmatch(r"[0-9+\-*/() ]+", text):
        return False
    try:
        eval(compile(text, "<expr>", "eval"), {"__builtins__": {}})  # noqa: S307 - digits/ops only
    except ZeroDivisionError:
        return True
    except SyntaxError:
        return False
    return True


@pytest.mark.parametrize("model", MODELS)
def test_ebnf_arithmetic(model: str) -> None:
    m = load_model(model)
    be = get_backend("xgrammar", model)
    compiled = be.compile(GrammarSpec("ebnf", ARITHMETIC))
    for sample in (False, True):
        for seed in range(4):
            out = generate(be.new_matcher(compiled), m.vocab_size, m.bias, seed, sample=sample)
            text = m.text(out.body)
            assert out.terminated and _arith_ok(text), text


@pytest.mark.parametrize("model", MODELS)
def test_ebnf_json_like(model: str) -> None:
    import json

    m = load_model(model)
    be = get_backend("xgrammar", model)
    compiled = be.compile(GrammarSpec("ebnf", JSON_LIKE))
    for sample in (False, True):
        for seed in range(4):
            out = generate(be.new_matcher(compiled), m.vocab_size, m.bias, seed, sample=sample)
            assert out.terminated
            assert isinstance(json.loads(m.text(out.body)), dict)


def test_ebnf_unsupported_on_outlines() -> None:
    be = get_backend("outlines", "stories")
    with pytest.raises(GrammarError, match="EBNF is not supported by the outlines backend"):
        be.compile(GrammarSpec("ebnf", ARITHMETIC))
