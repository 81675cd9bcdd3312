"""Mistral format (``--tool-call-parser mistral``)::

    [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": ...}]

and the newer one of Mistral's v11+ tokenizers, one ``[TOOL_CALLS]`` per call::

    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}

Both are parsed; grammars and prompts write the first. ``[TOOL_CALLS]`` is a special token in
Mistral's tokenizers, so its text only reaches the parser with ``skip_special_tokens: false`` (the
chat route sets that when the parser's markers are special tokens of the model).
"""

from __future__ import annotations

import json
import re
from typing import Any

from radixlm.srt.function_call.base import ParsedCall, RegionScan, ToolCallParser
from radixlm.srt.function_call.json_call import scan_call_object
from radixlm.srt.function_call.json_scan import ScanError, scan_value, skip_ws
from radixlm.srt.function_call.function_tool import FunctionTool

OPEN, ARGS = "[TOOL_CALLS]", "[ARGS]"
_NAMED = re.compile(r"([A-Za-z0-9_.-]+)(\[(A(R(G(S\]?)?)?)?)?)?")


class MistralParser(ToolCallParser):
    name = "mistral"
    openers = (OPEN,)
    trigger = OPEN
    separator = ", "
    wrapper = (f"{OPEN} [", "]")
    markers = (OPEN, ARGS)

    def scan_region(self, text: str, start: int, final: bool) -> RegionScan:
        j = skip_ws(text, start + len(OPEN))
        if j >= len(text):
            return RegionScan("invalid", end=len(text)) if final else RegionScan("partial")
        if text[j] == "[":
            return self._scan_array(text, j + 1, final)
        return self._scan_named(text, j, final)

    def _scan_array(self, text: str, j: int, final: bool) -> RegionScan:
        calls: list[ParsedCall] = []
        n = len(text)
        while True:
            j = skip_ws(text, j)
            if j >= n:
                return _end(calls, n, final)
            if text[j] != "{":
                return RegionScan("done", calls, j) if calls else RegionScan("invalid", end=j)
            obj = scan_call_object(text, j)
            if obj.call is None:
                if obj.finished or final:
                    return RegionScan("done", calls, j) if calls else RegionScan("invalid", end=obj.end or n)
                return RegionScan("partial", calls)
            calls.append(obj.call)
            if obj.error is not None:
                return _until(text, "]", obj.error, calls, final)
            if obj.end is None:
                return _end(calls, n, final)
            k = skip_ws(text, obj.end)
            if k >= n:
                return _end(calls, n, final)
            if text[k] == "]":
                return RegionScan("done", calls, k + 1)
            if text[k] != ",":
                return RegionScan("done", calls, obj.end)
            j = k + 1

    def _scan_named(self, text: str, j: int, final: bool) -> RegionScan:
        m = _NAMED.match(text, j)
        if m is None:
            return RegionScan("invalid", end=j)
        if not text.startswith(ARGS, m.start(2) if m.group(2) else m.end()):
            if m.end() == len(text) and not final:
                return RegionScan("partial")
            return RegionScan("invalid", end=m.end())
        name, k = m.group(1), skip_ws(text, m.end())
        if k >= len(text):
            return _end([ParsedCall(name, "", False)], len(text), final)
        try:
            end = scan_value(text, k)
        except ScanError as e:
            return RegionScan("done", [ParsedCall(name, text[k:e.pos] or "{}")], e.pos)
        if end is None:
            return _end([ParsedCall(name, text[k:], False)], len(text), final)
        return RegionScan("done", [ParsedCall(name, text[k:end])], end)

    def call_tag(self, tool: FunctionTool) -> dict[str, Any]:
        return {"type": "tag", "begin": f'{{"name": {json.dumps(tool.name)}, "arguments": ',
                "content": {"type": "json_schema", "json_schema": tool.parameters}, "end": "}"}

    def render_calls(self, calls: list[tuple[str, Any]]) -> str:
        body = ", ".join(json.dumps({"name": n, "arguments": a}, ensure_ascii=False) for n, a in calls)
        return f"{OPEN} [{body}]"


def _end(calls: list[ParsedCall], n: int, final: bool) -> RegionScan:
    if not final:
        return RegionScan("partial", calls)
    return RegionScan("done", calls, n) if calls else RegionScan("invalid", end=n)


def _until(text: str, close: str, pos: int, calls: list[ParsedCall], final: bool) -> RegionScan:
    found = text.find(close, pos)
    if found != -1:
        return RegionScan("done", calls, found + len(close))
    return RegionScan("done", calls, len(text)) if final else RegionScan("partial", calls)
