"""Backend-neutral grammar interfaces and the packed bitmask helpers.

Bitmask layout (shared with ``radixlm.kernels.sampling.apply_vocab_mask`` and xgrammar): an int32
tensor of shape ``(batch, ceil(V / 32))`` where V is the logits width; bit ``j % 32`` of word
``j // 32`` set means token ``j`` is allowed. An all-ones row (every word ``-1``) is unconstrained.
Matchers fill rows of a *CPU*, contiguous bitmask; move it to the logits' device afterwards.

Matcher life cycle per request: ``new_matcher`` -> per step ``fill_bitmask`` (before sampling) and
``accept_token`` (after) -> ``is_terminated()`` once a stop token was accepted. Once the output is a
complete match (``is_completed()``), the stop tokens are allowed; once terminated, *only* the stop
tokens are (the row is filled with them alone), so the request cannot run on. JSON grammars also
close in time (``closing``): ``fill_bitmask(..., tokens_left=n)`` narrows the row to closing tokens
when a string runs long or the budget runs low.

torch is imported lazily so ``import radixlm.constrained`` stays light.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from radixlm.constrained.closing import (
    CLOSE_MARGIN,
    MAX_CLOSING_PATH,
    MAX_STRING_CHARS,
    ClosingVocab,
    JsonLexer,
    LexState,
    closing_path,
    closing_path_length,
)
from radixlm.constrained.spec import GrammarError, GrammarSpec
from radixlm.constrained.structural_tag import closes_in_time

if TYPE_CHECKING:
    import torch

JSON_KINDS = ("json_schema", "json_object")  # the grammar kinds that close in time (and some structural tags)

# xgrammar/TVM messages start with "[10:22:57] /project/cpp/file.cc:94: " and sometimes a failed
# CHECK's text; the caller wants only the human part.
_LOG_PREFIX = re.compile(r"^\s*\[[0-9:.]+\]\s+\S+:\d+:\s*")
_CHECK_PREFIX = re.compile(r"^Check failed: .*? is false: ")


def compiler_message(exc: BaseException) -> str:
    """The compiler's error text without C++ log prefixes (first 2000 characters)."""
    text = str(exc).strip() or type(exc).__name__
    text = _CHECK_PREFIX.sub("", _LOG_PREFIX.sub("", text))
    return text[:2000]


def num_bitmask_words(vocab_size: int) -> int:
    """Words per bitmask row: ceil(vocab_size / 32)."""
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    return (vocab_size + 31) // 32


def allocate_bitmask(batch: int, vocab_size: int) -> "torch.Tensor":
    """A fresh CPU bitmask, int32 ``(batch, ceil(vocab_size / 32))``, all ones (unconstrained)."""
    import torch

    return torch.full((batch, num_bitmask_words(vocab_size)), -1, dtype=torch.int32)


