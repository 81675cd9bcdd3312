"""Closing JSON output in time: a string stops after ``MAX_STRING_CHARS`` characters, and the
whole document closes when the request's token budget runs low.

A JSON grammar says what may come next, not when to stop: a model can write one string until
``max_new_tokens`` and leave the output cut and invalid. Bounding every free string in the grammar
costs too much with both libraries (SmolLM2's 49k vocabulary, five strings of ``maxLength`` 256:
outlines-core builds its index in ~11 s; xgrammar's JSON-aware pattern path takes ~18 ms per mask,
and its plain ``maxLength`` lowering admits raw control characters, xgrammar#800). So a JSON
matcher narrows its mask row instead:

* ``JsonLexer`` follows the accepted bytes: nesting depth, inside a string, that string's length.
  The grammar guarantees the bytes are a JSON prefix, so a byte-level lexer is exact.
* Closing mode, when the current string has ``MAX_STRING_CHARS`` characters or the tokens left
  (the one being sampled included) are at most the matcher's reserve plus the nesting depth: the
  row keeps only the *closing tokens* the grammar allows, if it allows any. Inside a string these
  are ``"`` followed by nothing but ``}``/``]``; outside, tokens of ``}``/``]`` only; always the stop
  tokens. The mask is narrowed, never widened, so output still matches the grammar.
* Where no closing token is allowed (a required key, a value, a pattern's next character), a
  budget-closing row allows just the next token of the *closing path* (``closing_path``: closing
  tokens narrowed as above, else the longest allowed token, until a stop token is allowed),
  computed from the current state and kept while the output follows it. So the tokens closing
  takes are the path's, not whatever the model would write where the grammar leaves a choice
  (spaces, ``true`` byte by byte, a long key). A string past ``MAX_STRING_CHARS`` is only narrowed.
* The reserve is the closing path's length from the grammar's start (once per compile) plus
  ``CLOSE_MARGIN``; from a later state closing needs about as many tokens, plus finishing the
  current member and one per open bracket (hence the depth term).

Importing this module imports no torch (it is imported lazily by the functions that need it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Optional

if TYPE_CHECKING:
    import torch

MAX_STRING_CHARS = 256  # characters before a string is closed (a backslash escape counts one)
CLOSE_MARGIN = 4  # tokens of slack over the closing path: the model may tokenize it differently
MAX_CLOSING_PATH = 1024  # closing_path_length's answer when no stop token is reached by then
LOOKAHEAD = 16  # candidates closing_path tries, longest first, where no closing token is allowed
_QUOTE, _BACKSLASH = 0x22, 0x5C
_OPEN = frozenset(b"{[")
_CLOSE = frozenset(b"}]")


class LexState(NamedTuple):
    """Where a JSON prefix stands: ``depth`` open ``{``/``[``; ``in_string``; ``escaped`` (a
    backslash was the last byte inside a string); ``chars`` of the current string so far."""

    depth: int = 0
    in_string: bool = False
    escaped: bool = False
    chars: int = 0


def advance(state: LexState, data: bytes) -> LexState:
    """The state after ``data`` (bytes of a valid JSON prefix continuing ``state``)."""
    depth, in_string, escaped, chars = state
    for b in data:
        if in_string:
            if escaped:
                escaped = False
            elif b == _BACKSLASH:
                escaped, chars = True, chars + 1
            elif b == _QUOTE:
                in_string = False
            elif b & 0xC0 != 0x80:  # not a UTF-8 continuation byte: a new character
                chars += 1
        elif b == _QUOTE:
            in_string, chars = True, 0
        elif b in _OPEN:
            depth += 1
        elif b in _CLOSE:
            depth -= 1
    return LexState(depth, in_string, escaped, chars)


class JsonLexer:
    """The ``LexState`` after each accepted token, kept as a stack so a rollback is a pop."""

    def __init__(self) -> None:
        self._states = [LexState()]

    @property
    def state(self) -> LexState:
        return self._states[-1]

    def push(self, data: bytes) -> None:
        """One accepted token's bytes (``b""`` for a stop token)."""
        self._states.append(advance(self._states[-1], data))

    def pop(self, num_tokens: int) -> None:
        """Forget the last ``num_tokens`` pushes (at most as many as were pushed)."""
        if num_tokens:
            del self._states[-num_tokens:]

    def reset(self) -> None:
        del self._states[1:]

    def copy(self) -> "JsonLexer":
        twin = JsonLexer()
        twin._states = list(self._states)
        return twin


class ClosingVocab:
    """A vocabulary's closing tokens, shared read-only by one backend's matchers.

    Args:
        table: bytes of each token id, length ``vocab_size`` (``vocab.token_bytes_table``; None:
            special or padding, never text).
        stop_token_ids: the stop tokens (closing in every state they are allowed).
        vocab_size: the logits width V.
    Raises:
        ValueError: a stop token id outside ``[0, vocab_size)``.
    """

    def __init__(self, table: Sequence[Optional[bytes]], stop_token_ids: Sequence[int],
                 vocab_size: int):
        import torch

        from radixlm.constrained.base import token_ids_bitmask_row

        self.vocab_size = vocab_size
        self.table: list[bytes] = [raw or b"" for raw in table[:vocab_size]]
        self.table += [b""] * (vocab_size - len(self.table))
        stops = list(stop_token_ids)
        inside = [t for t, raw in enumerate(self.table)
                  if raw[:1] == b'"' and all(b in _CLOSE for b in raw[1:])]
        outside = [t for t, raw in enumerate(self.table) if raw and all(b in _CLOSE for b in raw)]
        self.inside_row = token_ids_bitmask_row(inside + stops, vocab_size)
        self.outside_row = token_ids_bitmask_row(outside + stops, vocab_size)
        self.stop_ids = torch.tensor(stops, dtype=torch.int64)
        self.lengths = torch.tensor([len(raw) for raw in self.table], dtype=torch.int32)

    def narrow(self, bitmask: "torch.Tensor", row: int, state: LexState) -> bool:
        """Keep only the closing tokens of ``bitmask[row]`` for ``state``, if any is set there.

        Returns whether the row was narrowed (False: none allowed, or right after a backslash).
        """
        if state.escaped:
            return False
        kept = bitmask[row] & (self.inside_row if state.in_string else self.outside_row)
        if not bool(kept.any()):
            return False
        bitmask[row].copy_(kept)
        return True


def closing_path(matcher: Any, vocab: ClosingVocab,
                 limit: int = MAX_CLOSING_PATH) -> Optional[list[int]]:
    """The tokens that close the output from ``matcher``'s state, the stop token excluded: each
    step the longest token of the row narrowed to closing tokens (``narrow``), until a stop token
    is allowed. Where the row allows no closing token, of its ``LOOKAHEAD`` longest tokens the
    first after which one is allowed (``0`` rather than ``t`` of ``true``), else the longest.
    ``matcher`` is advanced along the path.

    Args:
        matcher: a ``GrammarMatcher`` with closing enabled (``enable_closing``).
        vocab: its backend's ``ClosingVocab``.
        limit: the most tokens to try.
    Returns:
        The path, or None when no stop token is allowed within ``limit`` tokens (or a dead end).
    """
    from radixlm.constrained.base import allocate_bitmask, bitmask_to_bool

    bitmask = allocate_bitmask(1, vocab.vocab_size)
    probe = allocate_bitmask(1, vocab.vocab_size)
    path: list[int] = []
    while len(path) < limit:
        matcher.fill_bitmask(bitmask, 0)
        narrowed = vocab.narrow(bitmask, 0, matcher.lex_state)
        allowed = bitmask_to_bool(bitmask, vocab.vocab_size)[0]
        if bool(allowed[vocab.stop_ids].any()):
            return path
        lengths = vocab.lengths.masked_fill(~allowed, -1)
        tid = int(lengths.argmax())
        if int(lengths[tid]) < 0:
            return None
        if not narrowed:
            tid = _closing_friendly(matcher, vocab, lengths, probe, default=tid)
        if not matcher.accept_token(tid):
            return None
        path.append(tid)
    return None


def _closing_friendly(matcher: Any, vocab: ClosingVocab, lengths: "torch.Tensor",
                      probe: "torch.Tensor", default: int) -> int:
    """Of the ``LOOKAHEAD`` longest allowed tokens (``lengths`` >= 0), the first after which a
    closing token is allowed; ``default`` if none is. ``matcher`` is left as it was."""
    import torch

    count = min(LOOKAHEAD, int((lengths >= 0).sum()))
    for tid in torch.topk(lengths.to(torch.float32), count).indices.tolist():
        if matcher.accept_token(tid):
            matcher.fill_bitmask(probe, 0)
            friendly = vocab.narrow(probe, 0, matcher.lex_state)
            matcher.rollback(1)
            if friendly:
                return tid
    return default


def closing_path_length(matcher: Any, vocab: ClosingVocab, limit: int = MAX_CLOSING_PATH) -> int:
    """Tokens closing takes from ``matcher``'s state, the stop token included
    (``len(closing_path) + 1``; ``limit`` when there is none); ``matcher`` is advanced."""
    path = closing_path(matcher, vocab, limit)
    return limit if path is None else len(path) + 1
