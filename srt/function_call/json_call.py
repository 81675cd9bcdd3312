"""A call written as a JSON object, ``{"name": ..., "arguments": {...}}`` (``parameters`` is
accepted for ``arguments``): the body of the hermes, llama3 and mistral formats."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional

from radixlm.srt.function_call.base import ParsedCall
from radixlm.srt.function_call.json_scan import scan_object

ARGUMENT_KEYS = ("arguments", "parameters")


@dataclass
class CallObject:
    """``call``: None until the name is known. ``end``: after the closing ``}``. ``error``: the
    offending index once the text stopped being a call object (the call, if named, is final)."""

    call: Optional[ParsedCall]
    end: Optional[int]
    error: Optional[int]

    @property
    def finished(self) -> bool:
        return self.end is not None or self.error is not None


def scan_call_object(text: str, i: int) -> CallObject:
    """Scan the call object starting at ``text[i] == '{'`` as far as ``text`` goes.

    Arguments are the raw JSON text of the ``arguments`` value (a prefix of it while unfinished;
    a value given as a JSON string is decoded and only reported once whole); ``"{}"`` when the
    object has none.
    """
    obj = scan_object(text, i)
    error = obj.error
    name_member = obj.get("name")
    name: Optional[str] = None
    if name_member is not None and name_member.end is not None:
        value = json.loads(text[name_member.start:name_member.end])
        if isinstance(value, str):
            name = value
        elif error is None:
            error = name_member.start
    if name is None:
        return CallObject(None, obj.end, error)
    finished = obj.end is not None or error is not None
    member = obj.get(*ARGUMENT_KEYS)
    if member is None:
        arguments, complete = ("{}" if finished else ""), finished
    elif member.end is None:
        stop = error if error is not None else len(text)
        arguments = "" if text[member.start] == '"' else text[member.start:stop]
        complete = error is not None
    else:
        raw = text[member.start:member.end]
        arguments, complete = (json.loads(raw) if raw.startswith('"') else raw), True
    if finished and not arguments:
        arguments = "{}"
    return CallObject(ParsedCall(name, arguments, complete), obj.end, error)
