"""xgrammar backend (the default): JSON schema, any-JSON object, regex and EBNF.

Tokenizer info is built once per backend from the HF tokenizer (``TokenizerInfo.from_huggingface``
detects byte-level BPE vs SentencePiece byte fallback), padded to the model's logits width; special
tokens other than the stop tokens are blanked so a grammar never emits them as text. JSON schemas
pass through ``schema_rewrite.patch_xgrammar_schema`` (length-bounded strings could otherwise emit
raw control characters, upstream xgrammar#800; unbounded numbers get bounds). ``json_object`` is
``schema_rewrite.ANY_OBJECT_SCHEMA`` (any JSON object, numbers bounded) through the same patch.

Structural tags (``structural_tag``): every JSON-style ``json_schema`` format inside is patched the
same way and lowered to the EBNF of ``Grammar.from_json_schema`` (a ``grammar`` format), because
xgrammar's own structural-tag JSON allows any whitespace between tokens: with the lowering, tool-call
arguments get this backend's whitespace (compact unless ``any_whitespace``) like every other JSON.
``lower_structural_tag`` is tokenizer-free, so the HTTP edge checks tags with it before generation.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from radixlm.constrained.base import CompiledGrammar, GrammarBackend, GrammarMatcher
from radixlm.constrained.closing import ClosingVocab
from radixlm.constrained.schema_rewrite import ANY_OBJECT_SCHEMA, patch_xgrammar_schema
from radixlm.constrained.spec import GrammarError, GrammarSpec
from radixlm.constrained.structural_tag import load_structural_tag, map_formats
from radixlm.constrained.vocab import special_token_ids, token_bytes_table

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    import torch

_ANY_OBJECT_SCHEMA = patch_xgrammar_schema(json.dumps(ANY_OBJECT_SCHEMA))


def lower_structural_tag(text: str, any_whitespace: bool = False) -> str:
    """The structural tag ``text`` with each JSON-style ``json_schema`` format patched
    (``patch_xgrammar_schema``) and lowered to an EBNF ``grammar`` format, checked by building
    xgrammar's tokenizer-free ``Grammar`` of the whole tag.

    Raises:
        GrammarError: not a structural tag object, a schema xgrammar cannot convert, or a tag
            xgrammar rejects (the compiler's message).
    """
    import xgrammar

    from radixlm.constrained.base import compiler_message

    tag = load_structural_tag(text)
    if tag is None:
        raise GrammarError('a structural tag must be a JSON object {"type": "structural_tag", "format": {...}}')

    def lower(fmt: dict[str, Any]) -> dict[str, Any]:
        if fmt.get("type") != "json_schema" or fmt.get("style", "json") != "json" or fmt.get("any_order"):
            return fmt
        schema = fmt.get("json_schema")
        schema_text = json.dumps(schema) if not isinstance(schema, str) else schema
        try:
            grammar = xgrammar.Grammar.from_json_schema(patch_xgrammar_schema(schema_text),
                                                         any_whitespace=any_whitespace)
        except Exception as exc:  # RuntimeError/ValueError from the converter
            raise GrammarError(compiler_message(exc)) from exc
        return {"type": "grammar", "grammar": str(grammar)}

    lowered = json.dumps({**tag, "format": map_formats(tag["format"], lower)}, ensure_ascii=False)
    try:
        xgrammar.Grammar.from_structural_tag(lowered)
    except Exception as exc:
        raise GrammarError(compiler_message(exc)) from exc
    return lowered


class XGrammarMatcher(GrammarMatcher):
    """Wraps ``xgrammar.GrammarMatcher`` (rollback depth unlimited in xgrammar >= 0.1.2x)."""

    def __init__(self, matcher: Any, vocab_size: int, stop_token_ids: Sequence[int]):
        super().__init__(vocab_size, stop_token_ids)
        self._m = matcher

    def is_terminated(self) -> bool:
        return bool(self._m.is_terminated())

    def is_completed(self) -> bool:
        return bool(self._m.is_completed())

    def _copy(self) -> "XGrammarMatcher":
        return XGrammarMatcher(self._m.fork(), self.vocab_size, self.stop_token_ids)

    def _accept(self, token_id: int) -> bool:
        return bool(self._m.accept_token(token_id))

    def _fill(self, bitmask: "torch.Tensor", row: int) -> None:
        self._m.fill_next_token_bitmask(bitmask, row)

    def _rollback(self, num_tokens: int) -> None:
        self._m.rollback(num_tokens)

    def _reset(self) -> None:
        self._m.reset()


class XGrammarBackend(GrammarBackend):
    """Compiles with one thread-safe ``xgrammar.GrammarCompiler`` per model.

    Args:
        tokenizer: the model's HF tokenizer.
        vocab_size: logits width V (>= the tokenizer's ids that can be sampled).
        eos_token_ids: stop tokens (allowed once the grammar is complete).
        any_whitespace: JSON allows any whitespace between tokens (xgrammar's flexible mode);
            default False: compact ``", "`` / ``": "`` separators, so JSON can't run away in spaces.
        max_threads: xgrammar's internal compile threads.
    """

    name = "xgrammar"

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int],
                 any_whitespace: bool = False, max_threads: int = 8):
        super().__init__(vocab_size, eos_token_ids, any_whitespace)
        import xgrammar

        self._xgr = xgrammar
        self.tokenizer_info = self._tokenizer_info(tokenizer)
        self._compiler = xgrammar.GrammarCompiler(self.tokenizer_info, max_threads=max_threads)
        try:
            table = token_bytes_table(tokenizer, vocab_size)
        except ValueError as e:  # a vocabulary whose bytes we cannot read: grammars still work
            logger.warning("JSON closing disabled (%s): constrained JSON may be cut at max_new_tokens", e)
        else:
            self.closing_vocab = ClosingVocab(table, self.eos_token_ids, vocab_size)

    def _tokenizer_info(self, tokenizer: Any) -> Any:
        xgr = self._xgr
        stops = list(self.eos_token_ids)
        base = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=self.vocab_size,
                                                  stop_token_ids=stops)
        # Blank special tokens (xgrammar treats an empty token as special = never allowed), and
        # pad/truncate the vocabulary to exactly V entries.
        encoded = [""] * self.vocab_size
        for tok, tid in tokenizer.get_vocab().items():
            if 0 <= tid < self.vocab_size:
                encoded[tid] = tok
        for tid in special_token_ids(tokenizer) - set(stops):
            if 0 <= tid < self.vocab_size:
                encoded[tid] = ""
        meta = json.loads(base.dump_metadata())
        meta.update(vocab_size=self.vocab_size, stop_token_ids=stops)
        return xgr.TokenizerInfo.from_vocab_and_metadata(encoded, json.dumps(meta))

    def _compile(self, spec: GrammarSpec) -> Any:
        c = self._compiler
        if spec.kind == "json_schema":
            return c.compile_json_schema(patch_xgrammar_schema(spec.text),
                                         any_whitespace=self.any_whitespace)
        if spec.kind == "json_object":
            return c.compile_json_schema(_ANY_OBJECT_SCHEMA, any_whitespace=self.any_whitespace,
                                         strict_mode=False)
        if spec.kind == "regex":
            return c.compile_regex(spec.text)
        if spec.kind == "ebnf":
            return c.compile_grammar(spec.text)
        if spec.kind == "structural_tag":
            return c.compile_structural_tag(lower_structural_tag(spec.text, self.any_whitespace))
        raise GrammarError(f"grammar kind {spec.kind!r} is not supported by the xgrammar backend")

    def _new_matcher(self, compiled: CompiledGrammar) -> XGrammarMatcher:
        return XGrammarMatcher(self._xgr.GrammarMatcher(compiled.handle), self.vocab_size,
                               self.eos_token_ids)

    def clear_cache(self) -> None:
        self._compiler.clear_cache()
