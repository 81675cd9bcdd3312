"""Stop strings that match at the very start of the output (issue: a SentencePiece first token's
leading space was dropped from the stop-check window, so `stop: [" "]` on " It was…" returned " It"
and `stop: [" It"]` matched only the second occurrence). Derived from the model's own greedy output,
so each case hits offset 0, the inside of the first token, or the first two tokens."""

from __future__ import annotations

import pytest

from radixlm.srt.engine import Engine
from tests.engine.test_greedy_vs_hf import assert_clean

PROMPT = "The cat sat on the mat and"
GREEDY = {"temperature": 0, "max_new_tokens": 12}


@pytest.fixture(scope="module", params=[1, 16], ids=["page1", "page16"])
def engine(request, stories_path):
    return Engine(stories_path, dtype="float32", max_total_tokens=2048, page_size=request.param)


@pytest.fixture(scope="module")
def first_tokens(engine):
    """The greedy output's text and the text of its first one and two tokens, read in context."""
    out = engine.generate(PROMPT, GREEDY)
    ids = engine.tokenizer.encode(PROMPT)
    text = lambda n: engine.tokenizer.decode(ids + out["output_ids"][:n])[len(engine.tokenizer.decode(ids)):]  # noqa: E731
    one, two = text(1), text(2)
    assert out["text"].startswith(two) and one.startswith(" ") and len(one) >= 2 and len(two) > len(one)
    return out["text"], one, two


def _stopped(engine, stop):
    out = engine.generate(PROMPT, {**GREEDY, "stop": [stop]})
    assert_clean(engine)
    return out


def test_stop_is_the_first_character(engine, first_tokens):
    full, one, _ = first_tokens
    out = _stopped(engine, one[0])  # " ": the first token's leading space
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": one[0]}
    assert out["text"] == "" and len(out["output_ids"]) == 1


def test_stop_inside_the_first_token(engine, first_tokens):
    full, one, _ = first_tokens
    stop = one[:2]
    out = _stopped(engine, stop)
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert out["text"] == "" and len(out["output_ids"]) == 1


def test_stop_is_the_whole_first_token(engine, first_tokens):
    full, one, _ = first_tokens
    out = _stopped(engine, one)
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": one}
    assert out["text"] == "" and len(out["output_ids"]) == 1


def test_stop_across_the_first_two_tokens(engine, first_tokens):
    full, one, two = first_tokens
    stop = two[:len(one) + 1]
    out = _stopped(engine, stop)
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert out["text"] == "" and len(out["output_ids"]) == 2


def test_no_stop_trim_keeps_a_stop_at_offset_zero(engine, first_tokens):
    full, one, _ = first_tokens
    out = engine.generate(PROMPT, {**GREEDY, "stop": [one], "no_stop_trim": True})
    assert out["meta_info"]["finish_reason"]["matched"] == one
    assert out["text"] == one
