"""Tool (function) calling: parsers of the common output formats, their streaming driver and the
grammars that make calls valid by construction (SGLang's ``srt/function_call``).

* ``create_tool_parser(name)``: ``--tool-call-parser`` values ``hermes``, ``qwen25``, ``llama3``,
  ``mistral``, ``pythonic`` (one module each, behind ``base.ToolCallParser``).
* ``detect_tool_parser(template)``: the parser a chat template's own text names, or None.
* ``ToolCallStream`` (``base``): output chunks -> content and call deltas; the same driver parses
  non-streamed output, so both agree.
* ``tool_call_structural_tag`` (``grammar``): the xgrammar structural tag forcing a format.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Optional

from radixlm.srt.function_call.base import CallDelta, ParsedCall, StreamDelta, ToolCallParser, ToolCallStream
from radixlm.srt.function_call.grammar import ReasoningGrammar, ToolMode, tool_call_structural_tag
from radixlm.srt.function_call.hermes import HermesParser, Qwen25Parser
from radixlm.srt.function_call.llama3 import Llama3Parser
from radixlm.srt.function_call.mistral import MistralParser
from radixlm.srt.function_call.pythonic import PythonicParser
from radixlm.srt.function_call.function_tool import FunctionTool

TOOL_CALL_PARSERS = MappingProxyType({
    cls.name: cls for cls in (HermesParser, Qwen25Parser, Llama3Parser, MistralParser, PythonicParser)})
DEFAULT_TOOL_CALL_PARSER = "hermes"  # the format of the default tool rendering

__all__ = [
    "CallDelta", "DEFAULT_TOOL_CALL_PARSER", "FunctionTool", "ParsedCall", "ReasoningGrammar", "StreamDelta",
    "TOOL_CALL_PARSERS", "ToolCallParser", "ToolCallStream", "ToolMode", "create_tool_parser",
    "detect_tool_parser", "tool_call_structural_tag",
]


def create_tool_parser(name: str) -> ToolCallParser:
    """The parser named ``name``.

    Raises:
        ValueError: unknown name (the message lists the known ones).
    """
    try:
        return TOOL_CALL_PARSERS[name]()
    except KeyError:
        raise ValueError(f"unknown tool-call parser {name!r}; expected one of {', '.join(TOOL_CALL_PARSERS)}") from None


def detect_tool_parser(template: Optional[str]) -> Optional[str]:
    """The parser whose format a chat template's source writes (its markers), or None.

    ``[TOOL_CALLS]`` -> mistral; ``<tool_call>`` -> qwen25 with ChatML turns, else hermes;
    ``<|python_start|>`` or a ``[func_name(`` example -> pythonic; ``<|python_tag|>`` or a Llama 3
    header with ``"parameters"`` -> llama3.
    """
    if not template:
        return None
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<tool_call>" in template:
        return "qwen25" if "<|im_start|>" in template else "hermes"
    if "<|python_start|>" in template or "[func_name" in template:
        return "pythonic"
    if "<|python_tag|>" in template or ("<|start_header_id|>" in template and '"parameters"' in template):
        return "llama3"
    return None
