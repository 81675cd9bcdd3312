"""N-gram speculative decoding through the engine (stories260K): output equals decoding without it
token for token — greedy, seeded sampling, penalties, stops inside an accepted run, grammars,
logprobs, mixed batches — drafts are accepted, meta_info reports the counters, and nothing leaks."""

from __future__ import annotations

import json

import pytest

from radixlm.srt.engine import Engine
from radixlm.srt.server_args import ServerArgsError
from tests.conftest import STORY_PROMPTS
from tests.engine.test_greedy_vs_hf import assert_clean
from tests.engine.test_smollm2 import smollm2_path  # noqa: F401  (the demo model fixture)

PROMPT = STORY_PROMPTS[0]


@pytest.fixture(scope="module")
def off(stories_path):
    return Engine(stories_path, dtype="float32", max_total_tokens=4096, chunked_prefill_size=16)


@pytest.fixture(scope="module")
def on(stories_path):
    return Engine(stories_path, dtype="float32", max_total_tokens=4096, chunked_prefill_size=16, speculative_algorithm="NGRAM")


def _same(a: dict, b: dict) -> None:
    assert (a["text"], a["output_ids"], a["meta_info"]["finish_reason"]) == \
        (b["text"], b["output_ids"], b["meta_info"]["finish_reason"])


def test_repetitive_prompt_accepts_drafts_and_matches(on, off):
    ids = off.tokenizer.encode("one two three four five one two three four five one two three four five")
    sp = {"temperature": 0, "max_new_tokens": 40}
    assert on.flush_cache()  # the drafts come from the request's own text only
    got, want = on.generate(input_ids=ids, sampling_params=sp), off.generate(input_ids=ids, sampling_params=sp)
    _same(got, want)
    meta = got["meta_info"]
    assert meta["spec_verify_ct"] > 0 and meta["spec_accept_length"] > 1.5, meta
    assert "spec_verify_ct" not in want["meta_info"] and "spec_accept_length" not in want["meta_info"]
    assert_clean(on)


def test_radix_tree_continuations_are_drafted(on, off):
    sp = {"temperature": 0, "max_new_tokens": 48, "ignore_eos": True}
    first = on.generate(PROMPT, sp)
    again = on.generate(PROMPT, sp)  # the tree holds the first request's output after this prompt
    _same(first, off.generate(PROMPT, sp))
    _same(again, first)
    meta = again["meta_info"]
    assert meta["spec_accept_length"] >= 4, meta
    assert meta["spec_verify_ct"] * meta["spec_accept_length"] <= meta["completion_tokens"]
    state = on.scheduler.internal_state()
    assert state.num_spec_verify_steps > 0 and 0 < state.num_spec_accepted_drafts <= state.num_spec_draft_tokens
    assert_clean(on)


@pytest.mark.parametrize("kind", ["max_new_tokens", "stop_str", "stop_token", "stop_str_kept"])
def test_stops_inside_an_accepted_run(on, off, kind):
    warm = {"temperature": 0, "max_new_tokens": 48, "ignore_eos": True}
    full = on.generate(PROMPT, warm)  # warms the tree: later runs accept long drafts
    ids = full["output_ids"]
    sp: dict = {"temperature": 0, "max_new_tokens": 48, "ignore_eos": True}
    if kind == "max_new_tokens":
        sp["max_new_tokens"] = 13
    elif kind.startswith("stop_str"):
        stop = off.tokenizer.decode(ids[10:12]).strip()
        assert stop and stop in full["text"]
        sp["stop"] = [stop]
        sp["no_stop_trim"] = kind == "stop_str_kept"
    else:
        sp["stop_token_ids"] = [ids[11]]
    got, want = on.generate(PROMPT, sp), off.generate(PROMPT, sp)
    _same(got, want)
    assert len(want["output_ids"]) < 48
    assert got["meta_info"]["spec_accept_length"] > 2, got["meta_info"]  # the stop fell inside a run
    assert_clean(on)


def test_seeded_sampling_draws_the_same_tokens(on, off):
    sp = [{"temperature": 0.9, "top_p": 0.95, "top_k": 40, "max_new_tokens": 40, "sampling_seed": s,
           "ignore_eos": True} for s in (7, 8, 9)]
    prompts = STORY_PROMPTS[1:4]
    want = off.generate(prompts, sp)
    for _ in range(2):  # the second pass drafts the first pass's output from the tree
        got = on.generate(prompts, sp)
        for g, w in zip(got, want):
            _same(g, w)
    assert max(g["meta_info"]["spec_accept_length"] for g in got) > 2
    assert_clean(on)


def test_penalties_bias_and_min_new_tokens_are_applied_per_position(on, off):
    sp = {"temperature": 0, "max_new_tokens": 40, "min_new_tokens": 30, "frequency_penalty": 0.4,
          "presence_penalty": 0.3, "logit_bias": {"13": 2.0}}
    for _ in range(2):
        _same(on.generate(PROMPT, sp), off.generate(PROMPT, sp))
    assert_clean(on)


