"""JSON schemas for the constrained-decoding suite (each exercises a feature the issue lists)."""

from __future__ import annotations

from typing import Any

SCHEMAS: dict[str, dict[str, Any]] = {
    "flat_object": {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    },
    "nested_object": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer"},
                    "address": {
                        "type": "object",
                        "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                        "required": ["city", "zip"],
                    },
                },
                "required": ["id", "address"],
            }
        },
        "required": ["user"],
    },
    "array_min_max": {
        "type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 4,
    },
    "array_of_objects": {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "minItems": 1,
                "maxItems": 3,
                "items": {
                    "type": "object",
                    "properties": {"sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}},
                    "required": ["sku", "qty"],
                },
            }
        },
        "required": ["items"],
    },
    "enum_strings": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}},
        "required": ["color"],
    },
    "enum_mixed": {"enum": ["yes", 1, None, True, 2.5]},
    "const": {
        "type": "object",
        "properties": {"version": {"const": "1.0"}, "kind": {"const": 7}},
        "required": ["version", "kind"],
    },
    "integer_bounds": {
        "type": "object",
        "properties": {
            "score": {"type": "integer", "minimum": 0, "maximum": 100},
            "delta": {"type": "integer", "minimum": -50, "maximum": -10},
        },
        "required": ["score", "delta"],
    },
    "number_bounds": {
        "type": "object",
        "properties": {"ratio": {"type": "number", "minimum": 0, "maximum": 1}},
        "required": ["ratio"],
    },
    "exclusive_bounds": {
        "type": "object",
        "properties": {"n": {"type": "integer", "exclusiveMinimum": 5, "exclusiveMaximum": 9}},
        "required": ["n"],
    },
    "string_pattern": {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}},
        "required": ["code"],
    },
    "string_length": {
        "type": "object",
        "properties": {"nick": {"type": "string", "minLength": 3, "maxLength": 6}},
        "required": ["nick"],
    },
    "optional_fields": {
        "type": "object",
        "properties": {
            "title": {"type": "string"},
            "subtitle": {"type": "string"},
            "pages": {"type": "integer"},
        },
        "required": ["title"],
    },
    "additional_false": {
        "type": "object",
        "properties": {"a": {"type": "boolean"}, "b": {"type": "null"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    },
    "any_of": {
        "type": "object",
        "properties": {"value": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 5}]}},
        "required": ["value"],
    },
    "any_of_objects": {
        "anyOf": [
            {"type": "object", "properties": {"cat": {"type": "string"}}, "required": ["cat"]},
            {"type": "object", "properties": {"dog": {"type": "integer"}}, "required": ["dog"]},
        ]
    },
    "boolean_and_null": {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "err": {"type": "null"}},
        "required": ["ok", "err"],
    },
    "array_of_enums": {
        "type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 5,
    },
    "nested_arrays": {
        "type": "array",
        "items": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
                  "minItems": 1, "maxItems": 2},
        "minItems": 1,
        "maxItems": 2,
    },
    "defs_ref": {
        "$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer"},
                                                            "y": {"type": "integer"}},
                            "required": ["x", "y"]}},
        "type": "object",
        "properties": {"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}},
        "required": ["start", "end"],
    },
    "date_format": {
        "type": "object",
        "properties": {"when": {"type": "string", "format": "date"}},
        "required": ["when"],
    },
    "tool_call": {
        "type": "object",
        "properties": {
            "name": {"enum": ["get_weather", "get_time"]},
            "arguments": {
                "type": "object",
                "properties": {"location": {"type": "string", "maxLength": 20},
                               "unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["location", "unit"],
                "additionalProperties": False,
            },
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    },
}
