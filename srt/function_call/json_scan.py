"""Scanning JSON that may still be arriving: where a value ends, or that it has not ended yet.

The tool-call parsers read model output one chunk at a time. For a text that is a prefix of the
final output they need, at any index: the end of the JSON value starting there, ``None`` when the
text stops inside it (more may come), or ``ScanError`` (with the offending index) when no
continuation can make it JSON. Strings and scalars are checked with ``json.loads``; arrays and
objects only for balanced brackets and strings, so where a container ends is known the moment its
closing bracket arrives (its text is the call's arguments, valid or not, as the model wrote them).
Every error is found at the index of the character that causes it, so the text before an error is
exactly what a streaming client has already seen.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Optional

_WS = " \t\r\n"
_SCALAR = re.compile(r"[-+0-9.eEa-z]*")  # the characters of numbers, true, false and null
_CLOSER = {"{": "}", "[": "]"}


class ScanError(ValueError):
    """The text cannot be the beginning of the JSON expected here; ``pos`` is the offending index."""

    def __init__(self, message: str, pos: int):
        super().__init__(message)
        self.pos = pos


def skip_ws(text: str, i: int) -> int:
    """The first index at or after ``i`` that is not JSON whitespace (``len(text)`` if none)."""
    n = len(text)
    while i < n and text[i] in _WS:
        i += 1
    return i


def scan_string(text: str, i: int) -> Optional[int]:
    """End (exclusive) of the JSON string starting at ``text[i] == '"'``; None if unterminated."""
    j, n = i + 1, len(text)
    while j < n:
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if c == '"':
            return j + 1
        j += 1
    return None


def scan_value(text: str, i: int) -> Optional[int]:
    """End (exclusive) of the JSON value starting at ``text[i]`` (no leading whitespace).

    Returns None when ``text`` ends inside the value (a number at the very end counts as
    unfinished: more digits may follow). Raises ``ScanError`` when it cannot be JSON.
    """
    n = len(text)
    if i >= n:
        return None
    c = text[i]
    if c in _CLOSER:
        return _scan_container(text, i)
    if c == '"':
        end = scan_string(text, i)
    else:
        m = _SCALAR.match(text, i)
        if m.end() == i:
            raise ScanError(f"unexpected character {c!r} where a JSON value should start", i)
        end = m.end() if m.end() < n else None
    if end is None:
        return None
    try:
        json.loads(text[i:end])
    except ValueError as e:
        raise ScanError(f"not JSON: {e}", end - 1 if c == '"' else end) from None
    return end


def _scan_container(text: str, i: int) -> Optional[int]:
    stack = [_CLOSER[text[i]]]
    j, n = i + 1, len(text)
    while j < n:
        c = text[j]
        if c == '"':
            end = scan_string(text, j)
            if end is None:
                return None
            j = end
            continue
        if c in _CLOSER:
            stack.append(_CLOSER[c])
        elif c in "}]":
            if c != stack.pop():
                raise ScanError(f"mismatched {c!r}", j)
            if not stack:
                return j + 1
        j += 1
    return None


@dataclass
class Member:
    """One member of a JSON object: ``key`` and the value's span; ``end`` None while unfinished."""

    key: str
    start: int
    end: Optional[int]

    def value(self, text: str) -> Any:
        """The decoded value (only for a finished member)."""
        assert self.end is not None
        return json.loads(text[self.start:self.end])


@dataclass
class ObjectScan:
    """The members seen so far of an object; ``end`` (exclusive) once the object is closed;
    ``error`` (the offending index) once the text cannot continue into an object; the members
    before it are kept, the last one unfinished if the error is inside its value."""

    members: list[Member] = field(default_factory=list)
    end: Optional[int] = None
    error: Optional[int] = None

    def get(self, *keys: str) -> Optional[Member]:
        """The first member named one of ``keys`` (in the order of ``keys``)."""
        for key in keys:
            for m in self.members:
                if m.key == key:
                    return m
        return None


def scan_object(text: str, i: int) -> ObjectScan:
    """The members of the object starting at ``text[i] == '{'``, as far as ``text`` goes."""
    out = ObjectScan()
    try:
        _scan_members(text, i, out)
    except ScanError as e:
        out.error = e.pos
    return out


def _scan_members(text: str, i: int, out: ObjectScan) -> None:
    n = len(text)
    if i >= n or text[i] != "{":
        raise ScanError("expected '{'", i)
    j = skip_ws(text, i + 1)
    if j < n and text[j] == "}":
        out.end = j + 1
        return
    while j < n:
        if text[j] != '"':
            raise ScanError(f"expected a key, got {text[j]!r}", j)
        key_end = scan_string(text, j)
        if key_end is None:
            return
        try:
            key = json.loads(text[j:key_end])
        except ValueError:
            raise ScanError("invalid key", key_end - 1) from None
        j = skip_ws(text, key_end)
        if j >= n:
            return
        if text[j] != ":":
            raise ScanError(f"expected ':', got {text[j]!r}", j)
        j = skip_ws(text, j + 1)
        if j >= n:
            return
        member = Member(key, j, None)
        out.members.append(member)
        member.end = scan_value(text, j)
        if member.end is None:
            return
        j = skip_ws(text, member.end)
        if j >= n:
            return
        if text[j] == "}":
            out.end = j + 1
            return
        if text[j] != ",":
            raise ScanError(f"expected ',' or '}}', got {text[j]!r}", j)
        j = skip_ws(text, j + 1)