def test_logprobs_per_accepted_token(on, off):
    sp = {"temperature": 0, "max_new_tokens": 32, "ignore_eos": True}
    on.generate(PROMPT, sp)  # warm the tree
    kw = {"return_logprob": True, "top_logprobs_num": 3}
    got, want = on.generate(PROMPT, sp, **kw), off.generate(PROMPT, sp, **kw)
    _same(got, want)
    assert got["meta_info"]["spec_accept_length"] > 2
    g_lp, w_lp = got["meta_info"]["output_token_logprobs"], want["meta_info"]["output_token_logprobs"]
    assert len(g_lp) == len(w_lp) == 32
    assert [t for _, t, _ in g_lp] == [t for _, t, _ in w_lp]
    assert all(abs(a[0] - b[0]) < 1e-4 for a, b in zip(g_lp, w_lp))
    g_top, w_top = got["meta_info"]["output_top_logprobs"], want["meta_info"]["output_top_logprobs"]
    assert [[t for _, t, _ in row] for row in g_top] == [[t for _, t, _ in row] for row in w_top]
    assert_clean(on)


SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.mark.parametrize("grammar", [{"regex": r"(Lily|Tom) (is|was) [a-z]+( [a-z]+){2,5}\."},
                                     {"json_schema": json.dumps(SCHEMA)}])
def test_grammar_filters_drafts(on, off, grammar):
    plain = {"temperature": 0, "max_new_tokens": 48, "ignore_eos": True}
    on.generate(PROMPT, plain)  # the tree now drafts unconstrained text, which the grammar must filter
    sp = {"temperature": 0, "max_new_tokens": 48, **grammar}
    for _ in range(2):  # and then its own constrained output, which it accepts
        got, want = on.generate(PROMPT, sp), off.generate(PROMPT, sp)
        _same(got, want)
    assert got["meta_info"]["spec_verify_ct"] > 0
    assert_clean(on)


def test_mixed_batch_equals_decoding_without_speculation(on, off):
    prompts = STORY_PROMPTS[:6]
    sps = [{"temperature": 0, "max_new_tokens": 30},
           {"temperature": 0.8, "max_new_tokens": 30, "sampling_seed": 3},
           {"temperature": 0, "max_new_tokens": 30, "regex": r"[a-z ]{10,40}\."},
           {"temperature": 0, "max_new_tokens": 12, "stop": ["."]},
           {"temperature": 0, "max_new_tokens": 30, "frequency_penalty": 0.5},
           {"temperature": 0, "max_new_tokens": 30, "ignore_eos": True}]
    want = off.generate(prompts, sps)
    for _ in range(2):
        for g, w in zip(on.generate(prompts, sps), want):
            _same(g, w)
    assert_clean(on)


def test_small_draft_length_and_windows(stories_path, off):
    eng = Engine(stories_path, dtype="float32", max_total_tokens=2048, page_size=16, speculative_algorithm="ngram",
                 speculative_num_draft_tokens=2, speculative_ngram_min_match_window_size=2,
                 speculative_ngram_max_match_window_size=3)
    sp = {"temperature": 0, "max_new_tokens": 40, "ignore_eos": True}
    for _ in range(2):
        outs = eng.generate(STORY_PROMPTS[:4], sp)
        for g, w in zip(outs, off.generate(STORY_PROMPTS[:4], sp)):
            _same(g, w)
    assert all(o["meta_info"]["spec_accept_length"] <= 2 for o in outs)  # one draft token + bonus
    assert max(o["meta_info"]["spec_accept_length"] for o in outs) > 1
    assert_clean(eng)


@pytest.mark.parametrize("kwargs,msg", [({"speculative_algorithm": "EAGLE"}, "--speculative-algorithm"),
                                        ({"speculative_num_draft_tokens": 1}, "--speculative-num-draft-tokens"),
                                        ({"speculative_ngram_min_match_window_size": 4,
                                          "speculative_ngram_max_match_window_size": 3}, "window"),
                                        ({"speculative_num_draft_tokens": 4}, "needs --speculative-algorithm NGRAM")])
def test_bad_speculative_options_are_refused(stories_path, kwargs, msg):
    with pytest.raises(ServerArgsError, match=msg):
        Engine(stories_path, max_total_tokens=512, **kwargs)


def test_bf16_deterministic_batch_with_drafts_equals_decoding_without(smollm2_path):
    """bf16 (on AMX / AVX512-BF16 CPUs the model's default dtype): a verify step multiplies k + 1 rows
    per request where a decode step multiplies one, and the default bf16 GEMM (oneDNN) rounds rows
    differently with the batch shape, so speculation can flip a near-tie there (it did in the served
    copy-edit benchmark at concurrency 8 on an AMX Xeon, docs/benchmarks.md). With
    --enable-deterministic-inference (batch-invariant GEMMs) a batch of copy-heavy prompts decoded with
    drafts equals the same batch decoded without them, token for token, and drafts are accepted."""
    kw = {"dtype": "bfloat16", "max_total_tokens": 4096, "enable_deterministic_inference": True}
    off = Engine(smollm2_path, **kw)
    tok = off.tokenizer
    base = ['{"id": 7, "name": "Ada", "tags": ["math", "engines"], "active": true}',
            "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n",
            "The quick brown fox jumps over the lazy dog. The quick brown fox"]
    prompts = [tok.encode(f"Repeat exactly:\n{t}\nAgain:\n{t}\nAgain:\n") for t in base]
    sp = {"temperature": 0, "max_new_tokens": 40}
    want = [o["output_ids"] for o in off.generate(input_ids=prompts, sampling_params=sp)]
    del off
    on = Engine(smollm2_path, speculative_algorithm="NGRAM", **kw)
    got = on.generate(input_ids=prompts, sampling_params=sp)
    assert [o["output_ids"] for o in got] == want
    assert max(o["meta_info"]["spec_accept_length"] for o in got) > 1.5  # drafts were verified and accepted
    on.scheduler.kv.check_idle()
