"""xgrammar structural tags as plain data: walking their formats, and whether output under one can
close in time (pure Python, no grammar library imported).

A structural tag is ``{"type": "structural_tag", "format": FORMAT}`` where a FORMAT is a dict with a
``type`` (``const_string``, ``json_schema``, ``tag``, ``sequence``, ``or``, ``triggered_tags``,
``tags_with_separator``, ``any_text``, ...; xgrammar's ``structural_tag.py`` lists them) and child
formats under ``content`` / ``elements`` / ``tags``.

``closes_in_time``: JSON closing (``closing``) follows the output with a byte-level JSON lexer, which
is exact only where every byte is either JSON or literal text whose quotes are balanced. Formats that
let the model write free text (``any_text``, ``triggered_tags``...) or non-JSON content (``regex``,
``grammar``, XML styles) can put an unbalanced quote in the output, so such tags do not close.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Optional

from radixlm.constrained.closing import LexState, advance

# Formats whose output is fully determined by literals and JSON values.
_JSON_SAFE = frozenset({"const_string", "json_schema", "tag", "sequence", "or", "tags_with_separator",
                        "optional", "plus", "star", "repeat"})
_LITERAL_FIELDS = ("value", "begin", "end", "separator")


def load_structural_tag(text: str) -> Optional[dict[str, Any]]:
    """The decoded tag, or None when ``text`` is not a JSON object with a ``format`` object."""
    try:
        tag = json.loads(text)
    except ValueError:
        return None
    if not isinstance(tag, dict) or not isinstance(tag.get("format"), dict):
        return None
    return tag


def map_formats(fmt: Any, fn: Callable[[dict[str, Any]], dict[str, Any]]) -> Any:
    """Apply ``fn`` bottom-up to every format dict under ``fmt`` (a copy; ``fmt`` is unchanged)."""
    if not isinstance(fmt, dict):
        return fmt
    out = dict(fmt)
    if isinstance(out.get("content"), dict):
        out["content"] = map_formats(out["content"], fn)
    for key in ("elements", "tags"):
        if isinstance(out.get(key), list):
            out[key] = [map_formats(sub, fn) for sub in out[key]]
    return fn(out)


def _formats(fmt: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []

    def visit(node: dict[str, Any]) -> dict[str, Any]:
        found.append(node)
        return node

    map_formats(fmt, visit)
    return found


def closes_in_time(text: str) -> bool:
    """True when output under the structural tag ``text`` may be closed in time by the JSON lexer:
    only JSON-safe formats, JSON-style schemas, and literals that end outside a string."""
    tag = load_structural_tag(text)
    if tag is None:
        return False
    for node in _formats(tag["format"]):
        if node.get("type") not in _JSON_SAFE:
            return False
        if node.get("type") == "json_schema" and node.get("style", "json") != "json":
            return False
        for key in _LITERAL_FIELDS:
            values = node.get(key)
            for value in values if isinstance(values, list) else [values]:
                if value is None:
                    continue
                if not isinstance(value, str) or advance(LexState(), value.encode()).in_string:
                    return False
    return True
