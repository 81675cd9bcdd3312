"""Matcher state: bitmask layout and rows, termination, rollback, copy, reset/replay, padding."""

from __future__ import annotations

import pytest
import torch

from radixlm.constrained import (
    GrammarSpec,
    allocate_bitmask,
    create_grammar_backend,
    fill_batch_bitmask,
)
from radixlm.constrained.base import bitmask_to_bool, token_ids_bitmask_row
from radixlm.kernels.sampling import apply_vocab_mask, unpack_vocab_mask
from tests.constrained.conftest import get_backend, load_model
from tests.constrained.driver import generate

BACKENDS = ("xgrammar", "outlines")
SCHEMA = GrammarSpec.json_schema({
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "n": {"type": "integer"}},
    "required": ["name", "n"],
})


def _allowed(matcher, vocab_size: int) -> list[int]:
    bm = allocate_bitmask(1, vocab_size)
    matcher.fill_bitmask(bm, 0)
    return bitmask_to_bool(bm, vocab_size)[0].nonzero().flatten().tolist()


def test_allocate_bitmask_shape_and_unconstrained() -> None:
    bm = allocate_bitmask(3, 49153)
    assert bm.dtype == torch.int32 and bm.shape == (3, 1537) and bm.device.type == "cpu"
    assert bool(unpack_vocab_mask(bm, 49153).all())


def test_layout_matches_sampling_kernel() -> None:
    """bit j % 32 of word j // 32 = token j, including bit 31 (the int32 sign bit)."""
    ids = [0, 5, 31, 32, 63, 64, 95, 99]
    row = token_ids_bitmask_row(ids, 100)
    bm = row.unsqueeze(0)
    assert unpack_vocab_mask(bm, 100)[0].nonzero().flatten().tolist() == ids
    assert torch.equal(bitmask_to_bool(bm, 100), unpack_vocab_mask(bm, 100))
    logits = torch.zeros(1, 100)
    apply_vocab_mask(logits, bm)
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == ids
    with pytest.raises(ValueError):
        token_ids_bitmask_row([100], 100)


