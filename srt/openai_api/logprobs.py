"""SGLang logprob triples -> OpenAI's two logprob shapes.

The engine reports ``[logprob, token_id, text]`` per position (``output_token_logprobs``) and a list
of such triples per position for the top alternatives. OpenAI wants token *strings* that concatenate
to the text, so each token is decoded in context: the string of token ``t`` after ids ``W`` is
``decode(W + [t])`` minus ``decode(W)`` (``W`` = the few ids before it). Decoding alone would drop
SentencePiece's leading space ("▁Paris" -> "Paris").

A character written by several tokens (byte-fallback pieces, byte-level BPE splits of accents, CJK,
emoji) belongs to the token that completes it: the tokens before it get "" (their decode ends in an
incomplete character, U+FFFD), so the strings still concatenate to the text, ``text_offset`` never goes
back and each entry's ``bytes`` (the UTF-8 of its string) join to the text's exact bytes. The rule only
looks at a token's left context, so streamed chunks get the same strings. Where the output ends inside
a character (``max_tokens`` cut it), the text ends in U+FFFD and so does the last token's string
(``final``): nothing completes that character.

Stop strings: the text leaves a matched stop string out (and, while streaming, holds back a possible
start of one), but its tokens were generated. Given the text's length (``text_chars``), a slice's
strings are fitted to it: while streaming only the tokens the text already shows are sent (the rest
wait for the next chunk); at the end every token is sent, its string cut where the text ends ("" for
a stop string's own tokens). So the strings join to the text whether or not the output stopped on a
string, and every generated token keeps its logprob.

- Completions: ``{"tokens", "token_logprobs", "top_logprobs": [{str: logprob}], "text_offset"}``;
  with echo the prompt positions come first and the first one has ``null`` logprobs.
- Chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}``.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Optional, Sequence

from radixlm.srt.openai_api.protocol import (ChatTokenLogprob, ChoiceLogprobs, CompletionLogprobs,
                                             TopLogprob)
from radixlm.srt.openai_api.token_bytes import TokenBytes, incomplete_tail

_WINDOW = 4  # ids of left context used to decode one token


class TokenStrings:
    """Decodes token ids into the strings they add to the text, given their left context."""

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self._cache: dict[tuple[int, ...], str] = {}

    @functools.cached_property
    def _bytes(self) -> Optional[TokenBytes]:  # looked up on first use: most requests want no logprobs
        return TokenBytes.for_tokenizer(self.tokenizer, self.skip)

    def _decode(self, ids: Sequence[int]) -> str:
        key = tuple(ids)
        if key not in self._cache:
            self._cache[key] = self.tokenizer.decode(list(key), skip_special_tokens=self.skip)
        return self._cache[key]

    def piece(self, context: Sequence[int], token_id: int) -> str:
        """The text ``token_id`` adds after ``context`` (only the last few context ids matter): "" when
        it leaves a character incomplete; the whole character when it completes one that ids in
        ``context`` began."""
        if self._bytes is not None:
            return self._pieces_from_bytes([token_id], context)[0][0]
        window = list(context[-_WINDOW:])
        before = self._decode(window) if window else ""
        after = self._decode([*window, token_id])
        common = 0  # the window's text; an incomplete last character of it differs from its completion
        for a, b in zip(after, before):
            if a != b:
                break
            common += 1
        return after[common:].rstrip("\ufffd")  # an incomplete last character is the next token's

    def _bytes_state(self, context: Sequence[int]) -> tuple[bytes, bool]:
        """(the unfinished character's bytes at the end of ``context``, whether it has no text yet)."""
        tb = self._bytes
        assert tb is not None
        tail = b""
        for prev in reversed(context):  # the last few bytes are enough: a character is at most 4
            tail = tb.of(prev) + tail
            if len(tail) >= 4:
                break
        at_start = not tail  # the loop read all of the context without finding a byte
        return tail[len(tail) - incomplete_tail(tail):], at_start

    def _pieces_from_bytes(self, ids: Sequence[int], context: Sequence[int]) -> tuple[list[str], bytes]:
        """The strings of ``ids`` and the bytes of the character they leave unfinished."""
        tb = self._bytes
        assert tb is not None
        pending, at_start = self._bytes_state(context)
        out = []
        for tid in ids:
            data = pending + tb.of(tid)
            cut = len(data) - incomplete_tail(data)
            text = data[:cut].decode("utf-8", errors="replace")
            if at_start and tb.strips_first_space and text.startswith(" "):
                text = text[1:]
            at_start = at_start and not data
            pending = data[cut:]
            out.append(text)
        return out, pending

    def pieces(self, ids: Sequence[int], context: Sequence[int] = (), final: bool = False) -> list[str]:
        """Strings of ``ids`` in sequence, the first one following ``context``; ``final``: the sequence
        ends after ``ids``, so a character they leave unfinished ends the last string as U+FFFD, as the
        decoded text ends."""
        full = [*context[-_WINDOW:], *ids]
        if self._bytes is not None:
            out, pending = self._pieces_from_bytes(ids, context)
            unfinished = len(pending)
        else:
            start = len(full) - len(ids)
            out = [self.piece(full[:start + i], tid) for i, tid in enumerate(ids)]
            unfinished = 4  # at most a character's bytes
        if final and out and unfinished:
            # The text ends with the tokenizer's own replacement of those bytes (one U+FFFD for them, or
            # one a byte with SentencePiece's byte fallback): the U+FFFDs ending a decode of the last ids,
            # at most one a pending byte (an earlier incomplete character may open that window too).
            tail = self._decode(full[-_WINDOW - 1:])
            run = len(tail) - len(tail.rstrip("\ufffd"))
            out[-1] += "\ufffd" * min(run, unfinished)
        return out


def _finite(lp: Optional[float]) -> Optional[float]:
    """Logprobs as JSON numbers: ``-inf`` (a masked token) becomes a very negative finite value."""
    if lp is None:
        return None
    return lp if math.isfinite(lp) else -9999.0


def fit_to_text(toks: list[str], text_chars: Optional[int], final: bool) -> list[str]:
    """Token strings fitted to the ``text_chars`` characters of text there are from the first token
    on (None: no bound): not ``final``, the leading tokens the text covers; ``final``, all of them,
    cut where the text ends (see the module doc)."""
    if text_chars is None:
        return toks
    out, used = [], 0
    for tok in toks:
        if used + len(tok) > text_chars:
            if not final:
                break
            tok = tok[:max(0, text_chars - used)]
        out.append(tok)
        used += len(tok)
    return out


def completion_logprobs(strings: TokenStrings, token_lps: list[list], top_lps: list[Optional[list]],
                        context: Sequence[int], first_offset: int = 0,
                        top_n: int = 0, final: bool = False, text_chars: Optional[int] = None) -> CompletionLogprobs:
    """Build (a slice of) the legacy completions logprobs.

    Args:
        token_lps: ``[logprob, token_id, _]`` per position (logprob None for the first prompt token).
        top_lps: per position, the top alternatives as triples, or None.
        context: ids before the first position (for decoding the first string).
        first_offset: ``text_offset`` of the first position (characters into the choice's text).
        top_n: alternatives wanted per position; 0 gives empty dicts.
        final: the slice ends the choice's output (``TokenStrings.pieces``).
        text_chars: characters of the choice's text from the first position on (``fit_to_text``;
            None: the strings as decoded, every position).
    """
    ids = [int(t[1]) for t in token_lps]
    decoded = strings.pieces(ids, context, final)
    toks = fit_to_text(decoded, text_chars, final)
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
        if top_n and ids[i] not in {int(alt[1]) for alt in (alts or [])[:top_n]}:
            top.setdefault(decoded[i], lp)  # as OpenAI: the chosen token is listed too (up to logprobs + 1)
        out.top_logprobs.append(top)
    return out


def chat_logprobs(strings: TokenStrings, token_lps: list[list], top_lps: list[Optional[list]],
                  context: Sequence[int], top_n: int = 0, final: bool = False,
                  text_chars: Optional[int] = None) -> ChoiceLogprobs:
    """Build (a slice of) chat ``logprobs.content``; ``context`` = ids before the first token; ``final``:
    the slice ends the choice's output; ``text_chars``: characters of the output text from the first
    token on (``fit_to_text``)."""
    ids = [int(t[1]) for t in token_lps]
    toks = fit_to_text(strings.pieces(ids, context, final), text_chars, final)
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
