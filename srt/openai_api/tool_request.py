"""``tools`` / ``tool_choice`` / ``parallel_tool_calls`` of a chat request -> a ``ToolPlan``: which
tools the prompt lists, whether the output is parsed for calls, and the grammar that forces them.

Follows OpenAI's contract (``tool_choice`` defaults to ``auto`` with tools, ``none`` without) and
SGLang's (``required`` and a named function are constrained); beyond both, ``auto`` is constrained
too, from the parser's trigger on (``function_call.grammar``). Everything is checked here, before
generation, as an OpenAI 400 naming the field:

* a function name outside OpenAI's ``[A-Za-z0-9_-]{1,64}``, or used twice;
* ``parameters`` that is not a JSON Schema of ``type: "object"``, or one the grammar backend cannot
  compile (``constrained.xgrammar_backend.lower_structural_tag``, tokenizer-free, cached per tag);
* ``tool_choice`` ``required`` or named without tools, or naming an unknown function;
* ``required``/named together with another output constraint (``response_format``, ``regex``,
  ``ebnf``), or on a server whose grammar backend has no structural tags (outlines, none).

With another constraint and ``auto``, that constraint wins and the output is still parsed for calls.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Optional

from radixlm.srt.function_call import (FunctionTool, ReasoningGrammar, ToolCallParser, ToolMode,
                                       tool_call_structural_tag)
from radixlm.srt.function_call.function_tool import NO_PARAMETERS
from radixlm.srt.function_call.checked import CheckedParser
from radixlm.srt.function_call.forced import ForcedParser
from radixlm.srt.function_call.triggered import TriggeredParser
from radixlm.srt.function_call.pythonic_grammar import UnsupportedSchema
from radixlm.srt.openai_api.protocol import ChatCompletionRequest, OpenAIError

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass
class ToolPlan:
    """``mode``: none | auto | required | named. ``tools``: what the prompt lists (none: nothing).
    ``structural_tag``: the grammar (JSON text) or None. ``parse``: read calls out of the output."""

    mode: str = "none"
    tools: list[FunctionTool] = field(default_factory=list)
    parallel: bool = True
    structural_tag: Optional[str] = None

    @property
    def parse(self) -> bool:
        return self.mode != "none"


class ToolValidator:
    """Checks structural tags with the grammar library before generation (an LRU of the tags seen:
    agents send the same tools with every request). ``backend``: ``--grammar-backend``."""

    def __init__(self, backend: str, any_whitespace: bool = False, max_entries: int = 256):
        self.backend = backend
        self.any_whitespace = any_whitespace
        self.max_entries = max_entries
        self._ok: OrderedDict[str, None] = OrderedDict()
        if backend == "xgrammar":
            import xgrammar  # noqa: F401 - loaded at startup, not on the first tools request

    @property
    def supports_tags(self) -> bool:
        return self.backend == "xgrammar"

    def check(self, tag: str) -> Optional[str]:
        """None if ``tag`` compiles, else the compiler's message."""
        if tag in self._ok:
            self._ok.move_to_end(tag)
            return None
        from radixlm.constrained import GrammarError
        from radixlm.constrained.xgrammar_backend import lower_structural_tag

        try:
            lower_structural_tag(tag, self.any_whitespace)
        except GrammarError as e:
            return str(e)
        self._ok[tag] = None
        while len(self._ok) > self.max_entries:
            self._ok.popitem(last=False)
        return None


def plan_tools(req: ChatCompletionRequest, tools: list[FunctionTool], parser: ToolCallParser,
               validator: ToolValidator, reasoning: Optional[ReasoningGrammar],
               other_constraint: Optional[str]) -> ToolPlan:
    """The request's ``ToolPlan``.

    Args:
        tools: ``request_tools(req)``. parser: the server's tool-call parser. validator: the
            grammar check. reasoning: the reasoning block the output starts with (the grammar
            applies after it), or None. other_constraint: the request field of another output
            constraint, or None.
    Raises:
        OpenAIError(400): see the module docstring.
    """
    mode, named = tool_mode(req, tools)
    if mode == "none":
        return ToolPlan()
    parallel = req.parallel_tool_calls is not False
    plan = ToolPlan(mode, tools, parallel)
    forced = mode in ("required", "named")
    if forced and other_constraint is not None:
        raise OpenAIError(f"tool_choice {mode!r} constrains the output to tool calls; it cannot be combined with "
                          f"{other_constraint}", 400, other_constraint)
    if other_constraint is not None or not validator.supports_tags:
        if forced:
            raise OpenAIError(f"tool_choice {mode!r} needs grammar-constrained decoding with structural tags; "
                              f"this server runs --grammar-backend {validator.backend} (use xgrammar)", 400,
                              "tool_choice")
        return plan  # parsed, not constrained
    chosen = [t for t in tools if t.name == named] if mode == "named" else tools
    tag = _structural_tag(parser, chosen, mode, parallel, reasoning, tools)  # type: ignore[arg-type]
    error = validator.check(tag)
    if error is not None:
        for i, tool in enumerate(tools):  # which tool: check them one by one
            one = _structural_tag(parser, [tool], "named", False, None, tools)
            if validator.check(one) is not None:
                raise OpenAIError(f"tools.{i}.function.parameters: the schema cannot be used for constrained "
                                  f"decoding: {validator.check(one)}", 400, f"tools.{i}.function.parameters")
        raise OpenAIError(f"tools: the tool-call grammar cannot be compiled: {error}", 400, "tools")
    plan.structural_tag = tag
    return plan


