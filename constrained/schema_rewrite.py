"""JSON-schema rewrites that work around gaps of the grammar libraries (pure Python, no imports).

* xgrammar 0.2.9 lowers a string with ``minLength``/``maxLength`` to ``[^"\\\\\\r\\n]{m,n}``, which
  admits raw control characters (invalid JSON; upstream mlc-ai/xgrammar#800). Such strings (no
  ``pattern``/``format``, bounds <= ``MAX_PATTERN_LENGTH``) are rewritten to the equivalent
  ``pattern`` ``^[\\s\\S]{m,n}$``, whose lowering is JSON-string aware.
* outlines-core 0.2.14 silently ignores numeric bounds and several keywords. Integer bounds and
  inclusive integer-valued number bounds are compiled here into a regex (spliced in through a
  ``const`` placeholder); every other ignored keyword raises ``GrammarError`` instead of producing
  output that violates the schema.
* Neither library bounds a number's length: a model could write digits until ``max_new_tokens``
  (``"population": 89345764000002348000…``, cut, invalid). A number without an upper (lower) bound
  gets one here: fewer than ``10**MAX_INTEGER_DIGITS`` in magnitude, i.e. at most 16 integer digits
  (RFC 8259 section 6: integers beyond 2**53, 16 digits, are not interoperable, and an IEEE double
  holds about 16 significant digits), and at most ``MAX_FRACTION_DIGITS`` fraction digits, no
  exponent. xgrammar gets ``exclusiveMinimum``/``exclusiveMaximum`` (its own range lowering, which
  bounds fractions to 6 digits); for outlines the range regexes cap an open side at 16 digits. A
  one-sided bound of more digits keeps its own digit count on the open side.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from typing import Any, Optional

from radixlm.constrained.spec import GrammarError

MAX_PATTERN_LENGTH = 256  # xgrammar's regex path blows up on large repetition counts
MAX_INTEGER_DIGITS = 16  # digits before the point of a number the schema leaves unbounded
MAX_FRACTION_DIGITS = 6  # digits after the point (xgrammar's precision for bounded numbers)
_NUMERIC_TYPES = ("integer", "number")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_ONE = ("additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
               "unevaluatedProperties", "unevaluatedItems", "additionalItems")
_SCHEMA_LISTS = ("prefixItems", "anyOf", "oneOf", "allOf")
# Keyword -> its neutral value (None: any value is unsupported) for outlines-core.
_OUTLINES_IGNORED: dict[str, Any] = {
    "multipleOf": None, "uniqueItems": False, "minProperties": 0, "maxProperties": None,
    "patternProperties": None, "dependentRequired": None, "dependentSchemas": None,
    "contains": None, "minContains": None, "maxContains": None, "propertyNames": None,
    "unevaluatedProperties": None, "unevaluatedItems": None,
}
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def map_schema(node: Any, fn: Callable[[dict[str, Any]], dict[str, Any]]) -> Any:
    """Apply ``fn`` bottom-up to every (sub)schema dict; data keywords (enum, const...) are kept."""
    if not isinstance(node, dict):
        return node
    out = dict(node)
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: map_schema(sub, fn) for name, sub in out[key].items()}
    for key in _SCHEMA_ONE:
        if isinstance(out.get(key), dict):
            out[key] = map_schema(out[key], fn)
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [map_schema(sub, fn) for sub in out[key]]
    if isinstance(out.get("items"), dict):
        out["items"] = map_schema(out["items"], fn)
    elif isinstance(out.get("items"), list):
        out["items"] = [map_schema(sub, fn) for sub in out["items"]]
    return fn(out)


def _load(text: str) -> Optional[Any]:
    try:
        return json.loads(text)
    except ValueError:
        return None  # the backend reports invalid JSON with its own message


def _dump(schema: Any) -> str:
    return json.dumps(schema, ensure_ascii=False)


# ------------------------------------------------------------------------------------ xgrammar
def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _string_length_to_pattern(node: dict[str, Any]) -> dict[str, Any]:
    if node.get("type") != "string" or any(k in node for k in ("pattern", "format", "enum", "const")):
        return node
    lo, hi = node.get("minLength", 0), node.get("maxLength")
    if ("minLength" not in node and "maxLength" not in node) or not _is_int(lo) \
            or (hi is not None and not _is_int(hi)):
        return node
    if lo > MAX_PATTERN_LENGTH or (hi is not None and hi > MAX_PATTERN_LENGTH) or lo < 0 \
            or (hi is not None and hi < lo):
        return node  # leave it to xgrammar (its own errors / its counted repetition)
    out = {k: v for k, v in node.items() if k not in ("minLength", "maxLength")}
    out["pattern"] = f"^[\\s\\S]{{{lo},{'' if hi is None else hi}}}$"
    return out


def digits_limit(bound: float) -> int:
    """The power of ten above ``|bound|`` with at least ``MAX_INTEGER_DIGITS`` zeros: a number
    under it in magnitude has at most ``max(16, digits of int(|bound|))`` integer digits."""
    return 10 ** max(MAX_INTEGER_DIGITS, len(str(int(abs(bound)))))


def _is_finite_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def bound_number(node: dict[str, Any]) -> dict[str, Any]:
    """A ``type: integer|number`` (sub)schema with both sides bounded: a missing side becomes
    ``exclusiveMaximum`` ``digits_limit(lower bound or 0)`` / ``exclusiveMinimum`` its negative.

    Schemas with ``enum``/``const``, a type list, or draft-4 boolean exclusive bounds are returned
    unchanged (the first are bounded already; the others the backend handles or rejects).
    """
    if node.get("type") not in _NUMERIC_TYPES or "enum" in node or "const" in node:
        return node
    given = {k: node[k] for k in _BOUNDS if k in node}
    if not all(_is_finite_number(v) for v in given.values()):
        return node
    lows = [v for k, v in given.items() if k.endswith("inimum")]
    highs = [v for k, v in given.items() if k.endswith("aximum")]
    if lows and highs:
        return node
    out = dict(node)
    if not highs:
        out["exclusiveMaximum"] = digits_limit(max(max(lows, default=0), 0))
    if not lows:
        out["exclusiveMinimum"] = -digits_limit(min(min(highs, default=0), 0))
    return out


# Keywords xgrammar (0.2.x) accepts but does not enforce: outputs violate them (measured with random
# logits on SmolLM2's vocabulary: uniqueItems 3/6 samples, contains 6/6, if/then 6/6, not 4/6,
# dependentRequired 3/6, multipleOf 5/6 with an open range). A schema with them is refused.
_XGRAMMAR_UNENFORCED = ("not", "if", "then", "else", "contains", "minContains", "maxContains",
                        "dependentRequired", "dependentSchemas", "dependencies")


def check_xgrammar_keywords(node: dict[str, Any]) -> dict[str, Any]:
    """``node`` unchanged if xgrammar enforces every keyword in it.

    Raises:
        GrammarError: a keyword it would silently ignore (``_XGRAMMAR_UNENFORCED``, ``uniqueItems:
            true``, ``multipleOf`` other than 1, ``allOf`` of several schemas) or a ``required``
            name that ``properties`` lacks (never written: the output would miss it).
    """
    def refuse(what: str) -> GrammarError:
        return GrammarError(f"{what} is not enforced by the xgrammar backend (outputs could violate it); "
                            "remove it from the schema")

    for key in _XGRAMMAR_UNENFORCED:
        if node.get(key) not in (None, {}, []):
            raise refuse(f"JSON schema keyword {key!r}")
    if node.get("uniqueItems") is True:
        raise refuse("JSON schema keyword 'uniqueItems'")
    if "multipleOf" in node and node["multipleOf"] != 1:
        raise refuse("JSON schema keyword 'multipleOf'")
    if isinstance(node.get("allOf"), list) and len(node["allOf"]) > 1:
        raise refuse("'allOf' of several schemas")
    props, required = node.get("properties"), node.get("required")
    if isinstance(props, dict) and isinstance(required, list):
        missing = [name for name in required if name not in props]
        if missing:
            raise GrammarError(f"required names {missing} that properties does not define (such a property is "
                               "never written, so the output would miss it)")
    return node


def check_number_range(node: dict[str, Any]) -> dict[str, Any]:
    """``node`` unchanged if its numeric bounds admit a number the grammars can write (an integer,
    or a number of at most ``MAX_FRACTION_DIGITS`` fraction digits).

    Raises:
        GrammarError: no such number lies in the bounds (``exclusiveMinimum: 0, exclusiveMaximum:
            1e-9``; an integer in [1.2, 1.8]): xgrammar would lower the value to nothing, ``{"n": }``.
    """
    if node.get("type") not in _NUMERIC_TYPES or "enum" in node or "const" in node:
        return node
    given = {k: node[k] for k in _BOUNDS if k in node}
    if not given or not all(_is_finite_number(v) for v in given.values()):
        return node
    step = Decimal(1).scaleb(-MAX_FRACTION_DIGITS) if node["type"] == "number" else Decimal(1)
    lo: Optional[Decimal] = None
    hi: Optional[Decimal] = None
    for key, value in given.items():
        exact = Decimal(repr(float(value))) if isinstance(value, float) else Decimal(value)
        if key.endswith("inimum"):  # the smallest multiple of step at (or above, if exclusive) the bound
            q = (exact / step).to_integral_value(ROUND_CEILING) * step
            q = q + step if key == "exclusiveMinimum" and q == exact else q
            lo = q if lo is None else max(lo, q)
        else:
            q = (exact / step).to_integral_value(ROUND_FLOOR) * step
            q = q - step if key == "exclusiveMaximum" and q == exact else q
            hi = q if hi is None else min(hi, q)
    if lo is not None and hi is not None and lo > hi:
        bounds = ", ".join(f"{k}={v!r}" for k, v in given.items())
        what = (f"no number of at most {MAX_FRACTION_DIGITS} fraction digits (what the grammar writes)"
                if node["type"] == "number" else "no integer")
        raise GrammarError(f"{what} lies within {bounds}")
    return node


def patch_xgrammar_schema(text: str) -> str:
    """Schema text for xgrammar: length-bounded strings go through the JSON-aware pattern path,
    and numbers the schema leaves unbounded get bounds (``bound_number``).

    Text that is not a JSON object is returned as is (xgrammar reports it).

    Raises:
        GrammarError: numeric bounds that admit no number the grammar can write (``check_number_range``),
            or a keyword xgrammar would not enforce (``check_xgrammar_keywords``).
    """
    schema = _load(text)
    if not isinstance(schema, dict):
        return text
    patched = map_schema(schema, lambda node: bound_number(_string_length_to_pattern(
        check_number_range(check_xgrammar_keywords(node)))))
    return text if patched == schema else _dump(patched)


# A JSON value of any kind (``json_object``'s values): numbers get bounded like any other.
ANY_OBJECT_SCHEMA: dict[str, Any] = {
    "$defs": {"value": {"anyOf": [
        {"type": "string"}, {"type": "number"}, {"type": "boolean"}, {"type": "null"},
        {"type": "array", "items": {"$ref": "#/$defs/value"}},
        {"type": "object", "additionalProperties": {"$ref": "#/$defs/value"}},
    ]}},
    "type": "object",
    "additionalProperties": {"$ref": "#/$defs/value"},
}


# ------------------------------------------------------------------------------------ outlines
def _digits_range(lo: str, hi: str) -> list[str]:
    """Regex alternatives for the digit strings of equal length in [lo, hi]."""
    if lo == hi:
        return [lo]
    if len(lo) == 1:
        return [f"[{lo}-{hi}]"]
    if lo[0] == hi[0]:
        return [lo[0] + rest for rest in _digits_range(lo[1:], hi[1:])]
    n = len(lo) - 1
    if lo[1:] == "0" * n and hi[1:] == "9" * n:
        return [f"[{lo[0]}-{hi[0]}]" + "[0-9]" * n]
    alts = [lo[0] + rest for rest in _digits_range(lo[1:], "9" * n)]
    if int(hi[0]) - int(lo[0]) > 1:
        alts.append(f"[{int(lo[0]) + 1}-{int(hi[0]) - 1}]" + "[0-9]" * n)
    alts += [hi[0] + rest for rest in _digits_range("0" * n, hi[1:])]
    return alts


def natural_range_regex(lo: int, hi: Optional[int]) -> str:
    """Regex for the canonical decimal naturals in [lo, hi], 0 <= lo; hi None: below
    ``digits_limit(lo)`` (at most 16 digits, or as many as ``lo`` has).

    Wider alternatives come first: outlines-core's DFA gives alternatives leftmost-first
    priority, so at the end of a regex ``([0-9]|[1-9][0-9])`` would stop after one digit.
    """
    alts: list[str] = []
    width = len(str(lo))
    cap = len(str(digits_limit(lo))) - 1
    top = hi if hi is not None else 10 ** width - 1
    while lo <= top:
        end = min(top, 10 ** width - 1)
        alts += _digits_range(str(lo), str(end))
        lo, width = 10 ** width, width + 1
    if hi is None and width <= cap:
        alts.append(f"[1-9][0-9]{{{width - 1},{cap - 1}}}")
    return "(" + "|".join(reversed(alts)) + ")"


def integer_range_regex(lo: Optional[int], hi: Optional[int]) -> str:
    """Regex for the JSON integers in [lo, hi] (no "-0"); a None side is bounded by
    ``digits_limit`` of the other side (at most 16 digits).

    Raises:
        GrammarError: the range is empty.
    """
    if lo is not None and hi is not None and lo > hi:
        raise GrammarError(f"empty integer range [{lo}, {hi}]")
    alts = []
    if lo is None or lo < 0:  # negatives: -k for k in [max(1, -hi), -lo]
        alts.append("-" + natural_range_regex(max(1, -hi) if hi is not None else 1,
                                              None if lo is None else -lo))
    if hi is None or hi >= 0:
        alts.append(natural_range_regex(max(0, lo) if lo is not None else 0, hi))
    return "(" + "|".join(alts) + ")"


def _magnitude_regex(lo: int, hi: Optional[int]) -> str:
    """Unsigned decimals (fraction of at most ``MAX_FRACTION_DIGITS`` digits, no exponent) with
    value in [lo, hi], lo integer; hi None: integer part as ``natural_range_regex``."""
    frac = f"(\\.[0-9]{{1,{MAX_FRACTION_DIGITS}}})?"
    if hi is None:
        return f"({natural_range_regex(lo, None)}{frac})"
    alts = [f"{hi}(\\.0{{1,{MAX_FRACTION_DIGITS}}})?"]  # first: the widest (see natural_range_regex)
    if hi > lo:
        alts.append(f"{natural_range_regex(lo, hi - 1)}{frac}")
    return "(" + "|".join(alts) + ")"


def number_range_regex(lo: Optional[int], hi: Optional[int]) -> str:
    """Regex for JSON numbers in [lo, hi] with integer bounds (no exponent, at most
    ``MAX_FRACTION_DIGITS`` fraction digits); a None side as in ``integer_range_regex``.

    Raises:
        GrammarError: the range is empty.
    """
    if lo is not None and hi is not None and lo > hi:
        raise GrammarError(f"empty number range [{lo}, {hi}]")
    alts = []
    if lo is None or lo < 0:  # -m with m in [max(0, -hi), -lo]
        alts.append("-" + _magnitude_regex(max(0, -hi) if hi is not None else 0,
                                           None if lo is None else -lo))
    if hi is None or hi >= 0:
        alts.append(_magnitude_regex(max(0, lo) if lo is not None else 0, hi))
    return "(" + "|".join(alts) + ")"


def numeric_bounds(node: dict[str, Any], integer: bool, backend: str = "the outlines backend"
                   ) -> tuple[Optional[int], Optional[int]]:
    """The inclusive integer range [lo, hi] (None: unbounded side) a numeric schema's bounds allow,
    for ``integer_range_regex`` / ``number_range_regex``.

    Raises:
        GrammarError: a bound is not a finite number, or a number (not integer) schema has an
            exclusive or fractional bound (the regexes cannot express it); ``backend`` names the
            grammar path in the message.
    """
    lo: Optional[int] = None
    hi: Optional[int] = None
    for key in _BOUNDS:
        if key not in node:
            continue
        value = node[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise GrammarError(f"{key} must be a finite number, got {value!r}")
        exclusive = key.startswith("exclusive")
        if integer:
            bound = {"minimum": math.ceil(value), "exclusiveMinimum": math.floor(value) + 1,
                     "maximum": math.floor(value), "exclusiveMaximum": math.ceil(value) - 1}[key]
        elif exclusive or value != int(value):
            raise GrammarError(f"{backend} supports only inclusive integer bounds on "
                               f"numbers, got {key}={value!r}")
        else:
            bound = int(value)
        if key.endswith("inimum"):
            lo = bound if lo is None else max(lo, bound)
        else:
            hi = bound if hi is None else min(hi, bound)
    return lo, hi


def prepare_outlines_schema(text: str) -> tuple[str, dict[str, str]]:
    """Schema text for outlines-core plus ``{placeholder regex: bound regex}`` to splice in.

    The placeholder is the regex outlines emits for ``{"const": "<placeholder>"}``, i.e. the
    quoted placeholder; replace it in the built regex with the paired bounded-number regex.
    Every ``type: integer|number`` schema without ``enum``/``const`` goes this way, bounded or not
    (an open side is capped at 16 digits, see ``integer_range_regex``).

    Raises:
        GrammarError: a keyword outlines-core would silently ignore, or unsupported bounds.
    """
    schema = _load(text)
    if not isinstance(schema, dict):
        return text, {}
    splices: dict[str, str] = {}

    def rewrite(node: dict[str, Any]) -> dict[str, Any]:
        for key, neutral in _OUTLINES_IGNORED.items():
            if key in node and (neutral is None or node[key] != neutral):
                raise GrammarError(f"JSON schema keyword {key!r} is not supported by the outlines "
                                   "backend; use --grammar-backend xgrammar")
        kind = node.get("type")
        numeric = kind in _NUMERIC_TYPES and "enum" not in node and "const" not in node
        if not numeric and not any(k in node for k in _BOUNDS):
            return node
        if kind not in _NUMERIC_TYPES:
            raise GrammarError("the outlines backend supports numeric bounds only on a schema of "
                               f"type integer or number, got type {kind!r}")
        try:
            lo, hi = numeric_bounds(node, integer=kind == "integer")
        except GrammarError as e:
            raise GrammarError(f"{e}; use --grammar-backend xgrammar") from None
        regex = integer_range_regex(lo, hi) if kind == "integer" else number_range_regex(lo, hi)
        placeholder = f"__radixlm_bound_{len(splices)}__"
        splices[f'"{placeholder}"'] = regex
        return {"const": placeholder}

    patched = map_schema(schema, rewrite)
    return (text if patched == schema else _dump(patched)), splices


def splice_regex(regex: str, splices: dict[str, str]) -> str:
    """Replace each placeholder of ``prepare_outlines_schema`` in ``regex`` (every occurrence; an
    unreferenced ``$defs`` entry has none)."""
    for placeholder, sub in splices.items():
        regex = regex.replace(placeholder, sub)
    return regex
