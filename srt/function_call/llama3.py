"""Llama 3.1 / 3.2 JSON format (``--tool-call-parser llama3``)::

    {"name": "get_weather", "parameters": {"city": "Paris"}}

optionally after ``<|python_tag|>``; parallel calls are separated by ``;``. A bare object counts
as a call at the very start of the output (after whitespace) or, later, where it begins exactly as
the grammar's trigger ``{"name": `` does, so other JSON in an answer stays text; an object without
a string ``name`` is text too. In ``auto`` mode under a grammar only a requested tool's whole opening
starts a call (``TriggeredParser``), so an answer such as ``{"name": "Alice", "age": 3}`` stays text.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from radixlm.srt.function_call.base import ParsedCall, RegionScan, ToolCallParser
from radixlm.srt.function_call.json_call import scan_call_object
from radixlm.srt.function_call.json_scan import skip_ws
from radixlm.srt.function_call.function_tool import FunctionTool

PYTHON_TAG = "<|python_tag|>"


class Llama3Parser(ToolCallParser):
    name = "llama3"
    openers = (PYTHON_TAG, "{")
    trigger = '{"name": '
    call_triggers = True  # auto: a tool's '{"name": "get_weather", "parameters": ' starts a call; {"name": "Alice"} stays text
    separator = "; "

    def region_allowed(self, text: str, pos: int, final: bool) -> Optional[bool]:
        if text.startswith(PYTHON_TAG, pos) or not text[:pos].strip() or text.startswith(self.trigger, pos):
            return True
        return None if not final and self.trigger.startswith(text[pos:]) else False

    def scan_region(self, text: str, start: int, final: bool) -> RegionScan:
        j = start + len(PYTHON_TAG) if text.startswith(PYTHON_TAG, start) else start
        calls: list[ParsedCall] = []
        n = len(text)
        while True:
            j = skip_ws(text, j)
            if j >= n:
                return self._end(calls, n, final)
            if text[j] != "{":
                return RegionScan("done", calls, j) if calls else RegionScan("invalid", end=j)
            obj = scan_call_object(text, j)
            if obj.call is None:
                if obj.finished or final:
                    return RegionScan("done", calls, j) if calls else RegionScan("invalid", end=obj.end or n)
                return RegionScan("partial", calls)
            calls.append(obj.call)
            if obj.error is not None:
                return RegionScan("done", calls, n)  # the rest of the output is the broken call's
            if obj.end is None:
                return self._end(calls, n, final)
            k = skip_ws(text, obj.end)
            if k >= n:
                return self._end(calls, n, final)
            if text[k] != ";":
                return RegionScan("done", calls, obj.end)
            j = k + 1

    @staticmethod
    def _end(calls: list[ParsedCall], n: int, final: bool) -> RegionScan:
        if not final:
            return RegionScan("partial", calls)
        return RegionScan("done", calls, n) if calls else RegionScan("invalid", end=n)

    def call_tag(self, tool: FunctionTool) -> dict[str, Any]:
        return {"type": "tag", "begin": f'{{"name": {json.dumps(tool.name)}, "parameters": ',
                "content": {"type": "json_schema", "json_schema": tool.parameters}, "end": "}"}

    def render_calls(self, calls: list[tuple[str, Any]]) -> str:
        return "; ".join(json.dumps({"name": n, "parameters": a}, ensure_ascii=False) for n, a in calls)
