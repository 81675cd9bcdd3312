"""One chat choice's output -> OpenAI's message parts: reasoning, content and tool calls.

The raw text runs through the reasoning parser first (when the server has one and the request
keeps ``separate_reasoning``), then its answer part through the tool-call parser (when the request
has tools and ``tool_choice`` is not ``none``). Both are incremental and chunk-independent, so the
non-streamed message is the streamed deltas put together (``feed(all) + finish()``).

``finish_reason`` is ``tool_calls`` when the output ended naturally (a stop token or the grammar's
end) with at least one call, as OpenAI and SGLang report it; ``length`` stays ``length``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from radixlm.srt.function_call import ToolCallParser, ToolCallStream
from radixlm.srt.openai_api.protocol import ChatResponseMessage, DeltaMessage
from radixlm.srt.reasoning_parser import ReasoningFormat, ReasoningStream


@dataclass
class OutputDelta:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls)

    def message(self) -> DeltaMessage:
        return DeltaMessage(content=self.content or None, reasoning_content=self.reasoning or None,
                            tool_calls=self.tool_calls or None)


class ChoiceOutput:
    """Parsers of one choice. ``reasoning``: (format, output starts inside the block) or None;
    ``tool_parser``: None when the output is not parsed for calls."""

    def __init__(self, reasoning: Optional[tuple[ReasoningFormat, bool]], tool_parser: Optional[ToolCallParser]):
        self._reasoning = ReasoningStream(*reasoning) if reasoning is not None else None
        self._tools = ToolCallStream(tool_parser) if tool_parser is not None else None
        self._content = ""

    def feed(self, text: str) -> OutputDelta:
        """New output text -> the new parts."""
        return self._step(text, final=False)

    def finish(self) -> OutputDelta:
        """The output ended: what was held back."""
        return self._step("", final=True)

    def _step(self, text: str, final: bool) -> OutputDelta:
        out = OutputDelta()
        answer = text
        if self._reasoning is not None:
            out.reasoning, answer = self._reasoning.finish() if final else self._reasoning.feed(text)
        if self._tools is None:
            out.content = answer
            self._content += answer
            return out
        pieces = [self._tools.feed(answer)] if answer else []
        if final:
            pieces.append(self._tools.finish())
        for p in pieces:
            out.content += p.text
            out.tool_calls += [c.to_openai() for c in p.calls]
        return out

    @property
    def call_offsets(self) -> list[int]:
        """Per call so far: the length of the content before it (``ToolCallStream.offsets``)."""
        return self._tools.offsets if self._tools is not None else []

    def call_complete(self, k: int) -> bool:
        """Whether call ``k``'s arguments are whole (not cut by the token limit)."""
        return self._tools is not None and k < len(self._tools.calls) and self._tools.calls[k].complete

    @property
    def has_tool_calls(self) -> bool:
        return self._tools is not None and bool(self._tools.calls)

    def message(self) -> ChatResponseMessage:
        """The whole message (after ``finish``)."""
        reasoning = self._reasoning.reasoning_content if self._reasoning is not None else None
        if self._tools is None:
            content: Optional[str] = self._content
            calls = None
        else:
            content, calls = self._tools.content, (self._tools.tool_calls() or None)
        if not content and (calls or reasoning or (self._tools is not None and not self._tools.parser.answers_in_content)):
            content = None
        return ChatResponseMessage(content=content, reasoning_content=reasoning, tool_calls=calls)

    def finish_reason(self, reason: Optional[str]) -> Optional[str]:
        """The OpenAI finish reason for the native one."""
        return "tool_calls" if reason == "stop" and self.has_tool_calls else reason
