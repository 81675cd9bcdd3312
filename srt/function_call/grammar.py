"""Tool calls valid by construction: the xgrammar structural tag that forces a parser's format.

``tool_call_structural_tag(parser, tools, mode, parallel, reasoning)`` returns the tag (plain data;
the scheduler's grammar backend compiles it):

* ``named``: exactly one call of ``tools[0]``.
* ``required``: one call (``parallel=False``) or one or more separated by ``parser.separator``,
  nothing else; a format with a ``wrapper`` (``[TOOL_CALLS] [`` ... ``]``) writes it around them.
* ``auto``: free text until the model writes ``parser.trigger`` (with ``parser.call_triggers``, a
  tool's whole call opening, ``auto_triggers``: pythonic's ``[get_weather(``, so a list in prose stays
  text; llama3's ``{"name": "get_weather", "parameters": ``, so a JSON answer with a "name" stays text); from
  there the output must be a whole call (or, for wrapped formats, a whole list of calls); with
  ``parallel=False`` the output ends after the first call, else text and further calls may follow.

Each call's arguments are the tool's ``parameters`` JSON schema (or, for pythonic, its keyword
grammar), so every call parses and its arguments validate. ``reasoning``: the output first runs
through a reasoning block (``ReasoningGrammar``), unconstrained, and the tool grammar applies after
its end tag. A block the model would only *open* itself (the prompt did not) is allowed in ``auto``
mode; ``required``/named then call at once, because free text before the calls would stop the
output from closing in time (``constrained.structural_tag.closes_in_time``) at ``max_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Optional, Sequence

from radixlm.srt.function_call.base import ToolCallParser
from radixlm.srt.function_call.function_tool import FunctionTool

ToolMode = Literal["auto", "required", "named"]
_AFTER_REASONING = {"type": "regex", "pattern": r"\s{0,4}"}  # the blank line after </think>


@dataclass(frozen=True)
class ReasoningGrammar:
    """A reasoning block before the answer: ``starts_inside`` when the prompt already opened it
    (the output begins with reasoning), else it may open with ``start``; it ends with ``end``."""

    start: str
    end: str
    starts_inside: bool


def _const(value: str) -> dict[str, Any]:
    return {"type": "const_string", "value": value}


def _call_triggered_region(parser: ToolCallParser, tags: list[dict[str, Any]], parallel: bool) -> dict[str, Any]:
    """``auto`` for a wrapped format whose wrapper opening is common text (pythonic's ``[``): the
    region is triggered by the opening plus a call's (``[get_weather(``), so ``[1, 2, 3]`` stays free
    text; the first call's tag carries the wrapper, the others (when ``parallel``) follow it."""
    begin, end = parser.wrapper
    more: list[dict[str, Any]] = []
    if parallel:
        more = [{"type": "tags_with_separator", "tags": [{**t, "begin": parser.separator + t["begin"]} for t in tags],
                 "separator": "", "at_least_one": False, "stop_after_first": False}]
    firsts = [{"type": "tag", "begin": begin + t["begin"], "end": end, "content": {
        "type": "sequence", "elements": [t["content"], _const(t["end"]), *more]}} for t in tags]
    return {"type": "triggered_tags", "triggers": [f["begin"] for f in firsts], "tags": firsts,
            "stop_after_first": True}


def auto_triggers(parser: ToolCallParser, tools: Sequence[FunctionTool]) -> list[str]:
    """For a parser with ``call_triggers``: the texts that start a forced call in ``auto`` mode, one per
    tool: the wrapper's opening plus the call's (pythonic ``[get_weather(``, llama3
    ``{"name": "get_weather", "parameters": ``). Before one of them the output is free text."""
    return [parser.wrapper[0] + parser.call_tag(t)["begin"] for t in tools]


def tool_call_structural_tag(parser: ToolCallParser, tools: Sequence[FunctionTool], mode: ToolMode,
                             parallel: bool, reasoning: Optional[ReasoningGrammar] = None) -> dict[str, Any]:
    """The structural tag forcing ``mode`` over ``tools`` (``named``: ``tools`` is the one tool).

    Raises:
        ValueError: no tools; or the parser cannot express a tool's schema (pythonic's subset).
    """
    if not tools:
        raise ValueError("a tool-call grammar needs at least one tool")
    tags = [parser.call_tag(t) for t in tools]
    begin, end = parser.wrapper
    calls: dict[str, Any] = tags[0] if mode == "named" else {
        "type": "tags_with_separator", "tags": tags, "separator": parser.separator, "at_least_one": True,
        "stop_after_first": not parallel}
    if mode != "auto":
        fmt = calls if not begin else {"type": "sequence", "elements": [_const(begin), calls, _const(end)]}
    elif begin and parser.call_triggers:
        fmt = _call_triggered_region(parser, tags, parallel)
    elif begin:
        region = {"type": "tag", "begin": begin, "content": calls, "end": end}
        fmt = {"type": "triggered_tags", "triggers": [parser.trigger], "tags": [region], "stop_after_first": True}
    else:
        triggers = auto_triggers(parser, tools) if parser.call_triggers else [parser.trigger]
        fmt = {"type": "triggered_tags", "triggers": triggers, "tags": tags, "stop_after_first": not parallel}
    if reasoning is not None and (reasoning.starts_inside or mode == "auto"):
        block: dict[str, Any] = {"type": "tag", "begin": "" if reasoning.starts_inside else reasoning.start,
                                 "content": {"type": "any_text"}, "end": reasoning.end}
        if not reasoning.starts_inside:
            block = {"type": "optional", "content": block}
        fmt = {"type": "sequence", "elements": [block, _AFTER_REASONING, fmt]}
    return {"type": "structural_tag", "format": fmt}
