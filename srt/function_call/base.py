"""The tool-call parser contract and the one streaming driver every format shares.

A model's output is normal text with *regions* of tool calls in it (``<tool_call>{...}</tool_call>``,
``[TOOL_CALLS] [...]``, ``[f(a=1)]``...). A ``ToolCallParser`` knows one format: where a region may
start (``openers``, ``region_allowed``), what a region holds so far (``scan_region``), the grammar
pieces that force it (``call_tag``, ``separator``, ``wrapper``, ``trigger``) and how to write calls
back into a prompt (``render_calls``).

``ToolCallStream`` turns output chunks into deltas (OpenAI's streaming shape: content text, and per
call its name first, then argument fragments). Its state is a function of the text so far, never of
how the text was chunked: the non-streamed parse is the same driver fed the whole text at once, so
streamed and non-streamed results are equal by construction. Settled parts (finished regions, text
before them) are never scanned again.

Whitespace next to a region belongs to it (it is not content), so ``"<tool_call>..</tool_call>\\n"``
has no content; between text before and text after a region it is kept (``"a <call> b"`` has
content ``"a b"``). Trailing whitespace of content is held back while a region may still follow.
``offsets[k]`` says where call ``k``'s region stands in ``content`` (the length of the content
before it), so the Responses API can order message and call items as they came in the text.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Optional

from radixlm.srt.function_call.function_tool import FunctionTool


@dataclass
class ParsedCall:
    """One call found in the output: ``arguments`` is JSON text (while streaming, a prefix of the
    final text), ``complete`` once the arguments are whole."""

    name: str
    arguments: str
    complete: bool = True


@dataclass
class RegionScan:
    """What a region holds so far. ``status``: ``partial`` (more text may change it; not settled),
    ``done`` (``calls`` are final; the region ends at ``end``) or ``invalid`` (``text[start:end]``
    is normal text after all)."""

    status: Literal["partial", "done", "invalid"]
    calls: list[ParsedCall] = field(default_factory=list)
    end: int = 0


class ToolCallParser(ABC):
    """One tool-call output format (``--tool-call-parser NAME``).

    Attributes:
        name: the flag value. openers: literal texts a region may start with. trigger: the text
        that, in ``auto`` mode, switches the grammar from free text to a forced call (a prefix of
        every call's opening). separator: between two calls. wrapper: ``(begin, end)`` literals
        around all calls of one region ("" when each call is its own region). max_calls: the
        most calls one choice keeps (None: any number); later calls are dropped, as OpenAI's
        ``parallel_tool_calls: false`` allows one. answers_in_content: False where a grammar makes
        the output only calls (no content, ``null``, even when the calls were cut).
    """

    name: ClassVar[str] = "base"
    max_calls: Optional[int] = None
    openers: ClassVar[tuple[str, ...]] = ()
    trigger: ClassVar[str] = ""
    call_triggers: ClassVar[bool] = False  # auto: triggered by the wrapper's opening + a call's, not the opening alone
    separator: ClassVar[str] = "\n"
    wrapper: ClassVar[tuple[str, str]] = ("", "")
    answers_in_content: ClassVar[bool] = True  # False: the output is only calls, so content is null

    def region_allowed(self, text: str, pos: int, final: bool) -> Optional[bool]:
        """Whether the opener at ``pos`` really starts a region: True, False, or None (undecided
        until more text comes; never None when ``final``)."""
        return True

    @abstractmethod
    def scan_region(self, text: str, start: int, final: bool) -> RegionScan:
        """Scan the region whose opener is at ``start``. With ``final`` nothing more will come:
        the answer must be ``done`` or ``invalid``."""

    @abstractmethod
    def call_tag(self, tool: FunctionTool) -> dict[str, Any]:
        """The xgrammar ``tag`` format of one call of ``tool`` (begin, JSON content, end)."""

    @abstractmethod
    def render_calls(self, calls: list[tuple[str, Any]]) -> str:
        """``[(name, arguments object)]`` as this format writes them (history in prompts)."""

    def render_example(self) -> str:
        """How one call looks, for the default tool prompt."""
        return self.render_calls([("<function-name>", {"<argument>": "<value>"})])

    # -- region search ----------------------------------------------------------------------------
    def next_region(self, text: str, start: int, final: bool) -> tuple[int, int]:
        """``(region start or -1, safe end)``: ``text[start:safe end]`` has no region and none can
        begin in it whatever follows (a partial opener at the end is held back)."""
        best, undecided = -1, -1
        for opener in self.openers:
            i = text.find(opener, start)
            while i != -1 and (best == -1 or i < best) and (undecided == -1 or i < undecided):
                ok = self.region_allowed(text, i, final)
                if ok:
                    best = i
                    break
                if ok is None:
                    undecided = i
                    break
                i = text.find(opener, i + 1)
        if undecided != -1 and (best == -1 or undecided < best):
            return -1, undecided
        if best != -1:
            return best, best
        return -1, len(text) if final else len(text) - self._partial_opener(text, start)

    def _partial_opener(self, text: str, start: int) -> int:
        """Length of the longest proper prefix of an opener that ``text[start:]`` ends with."""
        longest = 0
        for opener in self.openers:
            for k in range(min(len(opener) - 1, len(text) - start), longest, -1):
                if text.endswith(opener[:k]):
                    longest = k
                    break
        return longest


class ParserWrapper(ToolCallParser):
    """Another parser's format with a rule on top (``CheckedParser``, ``TriggeredParser``): its markers
    and literals, and by default its region test, scan, grammar tag and rendering."""

    def __init__(self, parser: ToolCallParser):
        self.parser = parser
        self.name, self.openers, self.trigger = parser.name, parser.openers, parser.trigger  # type: ignore[misc]
        self.call_triggers, self.separator, self.wrapper = (  # type: ignore[misc]
            parser.call_triggers, parser.separator, parser.wrapper)

    def region_allowed(self, text: str, pos: int, final: bool) -> Optional[bool]:
        return self.parser.region_allowed(text, pos, final)

    def scan_region(self, text: str, start: int, final: bool) -> RegionScan:
        return self.parser.scan_region(text, start, final)

    def call_tag(self, tool: FunctionTool) -> dict[str, Any]:
        return self.parser.call_tag(tool)

    def render_calls(self, calls: list[tuple[str, Any]]) -> str:
        return self.parser.render_calls(calls)


def new_call_id() -> str:
    """``call_`` + 24 random hex digits (unique per call)."""
    return "call_" + uuid.uuid4().hex[:24]


@dataclass
class CallDelta:
    """A streamed piece of call ``index``: ``id`` and ``name`` on its first delta only."""

    index: int
    arguments: str
    id: Optional[str] = None
    name: Optional[str] = None

    def to_openai(self) -> dict[str, Any]:
        """OpenAI's ``delta.tool_calls[i]`` (absent keys left out, so clients merge fragments)."""
        out: dict[str, Any] = {"index": self.index}
        function: dict[str, Any] = {"arguments": self.arguments}
        if self.id is not None:
            out["id"], out["type"] = self.id, "function"
            function = {"name": self.name, "arguments": self.arguments}
        out["function"] = function
        return out


@dataclass
class StreamDelta:
    """New content text and call pieces since the previous delta."""

    text: str = ""
    calls: list[CallDelta] = field(default_factory=list)


class ToolCallStream:
    """Incremental parse of one choice's output (see the module docstring)."""

    def __init__(self, parser: ToolCallParser):
        self.parser = parser
        self._text = ""
        self._pos = 0  # everything before is settled
        self._settled = ""  # content before ``_pos``
        self._after_region = False  # only whitespace since the last region (held in ``_gap``)
        self._gap = ""
        self._done: list[ParsedCall] = []
        self._done_offsets: list[int] = []
        self._sent_text = 0
        self._sent_args: list[int] = []
        self.ids: list[str] = []
        self.content = ""
        self.calls: list[ParsedCall] = []
        self.offsets: list[int] = []  # per call: where in ``content`` its region stands

    def feed(self, text: str) -> StreamDelta:
        """Add output text; return what is new."""
        self._text += text
        return self._emit(final=False)

    def finish(self) -> StreamDelta:
        """The output is complete: flush held text, settle the last region."""
        return self._emit(final=True)

    def tool_calls(self) -> list[dict[str, Any]]:
        """OpenAI's ``message.tool_calls`` of the calls so far."""
        return [{"id": self.ids[k], "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for k, c in enumerate(self.calls)]

    def _settle_text(self, piece: str) -> None:
        if self._after_region:  # whitespace right after a region is its own unless text follows
            self._gap += piece
            if not self._gap.strip():
                return
            piece, self._gap, self._after_region = self._gap, "", False
            if not self._settled:
                piece = piece.lstrip()
        self._settled += piece

    def _snapshot(self, final: bool) -> tuple[str, list[ParsedCall], list[int]]:
        text, pos = self._text, self._pos
        pending: list[ParsedCall] = []
        while True:
            start, safe = self.parser.next_region(text, pos, final)
            if start < 0:
                self._settle_text(text[pos:safe])
                pos = safe
                break
            self._settle_text(text[pos:start])
            scan = self.parser.scan_region(text, start, final)
            if scan.status == "partial":
                if final:
                    raise AssertionError(f"{type(self.parser).__name__}.scan_region left a region open at the end")
                pos, pending = start, scan.calls
                break
            end = max(scan.end, start + 1)
            if scan.status == "invalid":
                self._settle_text(text[start:end])
            else:
                self._settled = self._settled.rstrip()  # never sent: trailing whitespace is held
                kept = scan.calls
                if self.parser.max_calls is not None:  # calls past the limit are dropped, not shown
                    kept = kept[:max(0, self.parser.max_calls - len(self._done))]
                self._done.extend(kept)
                self._done_offsets.extend([len(self._settled)] * len(kept))
                self._after_region, self._gap = True, ""
            pos = end
        self._pos = pos
        if self.parser.max_calls is not None:
            pending = pending[:max(0, self.parser.max_calls - len(self._done))]
        content = self._settled.rstrip() if pending else self._settled
        calls = self._done + pending
        offsets = self._done_offsets + [len(content)] * len(pending)
        if final:  # a call cut before its arguments began still gets a JSON object
            calls = [c if c.arguments else ParsedCall(c.name, "{}", c.complete) for c in calls]
        return content, calls, offsets

    def _emit(self, final: bool) -> StreamDelta:
        content, calls, offsets = self._snapshot(final)
        if not final:
            content = content.rstrip() if content.strip() else ""
        out = StreamDelta(text=content[self._sent_text:])
        self._sent_text = max(self._sent_text, len(content))
        for k, call in enumerate(calls):
            if k == len(self._sent_args):
                self.ids.append(new_call_id())
                self._sent_args.append(0)
                out.calls.append(CallDelta(k, "", self.ids[k], call.name))
            piece = call.arguments[self._sent_args[k]:]
            if piece:
                out.calls.append(CallDelta(k, piece))
                self._sent_args[k] = len(call.arguments)
        self.content, self.calls, self.offsets = content, calls, offsets
        return out
