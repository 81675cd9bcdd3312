"""Grammar-constrained decoding: JSON schema, any-JSON object, regex, EBNF and structural tags.

Pieces (see ``shared/DESIGN.md`` section 5):

* ``GrammarSpec`` / ``GrammarError`` (``spec``): what a request asks for; invalid -> HTTP 400.
* ``create_grammar_backend``: ``xgrammar`` (default; all kinds) or ``outlines`` (no EBNF, no
  structural tags).
* ``GrammarCache`` (``cache``): compiles off the critical path, once per ``(kind, text)``.
* ``GrammarMatcher`` (``base``): per-request state; ``fill_bitmask`` before sampling,
  ``accept_token`` after, ``is_terminated`` once a stop token was accepted.
* ``allocate_bitmask`` / ``fill_batch_bitmask``: the packed int32 ``(bs, ceil(V/32))`` mask applied
  by ``radixlm.kernels.sampling.apply_vocab_mask``.

JSON output closes in time (``closing``): a string after 256 characters, the whole document when
the request's remaining ``max_new_tokens`` reach the grammar's closing reserve; numbers the schema
leaves unbounded get at most 16 integer and 6 fraction digits (``schema_rewrite``).

JSON whitespace: compact by default (xgrammar ``", "``/``": "`` separators; outlines at most one
space between JSON tokens) so output can't run away in whitespace; ``any_whitespace=True`` lets
the model choose any whitespace.

Importing this package imports neither torch nor a grammar library.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Optional, Union

from radixlm.constrained.base import (
    CompiledGrammar,
    GrammarBackend,
    GrammarMatcher,
    allocate_bitmask,
    num_bitmask_words,
)
from radixlm.constrained.cache import GrammarCache
from radixlm.constrained.spec import GrammarError, GrammarSpec

if TYPE_CHECKING:
    import torch

GRAMMAR_BACKENDS = ("xgrammar", "outlines", "none")

__all__ = [
    "GRAMMAR_BACKENDS", "CompiledGrammar", "GrammarBackend", "GrammarCache", "GrammarError",
    "GrammarMatcher", "GrammarSpec", "allocate_bitmask", "create_grammar_backend",
    "fill_batch_bitmask", "num_bitmask_words",
]


def create_grammar_backend(name: str, tokenizer: Any, vocab_size: int,
                           eos_token_ids: Union[int, Iterable[int], None], *,
                           any_whitespace: bool = False) -> Optional[GrammarBackend]:
    """Build the backend named by ``--grammar-backend`` (heavy imports happen here).

    Args:
        name: ``"xgrammar"``, ``"outlines"`` or ``"none"`` (returns None: grammars unsupported).
        tokenizer: the model's HF tokenizer.
        vocab_size: the model's logits width V (bitmask width basis; may exceed the tokenizer).
        eos_token_ids: the stop token id(s) allowed once a grammar is complete; None -> the
            tokenizer's ``eos_token_id``.
        any_whitespace: allow flexible JSON whitespace (default: compact).
    Raises:
        ValueError: unknown name, no EOS id, or an EOS id outside ``[0, vocab_size)``.
    """
    if name == "none":
        return None
    if eos_token_ids is None:
        eos_token_ids = getattr(tokenizer, "eos_token_id", None)
    if eos_token_ids is None:
        raise ValueError("no EOS token id: pass eos_token_ids")
    eos = [int(eos_token_ids)] if isinstance(eos_token_ids, int) else [int(t) for t in eos_token_ids]
    if name == "xgrammar":
        from radixlm.constrained.xgrammar_backend import XGrammarBackend

        return XGrammarBackend(tokenizer, vocab_size, eos, any_whitespace=any_whitespace)
    if name == "outlines":
        from radixlm.constrained.outlines_backend import OutlinesBackend

        return OutlinesBackend(tokenizer, vocab_size, eos, any_whitespace=any_whitespace)
    raise ValueError(f"unknown grammar backend {name!r}; expected one of {GRAMMAR_BACKENDS}")


def fill_batch_bitmask(matchers: Sequence[Optional[GrammarMatcher]], vocab_size: int,
                       tokens_left: Optional[Sequence[Optional[int]]] = None
                       ) -> Optional["torch.Tensor"]:
    """One step's mask for a batch: None when no row is constrained, else a CPU int32
    ``(len(matchers), ceil(vocab_size/32))`` bitmask whose row i is filled by ``matchers[i]`` and
    left all-ones (unconstrained) where ``matchers[i]`` is None.

    ``tokens_left[i]``: output tokens row i may still produce, this one included (None or absent:
    no budget); a JSON grammar closes its output when that runs low (``GrammarMatcher.fill_bitmask``).
    """
    if all(m is None for m in matchers):
        return None
    bitmask = allocate_bitmask(len(matchers), vocab_size)
    for row, matcher in enumerate(matchers):
        if matcher is not None:
            matcher.fill_bitmask(bitmask, row, None if tokens_left is None else tokens_left[row])
    return bitmask
