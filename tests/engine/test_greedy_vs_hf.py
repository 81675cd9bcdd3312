"""Greedy tokens of the engine equal transformers' under every scheduling variation (issue: engine core).

Oracle: HF ``generate`` on the same weights, fp32, one prompt at a time. The engine runs the same
prompts with the radix cache on/off, page sizes 1 and 16, chunked prefill 8/64/off, one request at a
time vs all at once, and a KV pool small enough to force retraction. After each run the idle
invariants hold and a cache flush frees every page.
"""

from __future__ import annotations

import pytest

from radixlm.srt.engine import Engine
from tests.conftest import STORY_PROMPTS
from tests.engine.reference import hf_greedy

MAX_NEW = 24
SP = {"temperature": 0, "max_new_tokens": MAX_NEW, "min_new_tokens": MAX_NEW}


@pytest.fixture(scope="module")
def prompts_ids(stories_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(stories_path)
    return [tok.encode(p) for p in STORY_PROMPTS]


@pytest.fixture(scope="module")
def expected(stories_path, prompts_ids):
    return hf_greedy(stories_path, tuple(map(tuple, prompts_ids)), MAX_NEW)


def assert_clean(engine: Engine) -> None:
    sched = engine.scheduler
    assert sched.is_idle()
    sched.kv.check_idle()
    assert engine.flush_cache()
    kv = sched.kv
    assert kv.pool.available_size == kv.total_tokens
    assert kv.tree.total_size() == 0


VARIANTS = {
    "default": {},
    "no_radix": {"disable_radix_cache": True},
    "page16": {"page_size": 16},
    "chunk8": {"chunked_prefill_size": 8},
    "chunk64_page16": {"chunked_prefill_size": 64, "page_size": 16},
    "chunk_off": {"chunked_prefill_size": -1},
    "fcfs_page4_chunk8": {"schedule_policy": "fcfs", "page_size": 4, "chunked_prefill_size": 8},
    "no_radix_chunk8_page16": {"disable_radix_cache": True, "chunked_prefill_size": 8, "page_size": 16},
    # auto on CPU (fp32) is radixlm's packed-panel C++ GEMM; oneDNN's and F.linear explicitly
    "gemm_torch_native": {"gemm_backend": "torch_native"},
    "gemm_onednn": {"gemm_backend": "onednn"},
    # auto on CPU is the C++ kernel; torch_native (the oracle's algorithm, and the fallback) explicitly
    "attn_torch_native": {"attention_backend": "torch_native"},
    "elementwise_torch_native": {"elementwise_backend": "torch_native"},  # auto on CPU: fused C++ ops
    "attn_torch_native_page16_chunk8": {"attention_backend": "torch_native", "page_size": 16, "chunked_prefill_size": 8},
    # --enable-mixed-chunk: requests admitted in earlier extend batches decode inside later ones.
    "mixed_chunk8": {"enable_mixed_chunk": True, "chunked_prefill_size": 8, "max_prefill_tokens": 24},
    "mixed_page16_chunk24": {"enable_mixed_chunk": True, "page_size": 16, "chunked_prefill_size": 24,
                             "max_prefill_tokens": 40},
    # n-gram speculative decoding: the second pass drafts whole continuations from the radix tree.
    "ngram": {"speculative_algorithm": "NGRAM"},
    "ngram_page16_chunk8": {"speculative_algorithm": "NGRAM", "page_size": 16, "chunked_prefill_size": 8},
    "ngram_no_radix": {"speculative_algorithm": "NGRAM", "disable_radix_cache": True},
    "ngram_attn_torch_native_page16": {"speculative_algorithm": "NGRAM", "attention_backend": "torch_native", "page_size": 16},
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_batch_equals_hf(stories_path, prompts_ids, expected, variant):
    engine = Engine(stories_path, dtype="float32", max_total_tokens=8192, **VARIANTS[variant])
    outs = engine.generate(input_ids=prompts_ids, sampling_params=SP)
    assert [o["output_ids"] for o in outs] == expected
    assert all(o["meta_info"]["finish_reason"] == {"type": "length", "length": MAX_NEW} for o in outs)
    # A second pass hits the cache (when on) and must not change a token.
    again = engine.generate(input_ids=prompts_ids, sampling_params=SP)
    assert [o["output_ids"] for o in again] == expected
    cached = [o["meta_info"]["cached_tokens"] for o in again]
    if VARIANTS[variant].get("disable_radix_cache"):
        assert cached == [0] * len(prompts_ids)
    else:
        ps = VARIANTS[variant].get("page_size", 1)
        assert cached == [(len(p) - 1) // ps * ps for p in prompts_ids]
    if VARIANTS[variant].get("speculative_algorithm"):
        metas = [o["meta_info"] for o in again]
        assert sum(m["spec_verify_ct"] for m in metas) > 0 and max(m["spec_accept_length"] for m in metas) > 1
    assert_clean(engine)


@pytest.mark.parametrize("page_size", [1, 16])
def test_one_at_a_time_equals_hf(stories_path, prompts_ids, expected, page_size):
    engine = Engine(stories_path, dtype="float32", max_total_tokens=4096, page_size=page_size, chunked_prefill_size=64)
    for ids, exp in zip(prompts_ids, expected):
        assert engine.generate(input_ids=ids, sampling_params=SP)["output_ids"] == exp
    assert_clean(engine)


@pytest.mark.parametrize("page_size,chunk,spec,pool,mixed", [
    (1, 16, None, 320, False), (4, -1, None, 320, False), (16, 32, None, 320, False), (1, 16, "NGRAM", 200, False),
    (16, 32, "NGRAM", 200, False), (1, 16, None, 320, True), (16, 32, None, 320, True)])
def test_retraction_keeps_tokens_exact(stories_path, prompts_ids, expected, page_size, chunk, spec, pool, mixed):
    # 18 prompts of 2..40 tokens + 24 new tokens each need ~800 slots; 320 forces retraction (200
    # with speculation, whose requests finish in fewer steps and hold their pages for less long).
    engine = Engine(stories_path, dtype="float32", max_total_tokens=pool, page_size=page_size, chunked_prefill_size=chunk,
                    speculative_algorithm=spec, enable_mixed_chunk=mixed, max_prefill_tokens=64 if mixed else 4096)
    outs = engine.generate(input_ids=prompts_ids, sampling_params=SP)
    assert [o["output_ids"] for o in outs] == expected
    state = engine.scheduler.internal_state()
    assert state.num_retractions > 0, "the pool was meant to be too small for the batch"
    assert sum(o["meta_info"]["total_retractions"] for o in outs) == state.num_retractions
    assert_clean(engine)


def test_string_prompt_matches_hf_text(stories_path):
    engine = Engine(stories_path, dtype="float32", max_total_tokens=2048)
    out = engine.generate("Once upon a time", {"temperature": 0, "max_new_tokens": 20})
    assert out["text"] == ", there was a little girl named Lily. She loved to play outsid"  # 20 tokens end mid-word
    assert out["meta_info"]["prompt_tokens"] == 5
    assert out["meta_info"]["completion_tokens"] == 20
    assert_clean(engine)
