"""Structured output on the demo model (SmolLM2-135M-Instruct) ends as a parseable, schema-valid
object: 24 realistic requests (nested objects, bounded arrays, enums, anyOf, integers, numbers,
patterns, optional fields, a date, one ``json_object``) at ``max_new_tokens`` 96, each must
``json.loads``, validate and end with finish_reason ``stop``, for both grammar backends.

Before numbers were bounded and output closed in time, 2-3 of the 24 were cut in every
backend/mode (digits or one string running to the limit). Each backend/mode is one batched
``generate`` call; greedy runs in the default suite, sampled (T 0.8, top_p 0.95, seeded) with
``-m slow``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any, Optional

import jsonschema
import pytest
import torch

from radixlm.srt.engine import Engine
from radixlm.srt.model_loader import ModelLoadError, resolve_model_path
from tests.engine.test_greedy_vs_hf import assert_clean

MAX_NEW = 96
STR = {"type": "string"}
INT = {"type": "integer"}
NUM = {"type": "number"}
BOOL = {"type": "boolean"}


def _obj(props: dict[str, Any], required: Optional[list[str]] = None) -> dict[str, Any]:
    return {"type": "object", "properties": props,
            "required": list(props) if required is None else required}


def _int(lo: int, hi: int) -> dict[str, Any]:
    return {"type": "integer", "minimum": lo, "maximum": hi}


# (name, request, schema; None = json_object)
SUITE: list[tuple[str, str, Optional[dict[str, Any]]]] = [
    ("city", "Give me a JSON object describing the city of Paris: name, country and population.",
     _obj({"name": STR, "country": STR, "population": INT})),
    ("person", "Describe a fictional person as JSON with name, age, optional email and whether "
     "they are a student.",
     _obj({"name": STR, "age": _int(0, 150), "email": STR, "is_student": BOOL},
          ["name", "age", "is_student"])),
    ("product", "Give me a JSON object for a laptop product with name, price in dollars, stock "
     "status and up to three tags.",
     _obj({"name": STR, "price": NUM, "in_stock": BOOL,
           "tags": {"type": "array", "items": STR, "maxItems": 3}})),
    ("company", "Describe a software company as JSON: its name, headquarters address (street, city, "
     "5-digit zip) and number of employees.",
     _obj({"name": STR, "employees": INT,
           "address": _obj({"street": STR, "city": STR,
                            "zip": {"type": "string", "pattern": "^[0-9]{5}$"}})})),
    ("todo", "Write a JSON to-do list with one to three tasks, each with a description and whether "
     "it is done.",
     _obj({"tasks": {"type": "array", "minItems": 1, "maxItems": 3,
                     "items": _obj({"task": STR, "done": BOOL})}})),
    ("weather", "Report today's weather in London as JSON: condition and temperature in Celsius.",
     _obj({"condition": {"enum": ["sunny", "cloudy", "rainy", "snowy"]}, "temperature_c": NUM})),
    ("identifier", "Give a JSON object with an id for a library book (number or code) and its title.",
     _obj({"id": {"anyOf": [INT, {"type": "string", "maxLength": 12}]}, "title": STR})),
    ("color", "Give the RGB components of the color orange as a JSON object.",
     _obj({"r": _int(0, 255), "g": _int(0, 255), "b": _int(0, 255)})),
    ("location", "Give the latitude and longitude of Tokyo as JSON.",
     _obj({"latitude": {"type": "number", "minimum": -90, "maximum": 90},
           "longitude": {"type": "number", "minimum": -180, "maximum": 180}})),
    ("contact", "Give a JSON contact card with a name and a US phone number like 555-123-4567.",
     _obj({"name": STR, "phone": {"type": "string", "pattern": "^[0-9]{3}-[0-9]{3}-[0-9]{4}$"}})),
    ("book", "Describe a famous novel as JSON: title, and if you know them, author and publication "
     "year.",
     _obj({"title": STR, "author": STR, "year": INT}, ["title"])),
    ("movie", "Describe the movie Titanic as JSON with title, release year, rating out of 10 and "
     "genres.",
     _obj({"title": STR, "year": INT, "rating": NUM,
           "genres": {"type": "array", "minItems": 1, "maxItems": 3,
                      "items": {"enum": ["drama", "romance", "action", "comedy", "history"]}}})),
    ("recipe", "Give a simple pancake recipe as JSON: name, servings and two to five ingredients.",
     _obj({"name": STR, "servings": INT,
           "ingredients": {"type": "array", "items": STR, "minItems": 2, "maxItems": 5}})),
    ("event", "Describe a concert as JSON: name, date (YYYY-MM-DD) and expected attendees.",
     _obj({"name": STR, "date": {"type": "string", "format": "date"}, "attendees": INT})),
    ("planet", "Describe the planet Saturn as JSON: name, diameter in km, number of moons and "
     "whether it has rings.",
     _obj({"name": STR, "diameter_km": NUM, "moons": INT, "has_rings": BOOL})),
    ("car", "Describe a car as JSON: make, model, year and whether it is electric.",
     _obj({"make": STR, "model": STR, "year": _int(1900, 2030), "electric": BOOL})),
    ("order", "Give a shop order as JSON with an order id like ORD-1234, a total amount and a status.",
     _obj({"order_id": {"type": "string", "pattern": "^ORD-[0-9]{4}$"}, "total": NUM,
           "status": {"enum": ["pending", "shipped", "delivered"]}})),
    ("animal", "Describe an elephant as JSON: species, number of legs, whether it is endangered, "
     "and its habitat.",
     _obj({"species": STR, "legs": INT, "endangered": BOOL,
           "habitat": {"anyOf": [{"enum": ["savanna", "forest", "desert"]}, STR]}})),
    ("team", "Describe a basketball team as JSON: its name and two to four players with name and "
     "jersey number.",
     _obj({"team": STR, "players": {"type": "array", "minItems": 2, "maxItems": 4,
                                    "items": _obj({"name": STR, "number": _int(0, 99)})}})),
    ("stock", "Give a stock quote as JSON: ticker symbol, price and daily change in percent.",
     _obj({"symbol": {"type": "string", "pattern": "^[A-Z]{1,5}$"}, "price": NUM,
           "change_percent": NUM})),
    ("sensor", "Give three temperature readings from a sensor as JSON.",
     _obj({"sensor": STR, "readings": {"type": "array", "items": NUM, "minItems": 3,
                                       "maxItems": 3}})),
    ("song", "Describe a song as JSON: title, artist, duration in seconds and whether it is explicit.",
     _obj({"title": STR, "artist": STR, "duration_seconds": INT, "explicit": BOOL})),
    ("country", "Give facts about Japan as JSON: name, capital, population and area in square km.",
     _obj({"name": STR, "capital": STR, "population": INT, "area_km2": NUM})),
    ("dog", "Give me a JSON object describing a dog.", None),
]
MODES = {
    "greedy": {"temperature": 0},
    "sampled": {"temperature": 0.8, "top_p": 0.95, "sampling_seed": 1234},
}


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """Decode on one torch thread: on a busy 2-core machine intra-op threads spin-wait, and a
    batch of 24 took minutes instead of ~20 s."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# outlines on the demo model takes ~50 s (slow); tests/constrained covers outlines in the default suite
