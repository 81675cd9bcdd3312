"""The raw UTF-8 bytes each token id stands for, for the two tokenizer families whose tokens are byte
strings: byte-level BPE (GPT-2, SmolLM2, Llama 3, Qwen: ``ByteLevel`` decoder) and SentencePiece with
byte fallback (Llama 2, Mistral, stories260K: ``▁`` for a space, ``<0xHH>`` tokens for single bytes).

Decoding ids one window at a time cannot give a token's share of the text when a character is split
over tokens: transformers' decode turns an incomplete character into U+FFFD, and SentencePiece's
byte-fallback decoder turns a whole run of byte tokens into U+FFFD when the run is not valid UTF-8, so
appending a token can change the text before it. Bytes can be concatenated; logprobs.TokenStrings uses
them where this module knows the family, and decoding otherwise.
"""

from __future__ import annotations

import json
import re
from typing import Any, Optional

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _gpt2_byte_decoder() -> dict[str, int]:
    """GPT-2's printable stand-ins for the 256 byte values (``bytes_to_unicode``), inverted."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


class TokenBytes:
    """Bytes of token ids (``of``) and whether the decoder drops the text's first space
    (``strips_first_space``: SentencePiece's ``Strip`` / ``Metaspace``). Build with ``for_tokenizer``."""

    def __init__(self, tokenizer: Any, byte_level: bool, strips_first_space: bool, skip_special_tokens: bool):
        self.tokenizer = tokenizer
        self.byte_level = byte_level
        self.strips_first_space = strips_first_space
        self.skip = skip_special_tokens
        self.special = frozenset(getattr(tokenizer, "all_special_ids", None) or ())
        self._decoder = _gpt2_byte_decoder() if byte_level else {}
        self._cache: dict[int, bytes] = {}

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, skip_special_tokens: bool = True) -> Optional["TokenBytes"]:
        """The tokenizer's ``TokenBytes``, or None when its decoder is neither family (or unknown)."""
        backend_decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
        try:  # the decoder's own JSON (microseconds; the whole tokenizer's is megabytes)
            decoder = json.loads(backend_decoder.__getstate__()) if backend_decoder is not None else {}
        except (AttributeError, TypeError, ValueError):
            return None
        steps = decoder.get("decoders") or [decoder]
        kinds = {d.get("type") for d in steps}
        if "ByteLevel" in kinds:
            return cls(tokenizer, True, False, skip_special_tokens)
        metaspace = next((d for d in steps if d.get("type") == "Metaspace"), None)
        spaces = metaspace is not None or any(
            d.get("type") == "Replace" and (d.get("pattern") or {}).get("String") == "▁" and d.get("content") == " "
            for d in steps)
        if "ByteFallback" not in kinds or not spaces:
            return None
        strips = any(d.get("type") == "Strip" and d.get("content") == " " and d.get("start", 0) >= 1 for d in steps)
        if metaspace is not None:
            strips = strips or metaspace.get("prepend_scheme", "always") != "never" and metaspace.get("add_prefix_space", True)
        return cls(tokenizer, False, strips, skip_special_tokens)

    def of(self, token_id: int) -> bytes:
        """The bytes ``token_id`` adds to the text (b"" for a skipped special token)."""
        cached = self._cache.get(token_id)
        if cached is not None:
            return cached
        if token_id in self.special and self.skip:
            out = b""
        else:
            token = self.tokenizer.convert_ids_to_tokens(token_id)
            token = token if isinstance(token, str) else ""
            if self.byte_level:
                try:
                    out = bytes(self._decoder[c] for c in token)
                except KeyError:  # an added token (e.g. "<|im_start|>") is its own text
                    out = token.encode("utf-8")
            else:
                m = _BYTE_TOKEN.fullmatch(token)
                out = bytes([int(m.group(1), 16)]) if m else token.replace("▁", " ").encode("utf-8")
        self._cache[token_id] = out
        return out


def incomplete_tail(data: bytes) -> int:
    """How many bytes at the end of ``data`` begin a UTF-8 character they do not finish (0-3)."""
    for back in range(1, min(4, len(data)) + 1):
        b = data[-back]
        if b < 0x80:
            return 0
        if b >= 0xC0:  # a lead byte: 2, 3 or 4 bytes long
            need = 2 if b < 0xE0 else 3 if b < 0xF0 else 4
            return back if back < need else 0
    return 0
