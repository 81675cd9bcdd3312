"""One response's output items, and its stream events, from the model's output text.

``OutputBuilder`` runs the text through the chat route's parsers (``chat_output.ChoiceOutput``:
reasoning split, then tool calls) and turns the parts into Responses output items:

* ``reasoning``: the reasoning parser's split, first (``content: [{"type": "reasoning_text"}]``);
* ``message``: text, one ``output_text`` part;
* ``function_call``: one per call (``call_id`` = the chat route's ``call_...`` id).

Items come in the order of the text: the calls' ``offsets`` (where each call's region stands in
the content) cut the content into the text before, between and after calls, so ``"a <call> b"`` is
a message ``a``, the call, a message ``b``. The parsers' state depends only on the text, never on
its chunking, and the items only on that state, so the streamed items are exactly the non-streamed
ones: the JSON path is the same builder fed the whole text at once, without events.

With ``stream=True`` each step also writes OpenAI's events, ``sequence_number`` counting from 0:
``response.output_item.added`` / ``.done`` around each item; for a message
``response.content_part.added``, ``response.output_text.delta``..., ``response.output_text.done``,
``response.content_part.done``; for a call ``response.function_call_arguments.delta``...,
``.done``; for reasoning the ``response.reasoning_text.*`` events. One item is open at a time; an
item closes when the next one opens or the output ends.
"""

from __future__ import annotations

import uuid
from typing import Any, Optional

import msgspec

from radixlm.srt.openai_api.chat_output import ChoiceOutput, OutputDelta


def item_id(prefix: str) -> str:
    """``msg_`` / ``fc_`` / ``rs_`` / ``resp_`` + 32 hex digits."""
    return f"{prefix}_{uuid.uuid4().hex}"


def sse_event(event: dict[str, Any]) -> bytes:
    """One server-sent event with an ``event:`` line naming its type (as OpenAI sends them)."""
    return b"event: " + event["type"].encode() + b"\ndata: " + msgspec.json.encode(event) + b"\n\n"


class OutputBuilder:
    """Output items of one response (``items``: wire dicts, in order) and, when streaming, its events.

    ``output``: the parsers (``ChoiceOutput``). ``stream``: record events (``drain`` hands them out).
    """

    def __init__(self, output: ChoiceOutput, stream: bool):
        self.out = output
        self.stream = stream
        self.items: list[dict[str, Any]] = []
        self.reasoning = ""
        self._events: list[bytes] = []
        self._seq = 0
        self._open: Optional[int] = None  # index of the open item
        self._content_seen = 0  # characters of the parsers' content consumed so far
        self._after_call = False  # the next text starts a segment after a call (its leading blanks go)
        self._call_items: dict[int, int] = {}  # call index -> item index

    # ---- events -------------------------------------------------------------------------------------
    def event(self, kind: str, **fields: Any) -> None:
        """Record one event (streaming only), encoded at once (a snapshot of the items it carries);
        ``sequence_number`` is added."""
        if self.stream:
            self._events.append(sse_event({"type": kind, **fields, "sequence_number": self._seq}))
            self._seq += 1

    def drain(self) -> list[bytes]:
        """The events recorded since the last call."""
        out, self._events = self._events, []
        return out

    # ---- text in ------------------------------------------------------------------------------------
    def feed(self, text: str) -> None:
        """New output text."""
        if text:
            self._add(self.out.feed(text))

    def finish(self, incomplete: bool) -> None:
        """The output ended (``incomplete``: cut by the token limit or aborted): flush held text and
        close the open item."""
        self._add(self.out.finish())
        self._close(incomplete)

    def _add(self, delta: OutputDelta) -> None:
        if delta.reasoning:
            self._reasoning(delta.reasoning)
        text = delta.content
        offsets = self.out.call_offsets
        for call in delta.tool_calls:
            k = call["index"]
            if "id" in call:  # a new call: the content before it first
                cut = max(0, offsets[k] - self._content_seen)
                if cut:
                    self._text(text[:cut])
                    text = text[cut:]
                self._open_call(k, call["id"], call["function"]["name"])
            if call["function"]["arguments"]:
                self._arguments(k, call["function"]["arguments"])
        if text:
            self._text(text)

    # ---- items --------------------------------------------------------------------------------------
    def _new_item(self, item: dict[str, Any]) -> int:
        self.items.append(item)
        self._open = len(self.items) - 1
        self.event("response.output_item.added", output_index=self._open, item=item)
        return self._open

    def _text(self, piece: str) -> None:
        self._content_seen += len(piece)
        if self._after_call:
            piece = piece.lstrip()
            if not piece:
                return
        open_item = self.items[self._open] if self._open is not None else None
        if open_item is None or open_item["type"] != "message":
            self._close(False)
            self._after_call = False
            i = self._new_item({"type": "message", "id": item_id("msg"), "role": "assistant", "status": "in_progress",
                                "content": []})
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            self.event("response.content_part.added", item_id=self.items[i]["id"], output_index=i, content_index=0,
                       part=part)
            self.items[i]["content"].append(part)
        i = self._open
        self.items[i]["content"][0]["text"] += piece
        self.event("response.output_text.delta", item_id=self.items[i]["id"], output_index=i, content_index=0,
                   delta=piece, logprobs=[])

    def _reasoning(self, piece: str) -> None:
        self.reasoning += piece
        open_item = self.items[self._open] if self._open is not None else None
        if open_item is None or open_item["type"] != "reasoning":
            self._close(False)
            i = self._new_item({"type": "reasoning", "id": item_id("rs"), "summary": [], "content": [],
                                "encrypted_content": None, "status": "in_progress"})
            part = {"type": "reasoning_text", "text": ""}
            self.event("response.content_part.added", item_id=self.items[i]["id"], output_index=i, content_index=0,
                       part=part)
            self.items[i]["content"].append(part)
        i = self._open
        self.items[i]["content"][0]["text"] += piece
        self.event("response.reasoning_text.delta", item_id=self.items[i]["id"], output_index=i, content_index=0,
                   delta=piece)

    def _open_call(self, k: int, call_id: str, name: str) -> None:
        self._close(False)
        self._after_call = True
        self._call_items[k] = self._new_item({"type": "function_call", "id": item_id("fc"), "call_id": call_id,
                                              "name": name, "arguments": "", "status": "in_progress"})

    def _arguments(self, k: int, piece: str) -> None:
        i = self._call_items[k]
        self.items[i]["arguments"] += piece
        self.event("response.function_call_arguments.delta", item_id=self.items[i]["id"], output_index=i,
                   delta=piece)

    def _close(self, incomplete: bool) -> None:
        """Close the open item (``incomplete``: the output was cut while it was open)."""
        i, self._open = self._open, None
        if i is None:
            return
        item = self.items[i]
        status = "incomplete" if incomplete else "completed"
        if item["type"] == "function_call":
            k = next(c for c, j in self._call_items.items() if j == i)
            if not self.out.call_complete(k):
                status = "incomplete"
            self.event("response.function_call_arguments.done", item_id=item["id"], output_index=i,
                       name=item["name"], arguments=item["arguments"])
        else:
            part = item["content"][0]
            kind = "response.output_text.done" if item["type"] == "message" else "response.reasoning_text.done"
            extra = {"logprobs": []} if item["type"] == "message" else {}
            self.event(kind, item_id=item["id"], output_index=i, content_index=0, text=part["text"], **extra)
            self.event("response.content_part.done", item_id=item["id"], output_index=i, content_index=0,
                       part=part)
        item["status"] = status
        self.event("response.output_item.done", output_index=i, item=item)