@pytest.fixture(scope="module", params=["xgrammar", pytest.param("outlines", marks=pytest.mark.slow)])
def engine(request, one_thread) -> Engine:
    try:
        path = resolve_model_path(None)
    except ModelLoadError as e:
        pytest.fail(f"demo model unavailable: {e}")
    return Engine(path, dtype="float32", max_total_tokens=8192, grammar_backend=request.param)


def _problem(out: dict[str, Any], schema: Optional[dict[str, Any]]) -> Optional[str]:
    """Why one output is not a finished, valid, compact object (None: it is)."""
    finish = out["meta_info"]["finish_reason"]["type"]
    if finish != "stop":
        return f"finish_reason {finish}"
    try:
        value = json.loads(out["text"])
        jsonschema.validate(value, schema if schema is not None else {"type": "object"})
    except (ValueError, jsonschema.ValidationError) as e:
        return f"invalid: {str(e).splitlines()[0]}"
    if re.search(r"\s{2,}", re.sub(r'"(\\.|[^"\\])*"', '""', out["text"])):
        return "whitespace is not compact"
    return None


def _check_suite(engine: Engine, mode: str) -> None:
    tok = engine.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": ask}], tokenize=False,
                                       add_generation_prompt=True) for _, ask, _ in SUITE]
    params = [{**MODES[mode], "max_new_tokens": MAX_NEW,
               "json_schema": "$$ANY$$" if schema is None else json.dumps(schema)}
              for _, _, schema in SUITE]
    outs = engine.generate(prompts, params)
    problems = [f"{name}: {why}: {out['text']!r}" for (name, _, schema), out in zip(SUITE, outs)
                if (why := _problem(out, schema)) is not None]
    backend = engine.server_args.grammar_backend
    assert not problems, f"{backend}/{mode}: {len(problems)}/{len(SUITE)} bad\n" + "\n".join(problems)
    assert_clean(engine)


def test_suite_covers_the_schema_features() -> None:
    text = json.dumps([schema for _, _, schema in SUITE])
    assert len(SUITE) >= 20 and any(schema is None for _, _, schema in SUITE)
    for feature in ('"properties": {"street"', '"minItems"', '"maxItems"', '"enum"', '"anyOf"',
                    '"integer"', '"number"', '"pattern"', '"format"', '"minimum"'):
        assert feature in text, feature
    assert any(schema and len(schema["required"]) < len(schema["properties"])
               for _, _, schema in SUITE)  # optional fields


def test_greedy_outputs_are_valid_and_finished(engine: Engine) -> None:
    _check_suite(engine, "greedy")


@pytest.mark.slow
def test_sampled_outputs_are_valid_and_finished(engine: Engine) -> None:
    _check_suite(engine, "sampled")
