"""Tool calls in ``auto`` mode under a grammar whose triggers are whole call openings
(``ToolCallParser.call_triggers``: pythonic's ``[get_weather(``, llama3's
``{"name": "get_weather", "parameters": ``).

The grammar leaves everything before such an opening free, so text that merely resembles a call (a
Python list of calls to functions that are not tools, a JSON answer whose first key is "name") was
written freely and is content, as the grammar treats it. ``TriggeredParser`` starts a region only
where one of the grammar's triggers begins (or the format's own marker right before one, llama3's
``<|python_tag|>``); from there the grammar makes the call whole and valid, so the calls stream as
the underlying parser reads them, without the holding back that ``CheckedParser`` needs.
"""

from __future__ import annotations

from typing import Optional, Sequence

from radixlm.srt.function_call.base import ParserWrapper, ToolCallParser
from radixlm.srt.function_call.function_tool import FunctionTool
from radixlm.srt.function_call.grammar import auto_triggers


class TriggeredParser(ParserWrapper):
    """``parser``'s format where a region must open with one of ``auto_triggers(parser, tools)``.

    Stateless (one instance serves every choice of a request). Args: parser: the server's tool-call
    parser (``call_triggers`` set). tools: the request's tools (the grammar's triggers).
    """

    def __init__(self, parser: ToolCallParser, tools: Sequence[FunctionTool]):
        super().__init__(parser)
        triggers = auto_triggers(parser, tools)
        markers = [o for o in parser.openers if not any(t.startswith(o) for t in triggers)]
        self.starts = tuple(triggers + [m + t for m in markers for t in triggers])

    def region_allowed(self, text: str, pos: int, final: bool) -> Optional[bool]:
        if text.startswith(self.starts, pos):
            return True
        rest = text[pos:]
        return None if not final and any(s.startswith(rest) for s in self.starts) else False
