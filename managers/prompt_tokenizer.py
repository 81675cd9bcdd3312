"""Tokenizing prompts without stalling the server's event loop.

Tokenizing takes about a second per MB of text; on the asyncio loop that would hold up every other
request (and ``/health``). ``PromptTokenizer.encode`` therefore tokenizes a request whose texts total
more than ``INLINE_MAX_CHARS`` characters on a small thread pool (the Rust tokenizer releases the
GIL), and smaller ones inline, where a thread hop would only add latency.

Before tokenizing, a text that certainly cannot fit the context is refused at once: every token
stands for at most ``max_token_bytes`` bytes of text (the longest token of the vocabulary, computed
once), so a text of ``b`` UTF-8 bytes has at least ``ceil(b / max_token_bytes)`` tokens. That holds
for tokenizers that keep every character (byte-level BPE, SentencePiece with byte fallback), not
for ones that drop or merge runs of characters (whitespace-splitting WordPiece, whitespace-collapsing
normalizers, fused unknown tokens); a probe at start-up checks the bound on such runs and turns the
shortcut off when it fails, leaving the check to the exact token count.
"""

from __future__ import annotations

import asyncio
import logging
import math
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

from radixlm.managers.validation import InvalidRequestError

logger = logging.getLogger(__name__)

INLINE_MAX_CHARS = 4096  # texts up to this many characters (in all) are tokenized on the loop itself
_WORKERS = 2
# Runs a tokenizer might drop or merge (whitespace, control and format characters, combining marks,
# characters outside a small vocabulary); the bound must hold on each.
_PROBE_UNITS = (" ", "  x", "\t", "\n", "\r\n", "\x00", "\x01", "\u00a0", "\u200b", "\u3000", "e\u0301",
                "\u4e00", "\U0001f600", "\ufffd", "a", "ab ")
_PROBE_REPEAT = 256


class PromptTooLongError(InvalidRequestError):
    """A prompt longer than the context (HTTP 400). ``min_tokens`` is a lower bound on its length
    (the exact count when it was tokenized); ``context_len`` the model's context in tokens."""

    def __init__(self, message: str, min_tokens: int, context_len: int):
        super().__init__(message)
        self.min_tokens = min_tokens
        self.context_len = context_len


def max_token_bytes(tokenizer: Any) -> int:
    """UTF-8 bytes of the longest token of ``tokenizer``'s vocabulary (added tokens included), as
    written in the vocabulary or as decoded, whichever is longer (both bound the text one token covers:
    SentencePiece's ``▁`` and byte-level BPE's byte characters are longer than the text they stand for)."""
    longest = 1
    for token in tokenizer.get_vocab():
        longest = max(longest, len(token.encode("utf-8", "surrogatepass")))
    for token in sorted(tokenizer.get_vocab(), key=len, reverse=True)[:64]:
        try:  # decoding only the longest-written tokens: one decode per token would cost seconds on 150k vocabularies
            longest = max(longest, len(tokenizer.convert_tokens_to_string([token]).encode("utf-8", "surrogatepass")))
        except Exception:  # noqa: BLE001 - a token the decoder rejects covers nothing longer
            continue
    return longest


def bound_holds(tokenizer: Any, max_bytes: int) -> bool:
    """True when ``tokens >= utf8_bytes / max_bytes`` holds on every probe run (see the module doc)."""
    for unit in _PROBE_UNITS:
        text = unit * _PROBE_REPEAT
        n = len(tokenizer.encode(text, add_special_tokens=False))
        if n * max_bytes < len(text.encode("utf-8")):
            return False
    return True


class PromptTokenizer:
    """Tokenizes prompts for the HTTP process (see the module doc).

    Args:
        tokenizer: a transformers tokenizer (``encode``, ``get_vocab``).
        context_len: the model's context length in tokens; a prompt of that many tokens or more is
            refused (it leaves no room for an output token).
    """

    def __init__(self, tokenizer: Any, context_len: int):
        self.tokenizer = tokenizer
        self.context_len = context_len
        self.max_token_bytes: Optional[int] = max_token_bytes(tokenizer)
        if not bound_holds(tokenizer, self.max_token_bytes):
            logger.info("this tokenizer drops or merges characters: prompts are length-checked only after tokenizing")
            self.max_token_bytes = None
        self._pool: Optional[ThreadPoolExecutor] = None

    def min_tokens(self, text: str) -> int:
        """A lower bound on the number of tokens of ``text`` (0 when no bound is known)."""
        if self.max_token_bytes is None:
            return 0
        return math.ceil(len(text.encode("utf-8", "surrogatepass")) / self.max_token_bytes)

    def check_fits(self, text: str) -> None:
        """Raise ``PromptTooLongError`` when ``text`` certainly has ``context_len`` tokens or more.
        Cheap: no tokenizing (one UTF-8 encode, only for texts that could be that long)."""
        if self.max_token_bytes is None or len(text) * 4 < self.context_len * self.max_token_bytes:
            return  # at most 4 bytes a character: cannot reach the bound
        bound = self.min_tokens(text)
        if bound >= self.context_len:
            raise PromptTooLongError(
                f"The input (at least {bound} tokens: {len(text.encode('utf-8', 'surrogatepass'))} bytes of text) "
                f"is longer than the model's context length ({self.context_len} tokens)", bound, self.context_len)

    async def encode(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        """Token ids of each text, in order.

        Raises:
            PromptTooLongError: a text certainly longer than the context (checked before tokenizing).
        """
        for text in texts:
            self.check_fits(text)
        if sum(map(len, texts)) <= INLINE_MAX_CHARS:
            return self._encode_all(texts, add_special_tokens)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="radixlm-tokenize")
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._encode_all, texts, add_special_tokens)

    def _encode_all(self, texts: list[str], add_special_tokens: bool) -> list[list[int]]:
        return [list(self.tokenizer.encode(t, add_special_tokens=add_special_tokens)) for t in texts]

    def close(self) -> None:
        """Stop the worker threads (a tokenization in progress finishes; its result is dropped)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
