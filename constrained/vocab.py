"""The raw bytes of every token of a Hugging Face tokenizer (for byte-level grammar matching).

Two encodings are handled, detected from the fast tokenizer's decoder (vocabulary heuristics as a
fallback):

* ``byte_level`` (GPT-2 style BPE, e.g. SmolLM2): each token string spells bytes through GPT-2's
  ``bytes_to_unicode`` table (``Ġ`` = space); we invert that table.
* ``byte_fallback`` (SentencePiece style, e.g. Llama/stories260K): ``▁`` is a space and
  ``<0xNN>`` tokens are the single byte 0xNN; other pieces are UTF-8 text.
* ``raw``: anything else; the token string's UTF-8 bytes.

Special tokens (``<s>``, ``<|im_start|>``...) map to ``None``: a grammar must never emit them as
text. Added non-special tokens are plain text.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any, Literal, Optional

VocabType = Literal["byte_level", "byte_fallback", "raw"]
BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")  # a byte-fallback token: the single byte 0xNN


@lru_cache(maxsize=1)
def gpt2_unicode_to_bytes() -> dict[str, int]:
    """Inverse of GPT-2's ``bytes_to_unicode``: printable stand-in character -> byte value."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    table = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + extra)] = b
            extra += 1
    return table


def decoder_config(tokenizer: Any) -> dict[str, Any]:
    """The fast tokenizer's decoder as JSON ({} without one): its own state, microseconds where the
    whole tokenizer's JSON takes tens of milliseconds."""
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    try:
        return json.loads(decoder.__getstate__()) if decoder is not None else {}
    except Exception:  # noqa: BLE001 - unusual tokenizers: callers fall back to heuristics
        return {}


def detect_vocab_type(tokenizer: Any) -> VocabType:
    """How token strings encode bytes (see the module docstring)."""
    config = decoder_config(tokenizer)
    if config:
        decoder = json.dumps(config)
        if '"ByteLevel"' in decoder:
            return "byte_level"
        if '"ByteFallback"' in decoder:
            return "byte_fallback"
    vocab = tokenizer.get_vocab()
    if sum(1 for tok in vocab if BYTE_TOKEN.match(tok)) >= 256:
        return "byte_fallback"
    if any("Ġ" in tok for tok in vocab):
        return "byte_level"
    return "raw"


def special_token_ids(tokenizer: Any) -> set[int]:
    """Ids of the tokenizer's special tokens (BOS/EOS/UNK/PAD and added special tokens)."""
    ids = {int(i) for i in getattr(tokenizer, "all_special_ids", []) if i is not None}
    for tid, added in getattr(tokenizer, "added_tokens_decoder", {}).items():
        if getattr(added, "special", False):
            ids.add(int(tid))
    return ids


def token_bytes_table(tokenizer: Any, vocab_size: Optional[int] = None) -> list[Optional[bytes]]:
    """Bytes of each token id in ``[0, vocab_size)``; ``None`` for special or absent ids.

    Args:
        tokenizer: a Hugging Face tokenizer.
        vocab_size: table length (default: the tokenizer's length); ids beyond the tokenizer are
            padding (``None``), tokenizer ids beyond ``vocab_size`` are dropped.
    Raises:
        ValueError: a byte-level token uses a character outside GPT-2's table.
    """
    size = len(tokenizer) if vocab_size is None else vocab_size
    kind = detect_vocab_type(tokenizer)
    special = special_token_ids(tokenizer)
    added = {int(t) for t in getattr(tokenizer, "added_tokens_decoder", {})}
    table: list[Optional[bytes]] = [None] * size
    to_byte = gpt2_unicode_to_bytes()
    for tok, tid in tokenizer.get_vocab().items():
        if not 0 <= tid < size or tid in special:
            continue
        if tid in added:  # added tokens are stored as text, not in the model's byte alphabet
            table[tid] = tok.encode("utf-8")
        elif kind == "byte_level":
            try:
                table[tid] = bytes(to_byte[ch] for ch in tok)
            except KeyError as exc:
                raise ValueError(f"token {tid} {tok!r} is not a byte-level BPE token") from exc
        elif kind == "byte_fallback":
            m = BYTE_TOKEN.match(tok)
            table[tid] = bytes([int(m.group(1), 16)]) if m else tok.replace("▁", " ").encode("utf-8")
        else:
            table[tid] = tok.encode("utf-8")
    return table


def decode_bytes(table: list[Optional[bytes]], token_ids: list[int]) -> bytes:
    """Concatenated bytes of ``token_ids`` (special tokens contribute nothing)."""
    return b"".join(table[t] or b"" for t in token_ids)
