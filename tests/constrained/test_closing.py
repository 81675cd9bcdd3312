"""JSON output closes in time (``constrained.closing``): a string closes after
``MAX_STRING_CHARS`` characters, and the whole document closes when the token budget runs low,
narrowing the mask to closing tokens and, where the grammar allows none, to the closing path.

Strings are fed byte by byte on stories260K (``<0xNN>`` tokens).
"""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from radixlm.constrained import GrammarMatcher, GrammarSpec, allocate_bitmask, fill_batch_bitmask
from radixlm.constrained.base import bitmask_to_bool
from radixlm.constrained.closing import (
    CLOSE_MARGIN,
    MAX_STRING_CHARS,
    JsonLexer,
    LexState,
    advance,
)
from tests.constrained.conftest import Model, get_backend, load_model
from tests.constrained.driver import generate, token_bias
from tests.constrained.schemas import SCHEMAS
from tests.constrained.test_number_bounds import byte_token, feed, spec

BACKENDS = ("xgrammar", "outlines")
BUDGET = 96


def _allowed(m: Model, matcher: GrammarMatcher, tokens_left=None) -> torch.Tensor:
    bm = allocate_bitmask(1, m.vocab_size)
    matcher.fill_bitmask(bm, 0, tokens_left)
    return bitmask_to_bool(bm, m.vocab_size)[0]


