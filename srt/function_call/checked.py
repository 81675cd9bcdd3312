"""Tool calls read from output that no grammar forced (``tool_choice: auto`` with
``response_format``/``regex``/``ebnf``, or a server without structural tags): only calls the request
allows count.

With a structural tag the grammar makes every call valid. Without one, the model may write anything
that looks like a call: a function that is not among the tools, arguments that are not a JSON object,
or a call cut by the token limit. Such a region is normal text (content), as SGLang's parsers leave text they cannot use and drop calls to
undefined functions. A region's calls are held until the region is settled (a call is only known
good when it is whole), so the streamed deltas still put together to the non-streamed message.
"""

from __future__ import annotations

import json

from radixlm.srt.function_call.base import ParsedCall, ParserWrapper, RegionScan, ToolCallParser
from radixlm.srt.function_call.function_tool import FunctionTool


class CheckedParser(ParserWrapper):
    """``parser``'s format, keeping only regions whose calls are all valid for the request.

    Stateless (one instance serves every choice of a request). Args: parser: the server's
    tool-call parser. tools: the request's tools (the names to accept). parallel: False keeps only
    a choice's first valid call (``parallel_tool_calls: false``; with a grammar the grammar allows
    only one).
    """

    def __init__(self, parser: ToolCallParser, tools: list[FunctionTool], parallel: bool = True):
        super().__init__(parser)
        self.names = frozenset(t.name for t in tools)
        self.max_calls = None if parallel else 1

    def scan_region(self, text: str, start: int, final: bool) -> RegionScan:
        scan = self.parser.scan_region(text, start, final)
        if scan.status == "partial":
            return RegionScan("partial", [], scan.end)
        if scan.status == "invalid":
            return scan
        if not all(self._valid(c) for c in scan.calls):
            return RegionScan("invalid", [], scan.end)
        return scan

    def _valid(self, call: ParsedCall) -> bool:
        if not call.complete or call.name not in self.names:
            return False
        try:
            return isinstance(json.loads(call.arguments), dict)
        except ValueError:
            return False
