"""JSON-schema constrained decoding: every finished output parses and validates (jsonschema).

22 schemas x {xgrammar, outlines} x {greedy, sampled} on SmolLM2's byte-level BPE vocabulary, plus
the same suite on stories260K's byte-fallback vocabulary, driven by seeded random logits.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from radixlm.constrained import GrammarSpec
from tests.constrained.conftest import get_backend, load_model
from tests.constrained.driver import generate
from tests.constrained.schemas import SCHEMAS

BACKENDS = ("xgrammar", "outlines")
MAX_STEPS = 256


def _check_outputs(backend: str, model: str, name: str, seeds: range) -> None:
    m = load_model(model)
    be = get_backend(backend, model)
    schema = SCHEMAS[name]
    compiled = be.compile(GrammarSpec.json_schema(schema))
    for sample in (False, True):
        for seed in seeds:
            out = generate(be.new_matcher(compiled), m.vocab_size, m.bias, seed, sample=sample,
                           max_steps=MAX_STEPS)
            text = m.text(out.body)
            where = f"{backend}/{model}/{name} sample={sample} seed={seed}: {text!r}"
            assert out.terminated, f"hit max_steps: {where}"
            assert out.allowed_after == list(m.eos), where
            jsonschema.validate(json.loads(text), schema)
            assert "\ufffd" not in text, where
            # Compact whitespace: never two blanks in a row outside strings.
            assert not re.search(r"\s{2,}", re.sub(r'"(\\.|[^"\\])*"', '""', text)), where


@pytest.mark.parametrize("name", sorted(SCHEMAS))
@pytest.mark.parametrize("backend", BACKENDS)
def test_schema_outputs_validate_smollm2(backend: str, name: str) -> None:
    _check_outputs(backend, "smollm2", name, range(2))


@pytest.mark.parametrize("backend", BACKENDS)
def test_schema_outputs_validate_stories(backend: str) -> None:
    for name in SCHEMAS:
        _check_outputs(backend, "stories", name, range(2))


def test_schema_suite_is_large_enough() -> None:
    assert len(SCHEMAS) >= 20


@pytest.mark.parametrize("backend", BACKENDS)
def test_json_object_and_any_key(backend: str) -> None:
    m = load_model("smollm2")
    be = get_backend(backend, "smollm2")
    assert GrammarSpec.json_schema("$$ANY$$") == GrammarSpec.json_object()
    assert GrammarSpec.json_schema('{"type": "object"}') == GrammarSpec.json_object()
    compiled = be.compile(GrammarSpec.json_object())
    for seed in range(4):
        out = generate(be.new_matcher(compiled), m.vocab_size, m.bias, seed, sample=True)
        assert out.terminated
        assert isinstance(json.loads(m.text(out.body)), dict)


@pytest.mark.parametrize("backend", BACKENDS)
def test_any_whitespace_flag(backend: str) -> None:
    """any_whitespace=True lets the model put newlines/indentation between JSON tokens."""
    m = load_model("stories")
    schema = SCHEMAS["flat_object"]
    spec = GrammarSpec.json_schema(schema)
    byte = {c: m.tokenizer.convert_tokens_to_ids(f"<0x{ord(c):02X}>") for c in '{\n "'}
    flexible = get_backend(backend, "stories", any_whitespace=True)
    matcher = flexible.new_matcher(flexible.compile(spec))
    assert all(matcher.accept_token(byte[c]) for c in '{\n  "')
    compact = get_backend(backend, "stories")
    matcher = compact.new_matcher(compact.compile(spec))
    assert matcher.accept_token(byte["{"])
    assert not matcher.accept_token(byte["\n"])
    out = generate(flexible.new_matcher(flexible.compile(spec)), m.vocab_size, m.bias, 0)
    jsonschema.validate(json.loads(m.text(out.body)), schema)
