"""The SmolLM2 demo model (its own chat template) through the ``openai`` client: a sensible answer,
and a ``json_schema`` response_format enforced by grammar-constrained decoding."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest


@pytest.fixture(scope="module")
def demo(demo_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=demo_server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def _model(demo) -> str:
    (card,) = demo.models.list().data
    assert card.model_extra["max_model_len"] == 8192
    return card.id


def test_capital_of_france_is_paris(demo):
    got = demo.chat.completions.create(model=_model(demo), temperature=0, max_tokens=24,
                                       messages=[{"role": "user", "content": "What is the capital of France?"}])
    choice = got.choices[0]
    assert "Paris" in choice.message.content, choice
    assert choice.finish_reason == "stop"  # <|im_end|>, the template's end of turn


def test_json_schema_response_format(demo):
    schema = {"type": "object", "properties": {"capital": {"type": "string"}}, "required": ["capital"],
              "additionalProperties": False}
    got = demo.chat.completions.create(
        model=_model(demo), temperature=0, max_tokens=24,
        messages=[{"role": "user", "content": "What is the capital of France? Answer in JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "capital", "schema": schema, "strict": True}})
    choice = got.choices[0]
    assert choice.finish_reason == "stop", choice
    data = json.loads(choice.message.content)
    jsonschema.validate(data, schema)
    assert data["capital"] == "Paris"
