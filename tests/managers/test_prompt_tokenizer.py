"""PromptTokenizer: the token-count lower bound, the cheap refusal, tokenizing off the event loop."""

from __future__ import annotations

import asyncio
import random

import pytest

from radixlm.managers.prompt_tokenizer import (INLINE_MAX_CHARS, PromptTokenizer, PromptTooLongError,
                                               max_token_bytes)
from radixlm.srt.model_loader import load_tokenizer
from tests.conftest import STORIES_HF, STORY_PROMPTS

CONTEXT = 2048


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(str(STORIES_HF))


@pytest.fixture(scope="module")
def pt(tok):
    return PromptTokenizer(tok, CONTEXT)


def _random_text(rng: random.Random, n: int) -> str:
    alphabet = ["a", "e", "the ", " ", "  ", "\n", "\t", "é", "e\u0301", "\u4e00", "\U0001f600", "\x00", "<s>",
                "</s>", "little", " Lily", "\u200b", "\u00a0", "0", "9"]
    return "".join(rng.choice(alphabet) for _ in range(n))


def test_max_token_bytes_is_the_longest_token(tok, pt):
    longest = max(len(t.encode()) for t in tok.get_vocab())
    assert pt.max_token_bytes == max_token_bytes(tok) >= longest


def test_lower_bound_holds_on_stories_and_random_text(tok, pt):
    rng = random.Random(0)
    texts = STORY_PROMPTS + [_random_text(rng, rng.randint(1, 3000)) for _ in range(40)]
    for text in texts:
        assert len(tok.encode(text)) >= pt.min_tokens(text), text[:80]


def test_certainly_too_long_is_refused_naming_the_context(pt):
    too_long = "a" * (CONTEXT * pt.max_token_bytes)
    with pytest.raises(PromptTooLongError) as e:
        pt.check_fits(too_long)
    assert e.value.context_len == CONTEXT and e.value.min_tokens >= CONTEXT
    assert f"context length ({CONTEXT} tokens)" in str(e.value)
    pt.check_fits("a" * ((CONTEXT - 1) * pt.max_token_bytes))  # might fit: left to the exact count


def test_a_tokenizer_that_drops_whitespace_gets_no_shortcut():
    """A WordLevel tokenizer splitting on whitespace drops every space: a run of spaces has no
    tokens at all, so no byte count bounds the token count."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1, "bb": 2}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    pt = PromptTokenizer(tok, 16)
    assert pt.max_token_bytes is None and pt.min_tokens(" " * 10_000) == 0
    pt.check_fits(" " * 10_000)  # may be empty after tokenizing: never refused unseen


def test_encode_matches_the_tokenizer_inline_and_in_the_pool(tok, pt):
    small = ["Once upon a time", "Lily"]
    large = [_random_text(random.Random(1), INLINE_MAX_CHARS + 100), "Lily"]
    for texts in (small, large):
        assert asyncio.run(pt.encode(texts)) == [list(tok.encode(t)) for t in texts]
    assert asyncio.run(pt.encode(["Lily"], add_special_tokens=False)) == [tok.encode("Lily", add_special_tokens=False)]


def test_large_text_is_tokenized_while_the_loop_keeps_running(tok):
    """A concurrent coroutine makes progress while a large text is tokenized (inline tokenizing
    would run the whole encode in one step of the loop: no tick in between)."""
    pt = PromptTokenizer(tok, 10**7)  # a context the text fits in: no early refusal
    text = "Once upon a time, there was a little girl named Lily. " * 4000  # ~220 KB

    async def main() -> tuple[int, list[list[int]]]:
        task = asyncio.ensure_future(pt.encode([text]))
        ticks = 0
        while not task.done():
            await asyncio.sleep(0)
            ticks += 1
        return ticks, task.result()

    ticks, ids = asyncio.run(main())
    assert ticks > 10 and len(ids[0]) > CONTEXT


def test_encode_refuses_before_tokenizing(pt):
    with pytest.raises(PromptTooLongError):
        asyncio.run(pt.encode(["Lily", "x" * (CONTEXT * pt.max_token_bytes * 2)]))
