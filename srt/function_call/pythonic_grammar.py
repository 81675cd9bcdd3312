"""An EBNF grammar (xgrammar's GBNF dialect) of a pythonic call's keyword arguments, from the
function's parameters schema: ``city="Paris", days=3`` for ``{"city": string, "days": integer}``.

Properties come in the schema's order, required ones always, optional ones may be left out; values
are Python literals the parser reads back into JSON (``True``/``False``/``None``, double-quoted
strings, lists, dicts with string keys). Numbers are bounded like the JSON grammars' (16 integer,
6 fraction digits), so output cannot run away in digits.

Supported keywords: ``type`` (one or a list), ``properties``, ``required``, ``items``, ``enum``,
``const``, ``anyOf``/``oneOf``, ``minLength``/``maxLength``, ``minItems``/``maxItems``, numeric bounds
(``minimum``/``maximum``/``exclusiveMinimum``/``exclusiveMaximum`` on integers; inclusive integer-valued
``minimum``/``maximum`` on numbers: the digit-range lowering of ``constrained.schema_rewrite``, so
``days: {"type": "integer", "minimum": 1, "maximum": 14}`` admits exactly 1..14), and
annotations (``description``, ``title``, ``default``, ``examples``). Anything else raises
``UnsupportedSchema`` (the route answers 400), rather than allowing calls that break the schema.
``additionalProperties`` is accepted and read as false (only the listed properties are written).
"""

from __future__ import annotations

import json
import re
from typing import Any

from radixlm.constrained.schema_rewrite import integer_range_regex, number_range_regex, numeric_bounds
from radixlm.constrained.spec import GrammarError

_ANNOTATIONS = frozenset({"description", "title", "default", "examples", "$schema", "additionalProperties",
                          "strict"})
_KNOWN = frozenset({"type", "properties", "required", "items", "enum", "const", "anyOf", "oneOf", "minLength",
                    "maxLength", "minItems", "maxItems", "minimum", "maximum", "exclusiveMinimum",
                    "exclusiveMaximum"}) | _ANNOTATIONS
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_PRIMITIVE = {"string": "string", "integer": "integer", "number": "number", "boolean": "boolean", "null": "null"}
_BASE_RULES = r'''
string ::= "\"" char* "\""
char ::= [^"\\\0-\x1f] | "\\" ["\\bfnrt]
integer ::= "-"? ("0" | [1-9] [0-9]{0,15})
number ::= integer ("." [0-9]{1,6})?
boolean ::= "True" | "False"
null ::= "None"
'''


class UnsupportedSchema(ValueError):
    """A parameters schema the pythonic grammar cannot express."""


class _Builder:
    def __init__(self) -> None:
        self.rules: list[str] = []

    def rule(self, body: str) -> str:
        name = f"r{len(self.rules)}"
        self.rules.append(f"{name} ::= {body}")
        return name

    def value(self, schema: Any, where: str) -> str:
        if schema is True or schema == {}:
            raise UnsupportedSchema(f"{where}: a value of any type cannot be written as a pythonic literal here")
        if not isinstance(schema, dict):
            raise UnsupportedSchema(f"{where}: a schema must be an object")
        unknown = sorted(set(schema) - _KNOWN)
        if unknown:
            raise UnsupportedSchema(f"{where}: keyword(s) {', '.join(unknown)} are not supported by the pythonic "
                                    "tool-call grammar")
        if "const" in schema:
            return _literal_rule(schema["const"])
        if "enum" in schema:
            return "(" + " | ".join(_literal_rule(v) for v in schema["enum"]) + ")"
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return "(" + " | ".join(self.value(s, f"{where}.{key}.{i}") for i, s in enumerate(schema[key])) + ")"
        types = schema.get("type")
        if isinstance(types, list):
            return "(" + " | ".join(self.value({**schema, "type": t}, where) for t in types) + ")"
        if types == "string" and ("minLength" in schema or "maxLength" in schema):
            return self.rule(f'"\\"" char{_repeat(schema, "minLength", "maxLength", 0)} "\\""')
        if types in ("integer", "number") and any(k in schema for k in _BOUNDS):
            return self.rule(_bounded_number(schema, types == "integer", where))
        if types in _PRIMITIVE:
            return _PRIMITIVE[types]
        if types == "array":
            item = self.value(schema.get("items", {"type": "string"}), f"{where}.items")
            low = int(schema.get("minItems", 0))
            if low == 0 and "maxItems" not in schema:
                return self.rule(f'"[" ({item} (", " {item})*)? "]"')
            more = self.rule(f'", " {item}')
            tail = f'{more}{_repeat(schema, "minItems", "maxItems", 1)}'
            return self.rule(f'"[" {item} {tail} "]"' if low > 0 else f'"[" ({item} {tail})? "]"')
        if types == "object":
            return self.rule('"{" ' + self.members(schema, where, dict_style=True) + ' "}"')
        raise UnsupportedSchema(f"{where}: type {types!r} is not supported by the pythonic tool-call grammar")

    def members(self, schema: dict[str, Any], where: str, dict_style: bool) -> str:
        """The comma-separated members, required ones present, optional ones skippable."""
        props = schema.get("properties") or {}
        required = set(schema.get("required") or [])
        missing = required - set(props)
        if missing:
            raise UnsupportedSchema(f"{where}: required {sorted(missing)} not in properties")
        items = []
        for key, sub in props.items():
            if not dict_style and not re.fullmatch(r"[A-Za-z_]\w*", key):
                raise UnsupportedSchema(f"{where}: {key!r} cannot be a Python keyword argument")
            head = json.dumps(json.dumps(key) + ": ") if dict_style else json.dumps(key + "=")
            items.append((f"{head} {self.value(sub, f'{where}.properties.{key}')}", key in required))
        first, rest = '""', '""'
        for item, req in reversed(items):
            new_rest = self.rule(f'", " {item} {rest}' if req else f'(", " {item})? {rest}')
            new_first = self.rule(f"{item} {rest}" if req else f"({item} {rest}) | {first}")
            first, rest = new_first, new_rest
        return first