def test_lexer_follows_strings_escapes_and_depth() -> None:
    assert advance(LexState(), b'{"a": [1, {"b": "x') == LexState(3, True, False, 1)
    assert advance(LexState(), b'{"k": "a\\"}]') == LexState(1, True, False, 4)  # escape: one
    assert advance(LexState(), b'["\\') == LexState(1, True, True, 1)
    assert advance(LexState(), '{"é世🙂"'.encode()) == LexState(1, False, False, 3)
    assert advance(LexState(), b'{"a": "}"}') == LexState(0, False, False, 1)
    lexer = JsonLexer()
    for piece in (b'{"', b"ab", b'"'):
        lexer.push(piece)
    copy = lexer.copy()
    lexer.pop(1)
    assert lexer.state == LexState(1, True, False, 2) and copy.state == LexState(1, False, False, 2)
    lexer.reset()
    assert lexer.state == LexState()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("schema,prefix", [
    ({"type": "string"}, '"'),
    ({"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]}, '{"s": "'),
    (None, '{"'),  # a key of any JSON object
    (None, '{"k": ["'),
])
def test_free_string_closes_after_max_chars(backend: str, schema, prefix: str) -> None:
    m = load_model("stories")
    be = get_backend(backend, "stories")
    matcher = be.new_matcher(be.compile(spec(schema)))
    a, quote = byte_token(m, ord("a")), byte_token(m, ord('"'))
    assert feed(m, matcher, prefix + "a" * (MAX_STRING_CHARS - 1)) > 0
    allowed = _allowed(m, matcher)
    assert allowed[a] and allowed[quote]
    assert matcher.accept_token(a)
    allowed = _allowed(m, matcher)
    assert allowed[quote] and not allowed[a]  # only closing tokens now
    for t in allowed.nonzero().flatten().tolist():  # a quote, then nothing but brackets
        raw = m.table[t]
        assert t in m.eos or (raw[:1] == b'"' and set(raw[1:]) <= set(b"}]")), raw
    twin = matcher.copy()
    matcher.rollback(1)
    assert _allowed(m, matcher)[a] and not _allowed(m, twin)[a]  # rollback and copy follow
    matcher.reset()
    assert feed(m, matcher, prefix) == len(prefix.encode()) and _allowed(m, matcher)[a]


@pytest.mark.parametrize("backend", BACKENDS)
def test_closing_never_widens_the_grammar(backend: str) -> None:
    """Where the grammar allows no closing token (minLength not met, a pattern's next character),
    a long string's row is the grammar's own, and a low budget's is one token of it (the
    closing path's next)."""
    m = load_model("stories")
    be = get_backend(backend, "stories")
    long = {"type": "string", "minLength": 300} if backend == "xgrammar" else {
        "type": "string", "pattern": "^a{2}[0-9]$"}
    matcher = be.new_matcher(be.compile(GrammarSpec.json_schema(long)))
    text = '"' + "a" * (MAX_STRING_CHARS + 1 if backend == "xgrammar" else 2)
    assert feed(m, matcher, text) == len(text)
    grammar = _allowed(m, matcher)
    assert not grammar[byte_token(m, ord('"'))] and int(grammar.sum()) > 1
    assert torch.equal(_allowed(m, matcher, tokens_left=None), grammar)
    forced = _allowed(m, matcher, tokens_left=1)
    assert int(forced.sum()) == 1 and bool(grammar[forced].all())


@pytest.mark.parametrize("backend", BACKENDS)
def test_low_budget_narrows_to_closing_tokens(backend: str) -> None:
    m = load_model("smollm2")
    be = get_backend(backend, "smollm2")
    compiled = be.compile(GrammarSpec.json_schema(SCHEMAS["optional_fields"]))
    assert 0 < compiled.closing_tokens < 40
    matcher = be.new_matcher(compiled)
    assert matcher.close_reserve == compiled.closing_tokens + CLOSE_MARGIN
    for tid in m.tokenizer.encode('{"title": "A long story about', add_special_tokens=False):
        assert matcher.accept_token(tid)
    free = _allowed(m, matcher, tokens_left=matcher.close_reserve + 2)  # depth 1: not yet
    assert torch.equal(free, _allowed(m, matcher))
    closing = _allowed(m, matcher, tokens_left=matcher.close_reserve + 1)
    texts = {m.table[t] for t in closing.nonzero().flatten().tolist()}
    assert b'"' in texts and b'"}' in texts and texts <= {b'"', b'"}', b'"}}', b'"]', b'"]}'}
    regex = be.new_matcher(be.compile(GrammarSpec("regex", "[a-z]+")))
    assert regex.accept_token(m.tokenizer.convert_tokens_to_ids("ab"))
    assert torch.equal(_allowed(m, regex, tokens_left=1), _allowed(m, regex))  # not JSON: as is


@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_bitmask_closes_only_rows_low_on_budget(backend: str) -> None:
    m = load_model("smollm2")
    be = get_backend(backend, "smollm2")
    compiled = be.compile(GrammarSpec.json_schema(SCHEMAS["optional_fields"]))
    prefix = m.tokenizer.encode('{"title": "A story', add_special_tokens=False)
    rows = [be.new_matcher(compiled) for _ in range(3)]
    for matcher in rows:
        assert all(matcher.accept_token(t) for t in prefix)
    free = _allowed(m, rows[0])
    bm = fill_batch_bitmask(rows, m.vocab_size, [None, 500, 2])
    assert bm is not None
    allowed = bitmask_to_bool(bm, m.vocab_size)
    assert torch.equal(allowed[0], free) and torch.equal(allowed[1], free)
    assert bool(allowed[2, m.tokenizer.convert_tokens_to_ids('"')]) and allowed[2].sum() < 10


@pytest.mark.parametrize("model", ("smollm2", "stories"))
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_schema_closes_within_budget(backend: str, model: str) -> None:
    """Logits that avoid closing (closers and EOS penalised, so strings and arrays run on) still
    give a complete, schema-valid document within ``max_new_tokens`` for every suite schema."""
    m = load_model(model)
    be = get_backend(backend, model)
    bias = token_bias(m.table, m.eos, m.vocab_size, closer_boost=-3.0, eos_boost=-3.0)
    for name, schema in list(SCHEMAS.items()) + [("json_object", None)]:
        compiled = be.compile(spec(schema))
        for seed in range(2):
            out = generate(be.new_matcher(compiled), m.vocab_size, bias, seed, sample=True,
                           temperature=1.0, budget=BUDGET)
            text = m.text(out.body)
            assert out.terminated, f"{backend}/{model}/{name} seed={seed} cut: {text!r}"
            jsonschema.validate(json.loads(text), schema if schema is not None else {"type": "object"})


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"to": {"type": "string", "format": "email"}}, "required": ["to"]},
    {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}, "minItems": 1000}},
     "required": ["a"]},
])
def test_no_closing_path_means_no_budget_closing_and_no_search(schema, monkeypatch) -> None:
    # Where the closing heuristic finds no path from the start (an email's pattern, 1,000 required
    # items), a low budget used to search again on every token (up to 17 masks per token of a
    # 1,024-token path: ~1.7 s a token, stalling every request of the batch). Such grammars now
    # only close long strings, and a path search that fails is not repeated.
    from radixlm.constrained import base
    from radixlm.constrained.closing import MAX_CLOSING_PATH

    m = load_model("smollm2")
    be = get_backend("xgrammar", "smollm2")
    compiled = be.compile(GrammarSpec.json_schema(json.dumps(schema)))
    assert compiled.closing_tokens == MAX_CLOSING_PATH
    calls = []
    monkeypatch.setattr(base, "closing_path", lambda *a, **k: calls.append(k) or None)
    matcher = be.new_matcher(compiled)
    gen = generate(matcher, m.vocab_size, m.bias, 0, sample=True, temperature=1.0, max_steps=20, budget=20)
    assert len(gen.ids) == 20 and calls == []
    # A grammar that does close, whose path from a later state is not found: one search, not one a token.
    closable = be.new_matcher(be.compile(GrammarSpec.json_schema(SCHEMAS["optional_fields"])))
    for tid in m.tokenizer.encode('{"title":', add_special_tokens=False):
        assert closable.accept_token(tid)
    for _ in range(3):
        _allowed(m, closable, tokens_left=closable.close_reserve)
    allowed = _allowed(m, closable).nonzero().flatten().tolist()
    assert closable.accept_token(allowed[0])
    _allowed(m, closable, tokens_left=closable.close_reserve)
    assert [c["limit"] for c in calls] == [closable.close_reserve + 1]  # + depth 1