def output_tool_parser(parser: ToolCallParser, plan: ToolPlan) -> Optional[ToolCallParser]:
    """How the output's calls are read under ``plan`` (None: not at all): with no grammar only calls the
    request allows count (``CheckedParser``); in ``auto`` mode under a grammar whose triggers are whole
    call openings, regions start only there (``TriggeredParser``); with a forced call, a region the
    token limit cut is dropped (``ForcedParser``); else the format's parser."""
    if not plan.parse:
        return None
    if plan.structural_tag is None:
        return CheckedParser(parser, plan.tools, plan.parallel)
    if plan.mode == "auto" and parser.call_triggers:
        return TriggeredParser(parser, plan.tools)
    if plan.mode in ("required", "named"):
        return ForcedParser(parser)
    return parser


def _structural_tag(parser: ToolCallParser, chosen: list[FunctionTool], mode: ToolMode, parallel: bool,
                    reasoning: Optional[ReasoningGrammar], tools: list[FunctionTool]) -> str:
    try:
        tag = tool_call_structural_tag(parser, chosen, mode, parallel, reasoning)
    except UnsupportedSchema as e:
        i = next((k for k, t in enumerate(tools) if t in chosen), 0)
        raise OpenAIError(f"tools.{i}.function.parameters: {e}", 400, f"tools.{i}.function.parameters") from None
    return json.dumps(tag, ensure_ascii=False)


def request_tools(req: ChatCompletionRequest) -> list[FunctionTool]:
    """The request's tools, validated (names, parameters). Raises ``OpenAIError(400)``."""
    out: list[FunctionTool] = []
    seen: set[str] = set()
    for i, tool in enumerate(req.tools or []):
        fn = tool.function
        where = f"tools.{i}.function"
        if not _NAME.fullmatch(fn.name):
            raise OpenAIError(f"{where}.name: {fn.name!r} is not a valid function name (letters, digits, '_' and "
                              "'-', at most 64)", 400, f"{where}.name")
        if fn.name in seen:
            raise OpenAIError(f"{where}.name: the function name {fn.name!r} is used by more than one tool", 400,
                              f"{where}.name")
        seen.add(fn.name)
        params = fn.parameters if fn.parameters is not None else dict(NO_PARAMETERS)
        if params.get("type") != "object":
            raise OpenAIError(f"{where}.parameters: must be a JSON Schema of type \"object\" (the arguments object), "
                              f"got type {params.get('type')!r}", 400, f"{where}.parameters")
        _check_json(params, f"{where}.parameters")
        out.append(FunctionTool(fn.name, params, fn.description, fn.strict))
    return out


def _check_json(value: Any, where: str) -> None:
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        raise OpenAIError(f"{where}: NaN and infinite numbers are not JSON", 400, where) from None


def tool_mode(req: ChatCompletionRequest, tools: list[FunctionTool]) -> tuple[str, Optional[str]]:
    """``(mode, named function)`` with OpenAI's defaults: none | auto | required | named.
    Raises ``OpenAIError(400)`` for ``required``/named without tools or an unknown name."""
    choice = req.tool_choice
    if choice is None:
        return ("auto" if tools else "none"), None
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise OpenAIError(f"tool_choice must be 'none', 'auto', 'required' or {{\"type\": \"function\", "
                              f"\"function\": {{\"name\": ...}}}}, got {choice!r}", 400, "tool_choice")
        if choice == "required" and not tools:
            raise OpenAIError("tool_choice 'required' needs tools", 400, "tool_choice")
        return (choice if tools else "none"), None
    name = choice.function.name
    if not tools:
        raise OpenAIError(f"tool_choice names the function {name!r}, but the request has no tools", 400,
                          "tool_choice")
    if name not in {t.name for t in tools}:
        raise OpenAIError(f"tool_choice names the function {name!r}, which is not among the tools "
                          f"({', '.join(t.name for t in tools)})", 400, "tool_choice.function.name")
    return "named", name