def _repeat(schema: dict[str, Any], low_key: str, high_key: str, used: int) -> str:
    """EBNF ``{m,n}`` for a count bounded by two keywords, less ``used`` already written."""
    low = max(int(schema.get(low_key, 0)) - used, 0)
    high = schema.get(high_key)
    if high is None:
        return f"{{{low},}}"
    if int(high) - used < low:
        raise UnsupportedSchema(f"{low_key} is larger than {high_key}")
    return f"{{{low},{int(high) - used}}}"


def _bounded_number(schema: dict[str, Any], integer: bool, where: str) -> str:
    """EBNF of the integers (numbers) within the schema's bounds, as the JSON grammars bound them."""
    try:
        lo, hi = numeric_bounds(schema, integer, "the pythonic tool-call grammar")
        regex = integer_range_regex(lo, hi) if integer else number_range_regex(lo, hi)
    except GrammarError as e:
        raise UnsupportedSchema(f"{where}: {e}") from None
    return regex_to_ebnf(regex)


def regex_to_ebnf(regex: str) -> str:
    """The EBNF of a regex of literals, ``\\.`` escapes, ``[...]`` classes, groups, ``|``, ``?`` and
    ``{m,n}`` (the subset ``schema_rewrite``'s range regexes use): literals become quoted strings."""
    out, i = [], 0
    while i < len(regex):
        c = regex[i]
        if c == "[":
            j = regex.index("]", i + 1)
            out.append(regex[i:j + 1])
            i = j + 1
            continue
        if c == "{":
            j = regex.index("}", i + 1)
            out[-1] += regex[i:j + 1]
            i = j + 1
            continue
        if c == "?":
            out[-1] += "?"
        elif c in "()|":
            out.append(c)
        else:
            if c == "\\":
                i += 1
                c = regex[i]
            out.append(json.dumps(c))
        i += 1
    return " ".join(out).replace("( ", "(").replace(" )", ")")


def _literal_rule(value: Any) -> str:
    """A constant's Python literal as an EBNF string."""
    from radixlm.srt.function_call.pythonic import _literal

    return json.dumps(_literal(value))


def kwargs_grammar(parameters: dict[str, Any]) -> str:
    """EBNF with a ``root`` rule for the keyword arguments of a call taking ``parameters``.

    Raises:
        UnsupportedSchema: a keyword or shape outside the supported subset (message names it).
    """
    b = _Builder()
    if not isinstance(parameters, dict) or parameters.get("type") != "object":
        raise UnsupportedSchema("parameters must be a schema of type object")
    body = b.members(parameters, "parameters", dict_style=False)
    return f"root ::= {body}\n" + "\n".join(b.rules) + _BASE_RULES
