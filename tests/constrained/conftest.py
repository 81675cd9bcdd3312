"""Fixtures for the grammar tests: the two offline tokenizers and one backend per (name, model)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import pytest
import torch

from radixlm.constrained import GrammarBackend, create_grammar_backend
from radixlm.constrained.vocab import token_bytes_table
from tests.conftest import STORIES_HF
from tests.constrained.driver import token_bias


@dataclass
class Model:
    name: str
    tokenizer: Any
    vocab_size: int
    eos: tuple[int, ...]
    table: list[Optional[bytes]]
    bias: torch.Tensor

    def text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)


_MODELS: dict[str, Model] = {}
_BACKENDS: dict[tuple[str, str, bool], GrammarBackend] = {}


def load_model(name: str) -> Model:
    if name not in _MODELS:
        from radixlm.srt.model_loader import ModelLoadError, load_tokenizer, resolve_model_path

        try:
            folder = str(STORIES_HF) if name == "stories" else resolve_model_path(None)
        except ModelLoadError as e:
            pytest.fail(f"model unavailable: {e}")
        tok = load_tokenizer(folder)
        vocab = len(tok)
        eos = (int(tok.eos_token_id),)
        table = token_bytes_table(tok, vocab)
        _MODELS[name] = Model(name, tok, vocab, eos, table, token_bias(table, eos, vocab))
    return _MODELS[name]


def get_backend(backend: str, model: str, any_whitespace: bool = False) -> GrammarBackend:
    key = (backend, model, any_whitespace)
    if key not in _BACKENDS:
        m = load_model(model)
        be = create_grammar_backend(backend, m.tokenizer, m.vocab_size, m.eos,
                                    any_whitespace=any_whitespace)
        assert be is not None
        _BACKENDS[key] = be
    return _BACKENDS[key]


@pytest.fixture(scope="session")
def smollm2() -> Model:
    return load_model("smollm2")


@pytest.fixture(scope="session")
def stories() -> Model:
    return load_model("stories")
