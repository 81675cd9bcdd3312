"""Request bodies: JSON bytes -> a pydantic request model, shared by the native and ``/v1`` routes.

JSON allows ``\\ud800``-style escapes of lone UTF-16 surrogates, which are not Unicode characters: no
tokenizer can encode them. pydantic's parser refuses such a body with a codec message that names no
field (``unexpected end of hex escape at line 1 column 20``); ``parse_json_body`` turns that case into
a 400 naming the field, ``UnpairedSurrogateError``. Every other parse or validation error is pydantic's.
"""

from __future__ import annotations

import json
import re
from typing import Any, Optional, TypeVar

from pydantic import BaseModel, ValidationError

from radixlm.managers.validation import InvalidRequestError

Model = TypeVar("Model", bound=BaseModel)

_SURROGATE = re.compile("[\ud800-\udfff]")


class UnpairedSurrogateError(InvalidRequestError):
    """A JSON string of the body holds a lone UTF-16 surrogate (HTTP 400).

    ``param``: the field's path (``text``, ``messages.0.content``, ``sampling_params.stop.1``; for a
    surrogate in a field *name*, the object holding it, None at the top level).
    """

    def __init__(self, path: Optional[str], index: int, code_point: int, in_key: bool = False):
        where = path or "request body"
        what = "a field name" if in_key else "the string"
        super().__init__(f"invalid request: {where}: {what} contains an unpaired UTF-16 surrogate (\\u{code_point:04x} "
                         f"at character {index}), which is not valid Unicode; send the text as UTF-8, or escape a "
                         f"character above U+FFFF as a surrogate pair (\\ud83d\\ude00)", path)
        self.index = index
        self.code_point = code_point


def parse_json_body(model: type[Model], body: bytes) -> Model:
    """``model.model_validate_json(body)``, with lone surrogates reported by field.

    Raises:
        UnpairedSurrogateError: the body is JSON but one of its strings holds a lone surrogate.
        pydantic.ValidationError: anything else wrong with the body (malformed JSON, wrong types, ...).
    """
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        if any(err.get("type") == "json_invalid" for err in e.errors()):
            found = find_unpaired_surrogate(body)
            if found is not None:
                raise found from None
        raise


def find_unpaired_surrogate(body: bytes) -> Optional[UnpairedSurrogateError]:
    """The first string (in document order) of the JSON ``body`` that holds a lone surrogate, as an
    error to raise; None when there is none or the body is not JSON by Python's parser either (which,
    unlike pydantic's, decodes lone surrogates)."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):  # not JSON (or not UTF-8) for this parser either
        return None
    stack: list[tuple[Optional[str], Any, bool]] = [(None, doc, False)]  # (path, value, value is a field name)
    while stack:  # iterative: a deeply nested body cannot exhaust the stack
        path, value, is_key = stack.pop()
        if isinstance(value, str):
            match = _SURROGATE.search(value)
            if match:
                return UnpairedSurrogateError(path, match.start(), ord(match.group()), in_key=is_key)
        elif isinstance(value, dict):
            children: list[tuple[Optional[str], Any, bool]] = []
            for key, item in value.items():
                children += [(path, key, True), (_join(path, key), item, False)]
            stack.extend(reversed(children))
        elif isinstance(value, list):
            stack.extend(reversed([(_join(path, str(i)), item, False) for i, item in enumerate(value)]))
    return None


def _join(path: Optional[str], part: str) -> str:
    return part if path is None else f"{path}.{part}"
