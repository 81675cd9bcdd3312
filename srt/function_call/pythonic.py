"""Pythonic format (``--tool-call-parser pythonic``; Llama 3.2 / 4 style)::

    [get_weather(city="Paris", days=3), get_time(zone="CET")]

A list of calls with keyword arguments whose values are Python literals (``True``/``False``/``None``
and JSON's ``true``/``false``/``null`` alike); arguments come back as JSON text. A region starts at
a ``[`` followed by a name and ``(``. Each call is reported once its element of the list is whole
(name and arguments together); an element that is not such a call is dropped, and a list with no
call is normal text. Grammars force calls with ``pythonic_grammar``.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any, Optional

from radixlm.srt.function_call.base import ParsedCall, RegionScan, ToolCallParser
from radixlm.srt.function_call.pythonic_grammar import kwargs_grammar
from radixlm.srt.function_call.function_tool import FunctionTool

_START = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(")
_PARTIAL_START = re.compile(r"\[\s*(?:[A-Za-z_][\w.]*\s*)?")
_JSON_NAMES = {"true": True, "false": False, "null": None}


class PythonicParser(ToolCallParser):
    name = "pythonic"
    openers = ("[",)
    trigger = "["
    call_triggers = True  # "[get_weather(" starts a call in auto mode; "[1, 2, 3]" stays text
    separator = ", "
    wrapper = ("[", "]")

    def region_allowed(self, text: str, pos: int, final: bool) -> Optional[bool]:
        if _START.match(text, pos):
            return True
        partial = _PARTIAL_START.match(text, pos)
        return None if not final and partial is not None and partial.end() == len(text) else False

    def scan_region(self, text: str, start: int, final: bool) -> RegionScan:
        calls: list[ParsedCall] = []
        depth, quote, i, element = 1, "", start + 1, start + 1
        n = len(text)
        while i < n:
            c = text[i]
            if quote:
                if c == "\\":
                    i += 1
                elif c == quote:
                    quote = ""
            elif c in "'\"":
                quote = c
            elif c in "([{":
                depth += 1
            elif c in ")]}":
                depth -= 1
                if depth == 0:
                    _add(calls, text[element:i])
                    return RegionScan("done", calls, i + 1) if calls else RegionScan("invalid", end=i + 1)
            elif c == "," and depth == 1:
                _add(calls, text[element:i])
                element = i + 1
            i += 1
        if not final:
            return RegionScan("partial", calls)
        return RegionScan("done", calls, n) if calls else RegionScan("invalid", end=n)

    def call_tag(self, tool: FunctionTool) -> dict[str, Any]:
        return {"type": "tag", "begin": f"{tool.name}(",
                "content": {"type": "grammar", "grammar": kwargs_grammar(tool.parameters)}, "end": ")"}

    def render_calls(self, calls: list[tuple[str, Any]]) -> str:
        def call(name: str, arguments: Any) -> str:
            items = arguments.items() if isinstance(arguments, dict) else []
            return f"{name}({', '.join(f'{k}={_literal(v)}' for k, v in items)})"

        return "[" + ", ".join(call(n, a) for n, a in calls) + "]"


def _add(calls: list[ParsedCall], source: str) -> None:
    call = parse_call(source)
    if call is not None:
        calls.append(call)


def parse_call(source: str) -> Optional[ParsedCall]:
    """``name(k=v, ...)`` with literal values as a call, else None."""
    try:
        node = ast.parse(source.strip(), mode="eval").body
    except (SyntaxError, ValueError):
        return None
    if not isinstance(node, ast.Call) or node.args or not isinstance(node.func, (ast.Name, ast.Attribute)):
        return None
    arguments: dict[str, Any] = {}
    for kw in node.keywords:
        if kw.arg is None:
            return None
        try:
            arguments[kw.arg] = _value(kw.value)
        except (ValueError, TypeError, RecursionError):  # not a literal, or an unhashable dict key
            return None
    try:
        text = json.dumps(arguments, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        return None
    return ParsedCall(ast.unparse(node.func), text)


def _value(node: ast.expr) -> Any:
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, ast.List):
        return [_value(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise ValueError("** in a dict")
        return {_value(k): _value(v) for k, v in zip(node.keys, node.values)}  # type: ignore[arg-type]
    value = ast.literal_eval(node)
    if isinstance(value, tuple):
        return list(value)
    return value


def _literal(value: Any) -> str:
    """A JSON value as a Python literal."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))}: {_literal(v)}" for k, v in value.items()) + "}"
    return json.dumps(value, ensure_ascii=False)