def token_ids_bitmask_row(token_ids: Iterable[int], vocab_size: int) -> "torch.Tensor":
    """An int32 ``(ceil(vocab_size / 32),)`` row allowing exactly ``token_ids``.

    Raises:
        ValueError: an id outside ``[0, vocab_size)``.
    """
    import torch

    words = [0] * num_bitmask_words(vocab_size)
    for tid in token_ids:
        if not 0 <= tid < vocab_size:
            raise ValueError(f"token id {tid} outside the vocabulary [0, {vocab_size})")
        words[tid // 32] |= 1 << (tid % 32)
    signed = [w - (1 << 32) if w >= 1 << 31 else w for w in words]
    return torch.tensor(signed, dtype=torch.int32)


def bitmask_to_bool(bitmask: "torch.Tensor", vocab_size: int) -> "torch.Tensor":
    """Unpack an int32 ``(batch, >= ceil(V/32))`` bitmask into a bool ``(batch, V)`` allowed-mask
    (``radixlm.kernels.sampling.unpack_vocab_mask``, the one implementation of the layout)."""
    from radixlm.kernels.sampling import unpack_vocab_mask

    return unpack_vocab_mask(bitmask, vocab_size)


def check_bitmask(bitmask: "torch.Tensor", row: int, vocab_size: int) -> None:
    """Validate a bitmask before a backend writes row ``row`` of it (raw pointers are involved).

    Raises:
        ValueError: not a contiguous CPU int32 ``(batch, ceil(vocab_size/32))`` tensor, or ``row``
            out of range.
    """
    import torch

    words = num_bitmask_words(vocab_size)
    if bitmask.dtype != torch.int32 or bitmask.dim() != 2 or bitmask.shape[1] != words:
        raise ValueError(f"bitmask must be int32 (batch, {words}), got {bitmask.dtype} "
                         f"{tuple(bitmask.shape)}")
    if bitmask.device.type != "cpu" or not bitmask.is_contiguous():
        raise ValueError("bitmask must be a contiguous CPU tensor (fill on CPU, then move it)")
    if not 0 <= row < bitmask.shape[0]:
        raise ValueError(f"row {row} outside the bitmask's {bitmask.shape[0]} rows")


@dataclass(frozen=True)
class CompiledGrammar:
    """A compiled grammar, shareable by any number of matchers (read-only after compile).

    ``handle`` is the backend's object (xgrammar ``CompiledGrammar`` / outlines-core ``Index``).
    ``closing_tokens``: the closing path's length from the start (``closing.closing_path_length``;
    0 for grammars that do not close in time). ``closes``: matchers close in time (JSON kinds, and
    structural tags made of JSON and literals only, ``structural_tag.closes_in_time``).
    """

    spec: GrammarSpec
    backend: str
    handle: Any
    compile_seconds: float = 0.0
    closing_tokens: int = 0
    closes: bool = False


def closes_output(spec: GrammarSpec) -> bool:
    """Whether output under ``spec`` is JSON the closing lexer can follow exactly."""
    return spec.kind in JSON_KINDS or (spec.kind == "structural_tag" and closes_in_time(spec.text))


class GrammarMatcher(ABC):
    """Per-request grammar state. Not thread-safe; owned by the scheduler thread.

    Subclasses implement the ``_``-prefixed hooks; this class keeps the accepted-token count and
    the termination rule (after a stop token nothing but stop tokens is allowed).
    """

    def __init__(self, vocab_size: int, stop_token_ids: Sequence[int]):
        self.vocab_size = vocab_size
        self.stop_token_ids: tuple[int, ...] = tuple(stop_token_ids)
        self._stop_set = frozenset(self.stop_token_ids)
        self.num_accepted = 0  # tokens accepted (and not rolled back), the stop token included
        self._stop_row: Optional["torch.Tensor"] = None
        self._closing: Optional[ClosingVocab] = None  # set by enable_closing (JSON grammars)
        self._lexer: Optional[JsonLexer] = None
        self.close_reserve = 0  # tokens left at which the whole document starts closing
        self._close_budget = True  # False: only long strings are closed (no closing path exists)
        self._plan: list[int] = []  # the closing path from the current state (when known)
        self._plan_failed = False  # a closing path was searched for and not found: not again (until a rollback)

    # -- public API ------------------------------------------------------------------------------
    def accept_token(self, token_id: int) -> bool:
        """Advance by one sampled token. Returns False (state unchanged) when the grammar does not
        allow it here, e.g. any token after termination or one outside ``[0, vocab_size)``."""
        if self.is_terminated() or not 0 <= token_id < self.vocab_size:
            return False
        if not self._accept(int(token_id)):
            return False
        self.num_accepted += 1
        if self._lexer is not None and self._closing is not None:
            self._lexer.push(self._closing.table[token_id])
            if self._plan and self._plan[0] == token_id:
                self._plan.pop(0)  # still the closing path from the new state
            else:
                self._plan = []  # a failed search stays failed: closing gave up for this output
        return True

    def fill_bitmask(self, bitmask: "torch.Tensor", row: int,
                     tokens_left: Optional[int] = None) -> None:
        """Write the allowed next tokens into ``bitmask[row]``; other rows are untouched.

        Args:
            bitmask: int32 CPU contiguous ``(batch, ceil(vocab_size/32))`` (``allocate_bitmask``).
            row: the request's row in the batch.
            tokens_left: output tokens the request may still produce, this one included (None:
                no budget). With closing enabled, the row is narrowed to closing tokens once
                ``tokens_left <= close_reserve + depth`` (where it allows none: to the closing
                path's next token) or a string reached ``closing.MAX_STRING_CHARS`` characters
                (see ``closing``).
        Raises:
            ValueError: wrong bitmask shape/dtype/device or row out of range.
        """
        check_bitmask(bitmask, row, self.vocab_size)
        if self.is_terminated():
            if self._stop_row is None:
                self._stop_row = token_ids_bitmask_row(self.stop_token_ids, self.vocab_size)
            bitmask[row].copy_(self._stop_row)
            return
        self._fill(bitmask, row)
        if self._lexer is None or self._closing is None:
            return
        state = self._lexer.state
        budget = self._close_budget and tokens_left is not None and tokens_left <= self.close_reserve + state.depth
        if not budget and not (state.in_string and state.chars >= MAX_STRING_CHARS):
            return
        if self._closing.narrow(bitmask, row, state) or not budget:
            return
        if not self._plan and not self._plan_failed:
            # Searched as far as closing from the start took (or the budget, if larger); a failed
            # search is not repeated (each costs up to LOOKAHEAD + 1 masks per token of the limit).
            limit = min(MAX_CLOSING_PATH, max(tokens_left, self.close_reserve + state.depth))
            path = closing_path(self.copy(), self._closing, limit=limit)
            self._plan, self._plan_failed = path or [], path is None
        if self._plan:
            allowed = bitmask[row, self._plan[0] // 32] >> (self._plan[0] % 32) & 1
            if bool(allowed):  # always, unless the row was narrowed by something else
                bitmask[row].copy_(token_ids_bitmask_row(self._plan[:1], self.vocab_size))

    @property
    def lex_state(self) -> Optional[LexState]:
        """Where the JSON output stands (``closing.LexState``); None: closing not enabled."""
        return None if self._lexer is None else self._lexer.state

    def enable_closing(self, vocab: ClosingVocab, reserve: int, budget: bool = True) -> None:
        """Close the output in time (``closing``); for JSON grammars, on a fresh matcher.

        Args:
            vocab: the backend's closing tokens and token bytes.
            reserve: ``close_reserve``, in tokens (>= 0).
            budget: close the document when the budget runs low (False where the grammar has no
                closing path from its start, e.g. an email ``format`` or ``minItems: 1000``: only
                strings past ``MAX_STRING_CHARS`` are closed then).
        Raises:
            ValueError: tokens were accepted already, or ``reserve`` < 0.
        """
        if self.num_accepted or reserve < 0:
            raise ValueError("enable_closing needs a fresh matcher and a reserve >= 0")
        self._closing, self._lexer, self.close_reserve = vocab, JsonLexer(), reserve
        self._close_budget = budget

    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens (a stop token counts as one).

        Raises:
            ValueError: ``num_tokens`` < 0 or more than were accepted (or than the backend keeps;
                then rebuild with ``replay``).
        """
        if num_tokens < 0 or num_tokens > self.num_accepted:
            raise ValueError(f"cannot roll back {num_tokens} token(s); {self.num_accepted} accepted")
        if num_tokens:
            self._rollback(num_tokens)
            self.num_accepted -= num_tokens
            if self._lexer is not None:
                self._lexer.pop(num_tokens)
                self._plan, self._plan_failed = [], False

    def reset(self) -> None:
        """Back to the initial state (nothing accepted)."""
        self._reset()
        self.num_accepted = 0
        if self._lexer is not None:
            self._lexer.reset()
            self._plan, self._plan_failed = [], False

    def copy(self) -> "GrammarMatcher":
        """An independent matcher in the same state (sharing the compiled grammar)."""
        twin = self._copy()
        twin.num_accepted = self.num_accepted
        if self._lexer is not None:
            twin._closing, twin._lexer = self._closing, self._lexer.copy()
            twin.close_reserve, twin._plan = self.close_reserve, list(self._plan)
            twin._close_budget, twin._plan_failed = self._close_budget, self._plan_failed
        return twin

    def replay(self, token_ids: Iterable[int]) -> bool:
        """Reset, then accept ``token_ids`` in order (rebuild after a state loss).

        Returns False at the first rejected token (the state then holds the accepted prefix).
        """
        self.reset()
        return all(self.accept_token(t) for t in token_ids)

    @abstractmethod
    def is_terminated(self) -> bool:
        """True once a stop token was accepted: the request is finished (finish_reason stop)."""

    @abstractmethod
    def is_completed(self) -> bool:
        """True when the output so far fully matches (stop tokens are allowed now)."""

    # -- backend hooks ---------------------------------------------------------------------------
    @abstractmethod
    def _copy(self) -> "GrammarMatcher":
        """A matcher in the same backend state (the base class copies its own state over)."""

    @abstractmethod
    def _accept(self, token_id: int) -> bool: ...

    @abstractmethod
    def _fill(self, bitmask: "torch.Tensor", row: int) -> None: ...

    @abstractmethod
    def _rollback(self, num_tokens: int) -> None: ...

    @abstractmethod
    def _reset(self) -> None: ...


class GrammarBackend(ABC):
    """Compiles specs for one model's tokenizer and makes matchers. ``compile`` is thread-safe.

    Attributes:
        name: ``"xgrammar"`` or ``"outlines"``.
        vocab_size: the model's logits width V (bitmask width basis; may exceed the tokenizer's).
        eos_token_ids: stop tokens allowed when a grammar is complete.
        any_whitespace: JSON may use flexible whitespace (default False: compact separators).
        closing_vocab: set by a backend whose JSON matchers close in time (``closing``).
    """

    name: str = "base"
    closing_vocab: Optional[ClosingVocab] = None

    def __init__(self, vocab_size: int, eos_token_ids: Sequence[int], any_whitespace: bool = False):
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        if not eos_token_ids:
            raise ValueError("a grammar backend needs at least one EOS token id")
        bad = [t for t in eos_token_ids if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"EOS token ids {bad} outside the vocabulary [0, {vocab_size})")
        self.vocab_size = vocab_size
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(int(t) for t in eos_token_ids))
        self.any_whitespace = any_whitespace

    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        """Compile ``spec`` (blocking; call from a worker thread, see ``GrammarCache``).

        Raises:
            GrammarError: invalid or unsupported grammar, with the compiler's message.
        """
        import dataclasses
        import time

        start = time.perf_counter()
        try:
            handle = self._compile(spec)
        except GrammarError:
            raise
        except Exception as exc:  # the libraries raise RuntimeError/ValueError/TypeError
            raise GrammarError(compiler_message(exc)) from exc
        closes = self.closing_vocab is not None and closes_output(spec)
        compiled = CompiledGrammar(spec, self.name, handle, closes=closes)
        closing = 0
        if closes:
            probe = self._new_matcher(compiled)
            probe.enable_closing(self.closing_vocab, 0)  # type: ignore[arg-type]
            closing = closing_path_length(probe, self.closing_vocab)  # type: ignore[arg-type]
        return dataclasses.replace(compiled, compile_seconds=time.perf_counter() - start,
                                   closing_tokens=closing)

    def new_matcher(self, compiled: CompiledGrammar) -> GrammarMatcher:
        """A fresh matcher (initial state) over ``compiled``; where ``compiled.closes`` (JSON
        grammars) it closes in time with ``close_reserve = compiled.closing_tokens + closing.CLOSE_MARGIN``.

        Raises:
            ValueError: ``compiled`` came from another backend.
        """
        if compiled.backend != self.name:
            raise ValueError(f"grammar compiled by {compiled.backend!r}, not {self.name!r}")
        matcher = self._new_matcher(compiled)
        if self.closing_vocab is not None and compiled.closes:
            matcher.enable_closing(self.closing_vocab, compiled.closing_tokens + CLOSE_MARGIN,
                                   budget=compiled.closing_tokens < MAX_CLOSING_PATH)
        return matcher

    def clear_cache(self) -> None:
        """Drop any library-side compile cache (``/flush_cache``)."""

    @abstractmethod
    def _compile(self, spec: GrammarSpec) -> Any: ...

    @abstractmethod
    def _new_matcher(self, compiled: CompiledGrammar) -> GrammarMatcher: ...
