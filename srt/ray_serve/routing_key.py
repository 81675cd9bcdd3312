"""The text a request's prompt starts with, which the prefix-affinity router matches (no Ray here).

Requests whose prompts share a long prefix should go to the replica whose radix cache already holds
it. The router sees only this key: the prompt's leading text, or for token-id prompts their decimal
form (``"1 2 3 "``), so two requests share a key prefix exactly when their prompts share a prefix.
The key is capped at ``MAX_KEY_CHARS``: past that, a longer match brings no routing information worth
the router's memory. A body that is not JSON, or has no prompt field, has the key ``""`` (no affinity:
the router balances it by load); the replica answers it as the plain server does.
"""

from __future__ import annotations

import json
from typing import Any

MAX_KEY_CHARS = 4096


def routing_key(path: str, body: bytes) -> str:
    """The routing key of a request to ``path`` (``/generate``, ``/v1/completions``,
    ``/v1/chat/completions``, ``/v1/responses``; anything else: ``""``) with raw JSON ``body``."""
    if not body:
        return ""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return ""
    if not isinstance(data, dict):
        return ""
    path = "/" + path.strip("/")
    if path == "/generate":
        key = _prompt_text(data.get("text")) or _token_text(data.get("input_ids"))
    elif path == "/v1/completions":
        prompt = data.get("prompt")
        key = _prompt_text(prompt) or _token_text(prompt)
    elif path == "/v1/chat/completions":
        key = _messages_text(data.get("messages"))
    elif path == "/v1/responses":
        key = _prompt_text(data.get("instructions")) + (_prompt_text(data.get("input"))
                                                        or _messages_text(data.get("input")))
    else:
        key = ""
    return key[:MAX_KEY_CHARS]


def _prompt_text(value: Any) -> str:
    """A string prompt, or the first of a list of strings (a batch is routed by its first prompt)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and isinstance(value[0], str):
        return value[0]
    return ""


def _token_text(value: Any) -> str:
    """Token ids (one prompt, or the first of a batch) as ``"id id ... "``."""
    if isinstance(value, list) and value and isinstance(value[0], list):
        value = value[0]
    if isinstance(value, list) and value and all(isinstance(t, int) for t in value):
        return "".join(f"{t} " for t in value)
    return ""


def _messages_text(messages: Any) -> str:
    """Chat messages as ``"role: content\\n"`` lines, text parts of multi-part contents joined: what
    the chat template renders them into starts the same way for the same leading messages."""
    if not isinstance(messages, list):
        return ""
    parts = []
    for m in messages:
        if not isinstance(m, dict):
            break
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
        parts.append(f"{m.get('role', '')}: {content if isinstance(content, str) else ''}\n")
        if sum(map(len, parts)) >= MAX_KEY_CHARS:
            break
    return "".join(parts)
