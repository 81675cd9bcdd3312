"""Reasoning parsers (``--reasoning-parser``, SGLang's flag): split a model's thinking from its answer.

Models such as DeepSeek-R1 and Qwen3 write ``<think> reasoning </think> answer``. The chat route
puts the reasoning in ``message.reasoning_content`` (``delta.reasoning_content`` when streaming) and
the answer in ``content``; ``separate_reasoning: false`` in a request keeps the raw text in
``content``.

Where the output starts: inside the reasoning when the parser forces it (``deepseek-r1``,
``qwen3-thinking``: their templates open the block in the prompt) or when the prompt itself ends
with the start tag (a template that writes ``<think>\\n`` after the assistant header); otherwise
a reasoning block is recognised only at the very start of the output. A start tag the model writes
anyway at the start is dropped. Whitespace right after the end tag is not content.

``ReasoningStream`` is chunk-boundary safe: a tag split over chunks (``<th`` + ``ink>``) is held
until it is known, so streamed pieces concatenate to the non-streamed split.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Optional


@dataclass(frozen=True)
class ReasoningFormat:
    """One family's tags; ``force``: the output always begins inside the reasoning block."""

    name: str
    start: str = "<think>"
    end: str = "</think>"
    force: bool = False


REASONING_PARSERS = MappingProxyType({f.name: f for f in (
    ReasoningFormat("deepseek-r1", force=True),
    ReasoningFormat("qwen3"),
    ReasoningFormat("qwen3-thinking", force=True),
    ReasoningFormat("deepseek-v3"),
    ReasoningFormat("glm45"),
    ReasoningFormat("kimi", start="◁think▷", end="◁/think▷"),
)})


def get_reasoning_format(name: str) -> ReasoningFormat:
    """The format named ``name``. Raises ``ValueError`` (listing the known names) if unknown."""
    try:
        return REASONING_PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown reasoning parser {name!r}; expected one of {', '.join(REASONING_PARSERS)}") from None


def starts_in_reasoning(fmt: ReasoningFormat, prompt: str) -> bool:
    """Whether the output of ``prompt`` begins inside the reasoning block."""
    return fmt.force or prompt.rstrip().endswith(fmt.start)


def _held(text: str, tag: str) -> int:
    """Length of the longest proper prefix of ``tag`` that ``text`` ends with."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


class ReasoningStream:
    """Incremental split of one choice's output into ``(reasoning, content)`` pieces.

    Args:
        fmt: the tags.
        in_reasoning: the output begins inside the block (``starts_in_reasoning``).
    """

    def __init__(self, fmt: ReasoningFormat, in_reasoning: bool):
        self.fmt = fmt
        self._in = in_reasoning
        self._at_start = True  # a start tag (and whitespace before it) may still come
        self._after_end = False  # only whitespace since the end tag
        self._buf = ""
        self.reasoning = ""
        self.content = ""

    def feed(self, text: str) -> tuple[str, str]:
        """Add output text; return the new ``(reasoning, content)`` pieces."""
        self._buf += text
        return self._drain(final=False)

    def finish(self) -> tuple[str, str]:
        """The output is complete: release held text."""
        return self._drain(final=True)

    def _drain(self, final: bool) -> tuple[str, str]:
        reasoning, content = "", ""
        while self._buf:
            if self._at_start:
                head = self._buf.lstrip()
                if head.startswith(self.fmt.start):
                    self._buf, self._in, self._at_start = head[len(self.fmt.start):], True, False
                    continue
                if not final and self.fmt.start.startswith(head):
                    break  # maybe the start tag, still arriving
                self._at_start = False
            if self._in:
                end = self._buf.find(self.fmt.end)
                if end == -1:
                    keep = 0 if final else _held(self._buf, self.fmt.end)
                    reasoning += self._buf[:len(self._buf) - keep]
                    self._buf = self._buf[len(self._buf) - keep:]
                    break
                reasoning += self._buf[:end]
                self._buf, self._in, self._after_end = self._buf[end + len(self.fmt.end):], False, True
                continue
            if self._after_end:
                stripped = self._buf.lstrip()
                if not stripped:
                    self._buf = ""
                    break
                self._buf, self._after_end = stripped, False
            content += self._buf
            self._buf = ""
        self.reasoning += reasoning
        self.content += content
        return reasoning, content

    @property
    def reasoning_content(self) -> Optional[str]:
        """The reasoning so far, None when there was none."""
        return self.reasoning or None
