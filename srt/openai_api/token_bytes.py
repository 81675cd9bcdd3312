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

from typing import Any, Optional

from radixlm.constrained.vocab import BYTE_TOKEN, decoder_config, detect_vocab_type, gpt2_unicode_to_bytes


class TokenBytes:
    """Bytes of token ids (``of``) and whether the decoder drops the text's first space
    (``strips_first_space``: SentencePiece's ``Strip`` / ``Metaspace``). Build with ``for_tokenizer``;
    the byte encodings are constrained.vocab's (the grammar backends' token bytes)."""

    def __init__(self, tokenizer: Any, byte_level: bool, strips_first_space: bool, skip_special_tokens: bool):
        self.tokenizer = tokenizer
        self.byte_level = byte_level
        self.strips_first_space = strips_first_space
        self.skip = skip_special_tokens
        self.special = frozenset(getattr(tokenizer, "all_special_ids", None) or ())
        self._cache: dict[int, bytes] = {}

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, skip_special_tokens: bool = True) -> Optional["TokenBytes"]:
        """The tokenizer's ``TokenBytes``, or None when its tokens do not spell bytes (``raw``)."""
        kind = detect_vocab_type(tokenizer)
        if kind == "raw":
            return None
        config = decoder_config(tokenizer)
        steps = config.get("decoders") or [config]
        strips = any(d.get("type") == "Strip" and d.get("content") == " " and d.get("start", 0) >= 1 for d in steps)
        metaspace = next((d for d in steps if d.get("type") == "Metaspace"), None)
        if metaspace is not None:
            strips = strips or metaspace.get("prepend_scheme", "always") != "never" and metaspace.get("add_prefix_space", True)
        return cls(tokenizer, kind == "byte_level", kind == "byte_fallback" and strips, skip_special_tokens)

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
                to_byte = gpt2_unicode_to_bytes()
                try:
                    out = bytes(to_byte[c] for c in token)
                except KeyError:  # an added token (e.g. "<|im_start|>") is its own text
                    out = token.encode("utf-8")
            else:
                m = BYTE_TOKEN.match(token)
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