@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_mask_matches_sampling_kernel(backend: str) -> None:
    m = load_model("stories")
    be = get_backend(backend, "stories")
    matcher = be.new_matcher(be.compile(SCHEMA))
    for tok in ("<0x7B>", "<0x22>"):  # '{"'
        assert matcher.accept_token(m.tokenizer.convert_tokens_to_ids(tok))
    bm = allocate_bitmask(1, m.vocab_size)
    matcher.fill_bitmask(bm, 0)
    assert torch.equal(bitmask_to_bool(bm, m.vocab_size), unpack_vocab_mask(bm, m.vocab_size))
    allowed = unpack_vocab_mask(bm, m.vocab_size)[0]
    assert allowed[m.tokenizer.convert_tokens_to_ids("<0x6E>")]  # "n" of "name"
    assert not allowed[m.tokenizer.convert_tokens_to_ids("<0x7D>")]  # "}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_fill_row_leaves_other_rows_untouched(backend: str) -> None:
    m = load_model("smollm2")
    be = get_backend(backend, "smollm2")
    matcher = be.new_matcher(be.compile(SCHEMA))
    bm = torch.randint(-2**31, 2**31 - 1, (4, (m.vocab_size + 31) // 32), dtype=torch.int32)
    before = bm.clone()
    matcher.fill_bitmask(bm, 2)
    assert torch.equal(bm[[0, 1, 3]], before[[0, 1, 3]])
    assert _allowed(matcher, m.vocab_size) == bitmask_to_bool(bm, m.vocab_size)[2].nonzero().flatten().tolist()
    with pytest.raises(ValueError):
        matcher.fill_bitmask(bm, 4)
    with pytest.raises(ValueError):
        matcher.fill_bitmask(bm.to(torch.int64), 0)
    with pytest.raises(ValueError):
        matcher.fill_bitmask(bm[:, :-1].contiguous(), 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fill_batch_bitmask_mixed_rows(backend: str) -> None:
    m = load_model("stories")
    be = get_backend(backend, "stories")
    assert fill_batch_bitmask([None, None], m.vocab_size) is None
    matcher = be.new_matcher(be.compile(GrammarSpec("regex", "ab")))
    bm = fill_batch_bitmask([None, matcher, None], m.vocab_size)
    assert bm is not None and bm.shape == (3, 16)
    assert bool((bm[0] == -1).all()) and bool((bm[2] == -1).all())
    assert bitmask_to_bool(bm, m.vocab_size)[1].sum() < m.vocab_size


@pytest.mark.parametrize("backend", BACKENDS)
def test_termination_allows_only_eos(backend: str) -> None:
    m = load_model("stories")
    be = get_backend(backend, "stories")
    matcher = be.new_matcher(be.compile(GrammarSpec("regex", "[0-9]{1,3}")))
    eos = m.eos[0]
    assert not matcher.accept_token(eos)  # nothing matched yet: EOS not allowed
    assert eos not in _allowed(matcher, m.vocab_size)
    one = m.tokenizer.convert_tokens_to_ids("<0x31>")
    assert matcher.accept_token(one) and matcher.is_completed() and not matcher.is_terminated()
    allowed = _allowed(matcher, m.vocab_size)
    assert eos in allowed and one in allowed  # complete, but more digits may follow
    assert matcher.accept_token(eos) and matcher.is_terminated()
    assert _allowed(matcher, m.vocab_size) == [eos]
    assert not matcher.accept_token(one) and not matcher.accept_token(eos)
    assert matcher.num_accepted == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_invalid_token_rejected_state_unchanged(backend: str) -> None:
    m = load_model("stories")
    be = get_backend(backend, "stories")
    matcher = be.new_matcher(be.compile(GrammarSpec("regex", "ab")))
    before = _allowed(matcher, m.vocab_size)
    for bad in (m.tokenizer.convert_tokens_to_ids("<0x62>"), 1, -1, m.vocab_size, 10**9):
        assert not matcher.accept_token(bad)
    assert _allowed(matcher, m.vocab_size) == before and matcher.num_accepted == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_rollback_restores_state(backend: str) -> None:
    m = load_model("smollm2")
    be = get_backend(backend, "smollm2")
    compiled = be.compile(SCHEMA)
    out = generate(be.new_matcher(compiled), m.vocab_size, m.bias, seed=3)
    assert out.terminated and len(out.ids) >= 5
    matcher = be.new_matcher(compiled)
    masks = []
    for tid in out.ids:
        masks.append(_allowed(matcher, m.vocab_size))
        assert matcher.accept_token(tid)
    assert matcher.is_terminated()
    matcher.rollback(1)  # un-accept EOS
    assert not matcher.is_terminated() and matcher.is_completed()
    assert _allowed(matcher, m.vocab_size) == masks[-1]
    matcher.rollback(3)
    assert _allowed(matcher, m.vocab_size) == masks[-4]
    assert all(matcher.accept_token(t) for t in out.ids[-4:]) and matcher.is_terminated()
    matcher.rollback(len(out.ids))
    assert matcher.num_accepted == 0 and _allowed(matcher, m.vocab_size) == masks[0]
    with pytest.raises(ValueError):
        matcher.rollback(1)
    with pytest.raises(ValueError):
        matcher.rollback(-1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_copy_reset_replay(backend: str) -> None:
    m = load_model("smollm2")
    be = get_backend(backend, "smollm2")
    compiled = be.compile(SCHEMA)
    out = generate(be.new_matcher(compiled), m.vocab_size, m.bias, seed=5)
    half = len(out.ids) // 2
    matcher = be.new_matcher(compiled)
    assert all(matcher.accept_token(t) for t in out.ids[:half])
    twin = matcher.copy()
    assert twin.num_accepted == half
    assert all(twin.accept_token(t) for t in out.ids[half:]) and twin.is_terminated()
    assert not matcher.is_terminated() and matcher.num_accepted == half  # independent
    rebuilt = be.new_matcher(compiled)
    assert rebuilt.replay(out.ids[:half])
    assert _allowed(rebuilt, m.vocab_size) == _allowed(matcher, m.vocab_size)
    matcher.reset()
    assert matcher.num_accepted == 0
    assert _allowed(matcher, m.vocab_size) == _allowed(be.new_matcher(compiled), m.vocab_size)
    assert not rebuilt.replay([m.eos[0]])  # EOS first is rejected; state = empty prefix


@pytest.mark.parametrize("backend", BACKENDS)
def test_padded_vocab_and_several_eos(backend: str) -> None:
    """Logits wider than the tokenizer: padding ids are never allowed; every EOS id ends."""
    m = load_model("stories")
    width = m.vocab_size + 40
    extra_eos = m.tokenizer.convert_tokens_to_ids("<s>")  # a special token standing in as 2nd EOS
    be = create_grammar_backend(backend, m.tokenizer, width, [m.eos[0], extra_eos])
    assert be is not None and be.vocab_size == width
    matcher = be.new_matcher(be.compile(GrammarSpec("regex", "[a-c]+")))
    allowed = _allowed(matcher, width)
    assert allowed and max(allowed) < m.vocab_size
    assert matcher.accept_token(m.tokenizer.convert_tokens_to_ids("<0x61>"))
    allowed = _allowed(matcher, width)
    assert m.eos[0] in allowed and extra_eos in allowed
    assert matcher.accept_token(extra_eos) and matcher.is_terminated()
    assert _allowed(matcher, width) == sorted([m.eos[0], extra_eos])


@pytest.mark.parametrize("backend", BACKENDS)
def test_special_tokens_never_allowed_as_text(backend: str) -> None:
    m = load_model("smollm2")
    be = get_backend(backend, "smollm2")
    matcher = be.new_matcher(be.compile(GrammarSpec("regex", '"[^"]*"')))
    assert matcher.accept_token(m.tokenizer.convert_tokens_to_ids('"'))
    allowed = set(_allowed(matcher, m.vocab_size))
    im_start = m.tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert im_start not in allowed and 0 not in allowed
    assert m.tokenizer.convert_tokens_to_ids("Ġthe") in allowed


def test_backend_factory() -> None:
    m = load_model("stories")
    assert create_grammar_backend("none", m.tokenizer, m.vocab_size, m.eos) is None
    with pytest.raises(ValueError, match="unknown grammar backend"):
        create_grammar_backend("llguidance", m.tokenizer, m.vocab_size, m.eos)
    with pytest.raises(ValueError):
        create_grammar_backend("xgrammar", m.tokenizer, m.vocab_size, [m.vocab_size])
    be = create_grammar_backend("outlines", m.tokenizer, m.vocab_size, None)  # tokenizer's EOS
    assert be is not None and be.eos_token_ids == m.eos
    other = get_backend("xgrammar", "stories")
    with pytest.raises(ValueError, match="compiled by"):
        be.new_matcher(other.compile(GrammarSpec("regex", "a")))
