"""Structural tags (xgrammar): kind plumbing, lowering of JSON contents, closing in time."""

from __future__ import annotations

import json

import jsonschema
import pytest

from radixlm.constrained import GrammarError, GrammarSpec
from radixlm.constrained.structural_tag import closes_in_time, map_formats
from radixlm.constrained.xgrammar_backend import lower_structural_tag
from radixlm.srt.sampling_params import SamplingParams, SamplingParamsError
from tests.constrained.conftest import get_backend, load_model
from tests.constrained.driver import generate

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
          "required": ["city", "days"]}
BEGIN, END = '<tool_call>\n{"name": "weather", "arguments": ', "}\n</tool_call>"


def _calls_tag(parallel: bool) -> dict:
    call = {"type": "tag", "begin": BEGIN, "content": {"type": "json_schema", "json_schema": SCHEMA}, "end": END}
    return {"type": "structural_tag", "format": {"type": "tags_with_separator", "tags": [call], "separator": "\n",
                                                 "at_least_one": True, "stop_after_first": not parallel}}


def _free_text_tag() -> dict:
    call = {"type": "tag", "begin": BEGIN, "content": {"type": "json_schema", "json_schema": SCHEMA}, "end": END}
    return {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": ["<tool_call>"], "tags": [call]}}


def test_spec_and_sampling_params_carry_structural_tags() -> None:
    params = SamplingParams.from_dict({"structural_tag": _calls_tag(False)})
    assert json.loads(params.structural_tag) == _calls_tag(False)  # an object is kept as JSON text
    spec = GrammarSpec.from_sampling_params(params)
    assert spec == GrammarSpec("structural_tag", params.structural_tag)
    with pytest.raises(SamplingParamsError, match="only one of"):
        SamplingParams.from_dict({"structural_tag": "{}", "regex": "a"}).verify(512)


def test_closes_in_time_only_without_free_text() -> None:
    assert closes_in_time(json.dumps(_calls_tag(True)))
    assert not closes_in_time(json.dumps(_free_text_tag()))
    unbalanced = _calls_tag(True)
    unbalanced["format"]["separator"] = '"'
    assert not closes_in_time(json.dumps(unbalanced))
    assert not closes_in_time("not json")


def test_map_formats_visits_every_child() -> None:
    seen: list[str] = []
    map_formats(_free_text_tag()["format"], lambda f: seen.append(f["type"]) or f)
    assert seen == ["json_schema", "tag", "triggered_tags"]


def test_lowering_makes_arguments_compact_and_rejects_bad_schemas() -> None:
    lowered = json.loads(lower_structural_tag(json.dumps(_calls_tag(True))))
    content = lowered["format"]["tags"][0]["content"]
    assert content["type"] == "grammar" and "root" in content["grammar"]
    bad = _calls_tag(True)
    bad["format"]["tags"][0]["content"]["json_schema"] = {"type": "foo"}
    with pytest.raises(GrammarError, match="foo"):
        lower_structural_tag(json.dumps(bad))
    with pytest.raises(GrammarError, match="structural tag"):
        lower_structural_tag('{"type": "structural_tag"}')


@pytest.mark.parametrize("parallel", [False, True])
def test_calls_are_valid_and_close_before_the_budget(parallel: bool) -> None:
    """Under a tight budget the output still ends as whole calls whose arguments validate."""
    model = load_model("stories")
    backend = get_backend("xgrammar", "stories")
    compiled = backend.compile(GrammarSpec("structural_tag", json.dumps(_calls_tag(parallel))))
    assert compiled.closes and compiled.closing_tokens > 0
    budget = compiled.closing_tokens + 12
    for seed in range(3):
        gen = generate(backend.new_matcher(compiled), model.vocab_size, model.bias, seed, sample=True,
                       temperature=1.5, budget=budget)
        assert gen.terminated, model.text(gen.ids)
        text = model.text(gen.body)
        calls = text.split("\n<tool_call>") if parallel else [text]
        assert len(calls) >= 1
        for call in calls:
            body = call.removeprefix("<tool_call>").strip().removesuffix("</tool_call>").strip()
            obj = json.loads(body)
            assert obj["name"] == "weather"
            jsonschema.validate(obj["arguments"], SCHEMA)
            # compact separators (the lowering), not xgrammar's any-whitespace structural-tag JSON
            assert body == json.dumps(obj, ensure_ascii=False), body


def test_outlines_refuses_structural_tags() -> None:
    backend = get_backend("outlines", "stories")
    with pytest.raises(GrammarError, match="structural_tag"):
        backend.compile(GrammarSpec("structural_tag", json.dumps(_calls_tag(True))))
