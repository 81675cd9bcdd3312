"""outlines-core backend: JSON schema and any-JSON object (via a regex), regex; no EBNF.

The ``Vocabulary`` is built here from the HF tokenizer's token bytes (``vocab.token_bytes_table``),
never with ``Vocabulary.from_pretrained`` (that downloads from the hub). A JSON schema becomes a
regex through ``outlines_core.json_schema.build_regex_from_schema`` with a whitespace pattern that
allows at most one space between JSON tokens (``any_whitespace=True``: any run of spaces, tabs
and newlines), then an ``Index`` (a token-level DFA shared by all matchers of the grammar).
Numeric bounds, which outlines-core ignores, are spliced in (numbers without bounds get 16-digit
ones) and other ignored keywords rejected (``schema_rewrite.prepare_outlines_schema``).

outlines-core 0.2.14's index gives regex alternatives leftmost-first priority (``a|abc`` stops
after ``a``; our range regexes put wider alternatives first) and, from an accepting state, moves
only to accepting states (``ab(cd)?`` stops after ``ab`` unless ``cd`` is one token): a top-level
number written one byte per token cannot take a fraction. Inside an object or array it can.

Stop tokens are handled here, not by the guide: a stop token is accepted iff the guide is in a
final state, after which the matcher is terminated.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Optional

from radixlm.constrained.base import (
    CompiledGrammar,
    GrammarBackend,
    GrammarMatcher,
    token_ids_bitmask_row,
)
from radixlm.constrained.closing import ClosingVocab
from radixlm.constrained.schema_rewrite import (
    number_range_regex,
    prepare_outlines_schema,
    splice_regex,
)
from radixlm.constrained.spec import GrammarError, GrammarSpec
from radixlm.constrained.vocab import token_bytes_table

if TYPE_CHECKING:
    import torch

COMPACT_WHITESPACE = r"[ ]?"  # at most one space between JSON tokens (outlines-core's default)
FLEXIBLE_WHITESPACE = r"[\n\t ]*"  # any_whitespace=True: unbounded, as the JSON grammar allows
EBNF_UNSUPPORTED = "EBNF is not supported by the outlines backend; use --grammar-backend xgrammar"


def any_object_regex(ws: str) -> str:
    """Regex for "any JSON object" (``json_object``), nesting bounded for a fast ``Index``.

    outlines-core's own regex for ``{"type": "object"}`` takes ~10 s to index over a 49k vocabulary;
    this one (~0.8 s) allows object values that are primitives, flat arrays of primitives or flat
    objects of primitives (nesting depth <= 2). Numbers are bounded as in a JSON schema
    (``schema_rewrite.number_range_regex``: at most 16 integer and 6 fraction digits).
    """
    from outlines_core.json_schema import BOOLEAN, NULL, STRING

    prim = f"({STRING}|{number_range_regex(None, None)}|{BOOLEAN}|{NULL})"

    def seq(item: str) -> str:  # "item, item, ..." (possibly empty)
        return f"({item}({ws},{ws}{item})*)?"

    def members(value: str) -> str:
        return rf"\{{{ws}{seq(f'{STRING}{ws}:{ws}{value}')}{ws}\}}"

    flat_array = rf"\[{ws}{seq(prim)}{ws}\]"
    return members(f"({prim}|{flat_array}|{members(prim)})")


class OutlinesMatcher(GrammarMatcher):
    """Wraps an ``outlines_core.Guide``; rollback depth is ``max_rollback`` tokens."""

    def __init__(self, guide: Any, vocab_size: int, stop_token_ids: Sequence[int],
                 max_rollback: int):
        super().__init__(vocab_size, stop_token_ids)
        self._guide = guide
        self._terminated = False
        self.max_rollback = max_rollback
        self._stop_bits: Optional["torch.Tensor"] = None

    def is_terminated(self) -> bool:
        return self._terminated

    def is_completed(self) -> bool:
        return bool(self._guide.is_finished())

    def _copy(self) -> "OutlinesMatcher":
        twin = OutlinesMatcher(copy.deepcopy(self._guide), self.vocab_size, self.stop_token_ids,
                               self.max_rollback)
        twin._terminated = self._terminated
        return twin

    def _accept(self, token_id: int) -> bool:
        if token_id in self._stop_set:
            if not self._guide.is_finished():
                return False
            self._terminated = True
            return True
        try:
            self._guide.advance(token_id, return_tokens=False)
        except ValueError:  # "No next state found ...": not allowed here, state unchanged
            return False
        return True

    def _fill(self, bitmask: "torch.Tensor", row: int) -> None:
        words = bitmask.shape[1]
        ptr = bitmask.data_ptr() + row * words * bitmask.element_size()
        self._guide.write_mask_into(ptr, words, bitmask.element_size())
        if self._guide.is_finished():  # the guide knows one EOS; allow every stop token
            if self._stop_bits is None:
                self._stop_bits = token_ids_bitmask_row(self.stop_token_ids, self.vocab_size)
            bitmask[row].bitwise_or_(self._stop_bits)

    def _rollback(self, num_tokens: int) -> None:
        n = num_tokens - 1 if self._terminated else num_tokens
        available = int(self._guide.get_allowed_rollback())
        if n > available:
            raise ValueError(f"cannot roll back {num_tokens} token(s): the outlines guide keeps "
                             f"{available}; rebuild the matcher with replay(output_ids)")
        self._terminated = False
        if n:
            self._guide.rollback_state(n)

    def _reset(self) -> None:
        self._guide.reset()
        self._terminated = False


class OutlinesBackend(GrammarBackend):
    """Compiles regexes into outlines-core ``Index`` objects over the model's vocabulary.

    Args:
        tokenizer: the model's HF tokenizer (byte-level BPE or SentencePiece byte fallback).
        vocab_size: logits width V; tokenizer ids >= V are dropped, ids beyond the tokenizer are
            never allowed.
        eos_token_ids: stop tokens; the first is the ``Vocabulary``'s EOS.
        any_whitespace: JSON may use the library's flexible whitespace (unbounded); default False
            allows at most one space between JSON tokens.
        max_rollback: tokens each matcher can ``rollback``.
    Raises:
        ValueError: the tokenizer has no token this backend can express.
    """

    name = "outlines"

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int],
                 any_whitespace: bool = False, max_rollback: int = 1024):
        super().__init__(vocab_size, eos_token_ids, any_whitespace)
        import outlines_core

        self._oc = outlines_core
        self.max_rollback = max_rollback
        self.whitespace_pattern = FLEXIBLE_WHITESPACE if any_whitespace else COMPACT_WHITESPACE
        stops = set(self.eos_token_ids)
        table = token_bytes_table(tokenizer, vocab_size)
        self.closing_vocab = ClosingVocab(table, self.eos_token_ids, vocab_size)
        by_bytes: dict[bytes, list[int]] = {}
        for tid, raw in enumerate(table):
            if raw and tid not in stops:
                by_bytes.setdefault(raw, []).append(tid)
        if not by_bytes:
            raise ValueError("the tokenizer has no token usable for grammar matching")
        self.vocabulary = outlines_core.Vocabulary(self.eos_token_ids[0], by_bytes)

    def schema_to_regex(self, schema: str) -> str:
        """The regex for a JSON schema: outlines-core's, with this backend's whitespace and the
        numeric bounds it would ignore spliced in (``schema_rewrite``).

        Raises:
            GrammarError: a schema keyword outlines-core would silently ignore.
        """
        from outlines_core.json_schema import build_regex_from_schema

        schema, splices = prepare_outlines_schema(schema)
        return splice_regex(str(build_regex_from_schema(schema, self.whitespace_pattern)), splices)

    def _compile(self, spec: GrammarSpec) -> Any:
        if spec.kind == "ebnf":
            raise GrammarError(EBNF_UNSUPPORTED)
        if spec.kind == "json_schema":
            regex = self.schema_to_regex(spec.text)
        elif spec.kind == "json_object":
            regex = any_object_regex(self.whitespace_pattern)
        elif spec.kind == "regex":
            regex = spec.text
        else:
            raise GrammarError(f"grammar kind {spec.kind!r} is not supported by the outlines backend")
        return self._oc.Index(regex, self.vocabulary)

    def _new_matcher(self, compiled: CompiledGrammar) -> OutlinesMatcher:
        guide = self._oc.Guide(compiled.handle, max_rollback=self.max_rollback)
        return OutlinesMatcher(guide, self.vocab_size, self.eos_token_ids, self.max_rollback)
