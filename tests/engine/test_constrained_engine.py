"""Grammar-constrained decoding through the engine: outputs parse and validate, constrained and
unconstrained requests mix in one batch without changing the unconstrained tokens, the grammar cache
compiles once, and bad grammars are clean errors."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from radixlm.managers.validation import InvalidRequestError
from radixlm.srt.engine import Engine
from tests.engine.test_greedy_vs_hf import assert_clean

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module", params=["xgrammar", "outlines"])
def engine(request, stories_path):
    return Engine(stories_path, dtype="float32", max_total_tokens=4096, grammar_backend=request.param, chunked_prefill_size=8)


def test_json_schema_greedy_and_sampled(engine):
    sps = [{"temperature": 0, "max_new_tokens": 64, "json_schema": json.dumps(SCHEMA)},
           {"temperature": 1.0, "max_new_tokens": 64, "json_schema": json.dumps(SCHEMA), "sampling_seed": 3}]
    for out in engine.generate(["Tom is a boy. Tom", "Once upon a time"], sps):
        assert out["meta_info"]["finish_reason"]["type"] == "stop", out
        jsonschema.validate(json.loads(out["text"]), SCHEMA)
    assert_clean(engine)


def test_regex_with_non_ascii_literal(engine):
    out = engine.generate("Lily said", {"temperature": 0, "max_new_tokens": 40, "regex": "(yes|no), café 世界 🙂"})
    assert re.fullmatch("(yes|no), café 世界 🙂", out["text"]), out["text"]
    assert "\ufffd" not in out["text"]
    assert_clean(engine)


def test_mixed_batch_leaves_unconstrained_rows_unchanged(engine):
    plain = {"temperature": 0, "max_new_tokens": 16}
    alone = engine.generate(["The cat", "Sara had a red ball"], plain)
    mixed = engine.generate(["The cat", "Ben said", "Sara had a red ball"],
                            [plain, {"temperature": 0, "max_new_tokens": 20, "regex": r"[0-9]{3}-[0-9]{4}"}, plain])
    assert [mixed[0]["output_ids"], mixed[2]["output_ids"]] == [a["output_ids"] for a in alone]
    assert re.fullmatch(r"[0-9]{3}-[0-9]{4}", mixed[1]["text"])
    assert_clean(engine)


def test_grammar_cache_compiles_once(engine):
    sp = {"temperature": 0, "max_new_tokens": 8, "regex": "(red|green|blue)"}
    before = engine.scheduler.internal_state().num_grammar_compiles
    engine.generate("Color:", sp)
    engine.generate("Another color:", sp)
    assert engine.scheduler.internal_state().num_grammar_compiles == before + 1
    assert_clean(engine)


@pytest.mark.parametrize("sp,fragment", [
    ({"json_schema": "{not json"}, ""),
    ({"regex": "(unclosed"}, ""),
    ({"regex": "a", "json_schema": "{}"}, "only one"),
])
def test_bad_grammar_is_a_clean_error(engine, sp, fragment):
    sp = {"max_new_tokens": 8, **sp}
    try:
        out = engine.generate("Hi", sp)
    except InvalidRequestError as e:
        assert fragment in str(e)
    else:
        fr = out["meta_info"]["finish_reason"]
        assert fr["type"] == "abort" and fr["status_code"] == 400 and fr["message"]
    assert engine.generate("Lily", {"temperature": 0, "max_new_tokens": 4})["meta_info"]["completion_tokens"] == 4
    assert_clean(engine)
