"""Hermes / Qwen2.5 format (``--tool-call-parser hermes`` or ``qwen25``), also radixlm's default
rendering for templates without tool support::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

One call per ``<tool_call>`` block; parallel calls are consecutive blocks separated by a newline.
A block whose body is not a named JSON object is normal text. A missing ``</tool_call>`` is
tolerated (the call ends with its object).
"""

from __future__ import annotations

import json
from typing import Any

from radixlm.srt.function_call.base import ParsedCall, RegionScan, ToolCallParser
from radixlm.srt.function_call.json_call import scan_call_object
from radixlm.srt.function_call.json_scan import skip_ws
from radixlm.srt.function_call.function_tool import FunctionTool

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesParser(ToolCallParser):
    name = "hermes"
    openers = (OPEN,)
    trigger = OPEN
    separator = "\n"

    def scan_region(self, text: str, start: int, final: bool) -> RegionScan:
        j = skip_ws(text, start + len(OPEN))
        if j >= len(text):
            return RegionScan("invalid", end=len(text)) if final else RegionScan("partial")
        if text[j] != "{":
            return self._not_a_call(text, start, final)
        obj = scan_call_object(text, j)
        if obj.call is None:
            return self._not_a_call(text, start, final) if obj.finished or final else RegionScan("partial")
        if obj.error is not None:
            return self._until_close(text, obj.error, [obj.call], final)
        if obj.end is None:
            return RegionScan("done", [obj.call], len(text)) if final else RegionScan("partial", [obj.call])
        k = skip_ws(text, obj.end)
        rest = text[k:]
        if rest.startswith(CLOSE):
            return RegionScan("done", [obj.call], k + len(CLOSE))
        if CLOSE.startswith(rest):  # the close tag still arriving, or cut at the end
            return RegionScan("done", [obj.call], len(text)) if final else RegionScan("partial", [obj.call])
        return RegionScan("done", [obj.call], obj.end)

    @staticmethod
    def _until_close(text: str, pos: int, calls: list[ParsedCall], final: bool) -> RegionScan:
        """The call is final; the block's remaining text up to ``</tool_call>`` is dropped."""
        close = text.find(CLOSE, pos)
        if close != -1:
            return RegionScan("done", calls, close + len(CLOSE))
        return RegionScan("done", calls, len(text)) if final else RegionScan("partial", calls)

    @staticmethod
    def _not_a_call(text: str, start: int, final: bool) -> RegionScan:
        close = text.find(CLOSE, start)
        if close != -1:
            return RegionScan("invalid", end=close + len(CLOSE))
        return RegionScan("invalid", end=len(text)) if final else RegionScan("partial")

    def call_tag(self, tool: FunctionTool) -> dict[str, Any]:
        name = json.dumps(tool.name)
        return {"type": "tag", "begin": f'{OPEN}\n{{"name": {name}, "arguments": ',
                "content": {"type": "json_schema", "json_schema": tool.parameters}, "end": f"}}\n{CLOSE}"}

    def render_calls(self, calls: list[tuple[str, Any]]) -> str:
        return "\n".join(f"{OPEN}\n{json.dumps({'name': n, 'arguments': a}, ensure_ascii=False)}\n{CLOSE}"
                         for n, a in calls)


class Qwen25Parser(HermesParser):
    """Qwen2.5's templates write Hermes blocks (the same format under SGLang's other name)."""

    name = "qwen25"
