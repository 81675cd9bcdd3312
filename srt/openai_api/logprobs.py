"""SGLang logprob triples -> OpenAI's two logprob shapes.

The engine reports ``[logprob, token_id, text]`` per position (``output_token_logprobs``) and a list
of such triples per position for the top alternatives. OpenAI wants token *strings* that concatenate
to the text, so each token is decoded in context: the string of token ``t`` after ids ``W`` is
``decode(W + [t])`` minus ``decode(W)`` (``W`` = the few ids before it). Decoding alone would drop
SentencePiece's leading space ("▁Paris" -> "Paris").

- Completions: ``{"tokens", "token_logprobs", "top_logprobs": [{str: logprob}], "text_offset"}``;
  with echo the prompt positions come first and the first one has ``null`` logprobs.
- Chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}``.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

from radixlm.srt.openai_api.protocol import (ChatTokenLogprob, ChoiceLogprobs, CompletionLogprobs,
                                             TopLogprob)

_WINDOW = 4  # ids of left context used to decode one token


class TokenStrings:
    """Decodes token ids into the strings they add to the text, given their left context."""

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self._cache: dict[tuple[int, ...], str] = {}

    def _decode(self, ids: Sequence[int]) -> str:
        key = tuple(ids)
        if key not in self._cache:
            self._cache[key] = self.tokenizer.decode(list(key), skip_special_tokens=self.skip)
        return self._cache[key]

    def piece(self, context: Sequence[int], token_id: int) -> str:
        """The text ``token_id`` adds after ``context`` (only the last few context ids matter)."""
        window = list(context[-_WINDOW:])
        before = self._decode(window) if window else ""
        after = self._decode([*window, token_id])
        return after[len(before):] if after.startswith(before) else after

    def pieces(self, ids: Sequence[int], context: Sequence[int] = ()) -> list[str]:
        """Strings of ``ids`` in sequence, the first one following ``context``."""
        full = [*context[-_WINDOW:], *ids]
        start = len(full) - len(ids)
        return [self.piece(full[:start + i], tid) for i, tid in enumerate(ids)]


def _finite(lp: Optional[float]) -> Optional[float]:
    """Logprobs as JSON numbers: ``-inf`` (a masked token) becomes a very negative finite value."""
    if lp is None:
        return None
    return lp if math.isfinite(lp) else -9999.0


def completion_logprobs(strings: TokenStrings, token_lps: list[list], top_lps: list[Optional[list]],
                        context: Sequence[int], first_offset: int = 0,
                        top_n: int = 0) -> CompletionLogprobs:
    """Build (a slice of) the legacy completions logprobs.

    Args:
        token_lps: ``[logprob, token_id, _]`` per position (logprob None for the first prompt token).
        top_lps: per position, the top alternatives as triples, or None.
        context: ids before the first position (for decoding the first string).
        first_offset: ``text_offset`` of the first position (characters into the choice's text).
        top_n: alternatives wanted per position; 0 gives empty dicts.
    """
    ids = [int(t[1]) for t in token_lps]
    toks = strings.pieces(ids, context)
    out = CompletionLogprobs()
    offset = first_offset
    full_ctx = [*context[-_WINDOW:], *ids]
    base = len(full_ctx) - len(ids)
    for i, (triple, tok) in enumerate(zip(token_lps, toks)):
        lp = _finite(triple[0])
        out.tokens.append(tok)
        out.token_logprobs.append(lp)
        out.text_offset.append(offset)
        offset += len(tok)
        alts = top_lps[i] if i < len(top_lps) else None
        if lp is None:
            out.top_logprobs.append(None)
            continue
        top: dict[str, float] = {}
        for alt in (alts or [])[:top_n]:
            alt_str = strings.piece(full_ctx[:base + i], int(alt[1]))
            top.setdefault(alt_str, _finite(alt[0]))  # type: ignore[arg-type]
        out.top_logprobs.append(top)
    return out


def chat_logprobs(strings: TokenStrings, token_lps: list[list], top_lps: list[Optional[list]],
                  context: Sequence[int], top_n: int = 0) -> ChoiceLogprobs:
    """Build (a slice of) chat ``logprobs.content``; ``context`` = ids before the first token."""
    ids = [int(t[1]) for t in token_lps]
    toks = strings.pieces(ids, context)
    full_ctx = [*context[-_WINDOW:], *ids]
    base = len(full_ctx) - len(ids)
    content = []
    for i, (triple, tok) in enumerate(zip(token_lps, toks)):
        alts = []
        for alt in ((top_lps[i] if i < len(top_lps) else None) or [])[:top_n]:
            alt_str = strings.piece(full_ctx[:base + i], int(alt[1]))
            alts.append(TopLogprob(token=alt_str, logprob=_finite(alt[0]) or 0.0,
                                   bytes=list(alt_str.encode("utf-8"))))
        content.append(ChatTokenLogprob(token=tok, logprob=_finite(triple[0]) or 0.0,
                                        bytes=list(tok.encode("utf-8")), top_logprobs=alts))
    return ChoiceLogprobs(content=content)
