"""Tests of kernels/sampling.py: exact logits edits, greedy = argmax, seeded determinism, filters.

Statistical tests use fixed seeds and tolerances far outside the sampling noise (20k draws:
std of a frequency <= 0.0036, tolerance 0.01).
"""

from __future__ import annotations

import dataclasses
import math

import msgspec
import pytest
import torch

from radixlm.kernels.sampling import (
    SamplingBatchInfo,
    _top_k_top_p_sorted,
    apply_logits_processors,
    compute_logprobs,
    generator_seed,
    sample,
    temperature_probs,
    unpack_vocab_mask,
)
from radixlm.srt.sampling_params import SamplingParams

P = SamplingParams


def make_info(params, outputs=None, vocab_size=16, stops=None) -> SamplingBatchInfo:
    outputs = outputs if outputs is not None else [[] for _ in params]
    stops = stops if stops is not None else [frozenset() for _ in params]
    return SamplingBatchInfo.from_requests(params, outputs, vocab_size, stops)


def draw(logits: torch.Tensor, params: SamplingParams, n: int, seeded: bool = True) -> torch.Tensor:
    """n draws of one logits row: n batch rows, seeds 0..n-1 (or the default RNG)."""
    ps = [msgspec.structs.replace(params, sampling_seed=i if seeded else None) for i in range(n)]
    return sample(logits.expand(n, -1).contiguous(), make_info(ps, vocab_size=logits.shape[-1]))


def frequencies(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    return torch.bincount(tokens, minlength=vocab_size).double() / tokens.numel()


# --- greedy --------------------------------------------------------------------------------------

def test_all_greedy_is_argmax_without_softmax(monkeypatch):
    logits = torch.randn(8, 50, generator=torch.Generator().manual_seed(0))
    info = make_info([P(temperature=0.0)] * 7 + [P(temperature=1.0, top_k=1)], vocab_size=50)
    assert info.is_all_greedy

    def no_softmax(*args, **kwargs):
        raise AssertionError("softmax called on an all-greedy batch")

    monkeypatch.setattr(torch, "softmax", no_softmax)
    out = sample(logits, info)
    assert out.dtype == torch.int64 and out.shape == (8,)
    assert torch.equal(out, torch.argmax(logits, dim=-1))


def test_mixed_batch_greedy_rows_stay_argmax():
    gen = torch.Generator().manual_seed(1)
    params = [P(temperature=0.0) if i % 2 == 0 else P(temperature=1.5, top_p=0.9, sampling_seed=i)
              for i in range(8)]
    info = make_info(params, vocab_size=40)
    assert not info.is_all_greedy and info.has_greedy
    for _ in range(20):
        logits = torch.randn(8, 40, generator=gen) * 0.1  # flat: sampled rows rarely hit argmax
        out = sample(logits, info)
        assert torch.equal(out[0::2], torch.argmax(logits[0::2], dim=-1))
    assert not torch.equal(out[1::2], torch.argmax(logits[1::2], dim=-1))


def test_top_k_one_is_argmax():
    logits = torch.randn(6, 30, generator=torch.Generator().manual_seed(2))
    info = make_info([P(top_k=1, sampling_seed=i) for i in range(6)], vocab_size=30)
    assert torch.equal(sample(logits, info), torch.argmax(logits, dim=-1))
    # The same through the filtering path (not the greedy shortcut), with fresh noise each time.
    forced = dataclasses.replace(
        make_info([P(temperature=1.0, top_k=2)] * 6, vocab_size=30),
        top_ks=torch.ones(6, dtype=torch.int64), top_k_max=1)
    for _ in range(20):
        assert torch.equal(sample(logits, forced), torch.argmax(logits, dim=-1))


# --- seeds ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("target", [
    P(temperature=0.8, sampling_seed=1234),  # no filters alone; the batch needs sort + min-p
    P(temperature=1.3, top_p=0.9, top_k=12, min_p=0.01, sampling_seed=-7),
])
def test_seeded_row_independent_of_batch(target):
    gen = torch.Generator().manual_seed(3)
    V = 64
    others = [P(temperature=1.0, sampling_seed=99), P(temperature=0.0), P(temperature=0.7),
              P(top_p=0.5, sampling_seed=5), P(top_k=3), P(min_p=0.2, sampling_seed=1234 + 1),
              P(temperature=2.0, top_p=0.95)]
    tokens = []
    for step in range(30):
        row = torch.randn(1, V, generator=gen) * 0.5
        other_logits = torch.randn(7, V, generator=gen)
        outs = [[0] * step]
        alone = sample(row, make_info([target], outs, V))
        first = sample(torch.cat([row, other_logits]),
                       make_info([target] + others, outs + [[1] * 3] * 7, V))
        last = sample(torch.cat([other_logits, row]),
                      make_info(others + [target], [[2] * 5] * 7 + outs, V))
        assert alone.item() == first[0].item() == last[-1].item()
        tokens.append(alone.item())
    assert len(set(tokens)) > 5  # the draws do vary with the step


def test_seed_and_step_determine_the_token():
    logits = torch.zeros(1, 100)  # uniform: the token is pure noise
    seq = lambda seed: [sample(logits, make_info([P(sampling_seed=seed)], [[0] * s], 100)).item()
                        for s in range(40)]
    a, b = seq(7), seq(8)
    assert a == seq(7)
    assert sum(x != y for x, y in zip(a, b)) > 30
    assert len(set(a)) > 20  # successive steps of one seed differ too


def test_generator_seed_mixes_seed_and_step():
    seen = {generator_seed(s, t) for s in range(-50, 50) for t in range(50)}
    assert len(seen) == 100 * 50
    assert all(0 <= x < 2**63 for x in seen)
    assert generator_seed(2**70 + 3, 1) == generator_seed(3, 1)  # seeds are taken mod 2**64


def test_unseeded_rows_use_the_default_rng():
    logits = torch.zeros(4, 1000)
    info = make_info([P()] * 4, vocab_size=1000)
    torch.manual_seed(11)
    a = sample(logits, info)
    torch.manual_seed(11)
    assert torch.equal(a, sample(logits, info))
    assert not torch.equal(a, sample(logits, info))


# --- filters -------------------------------------------------------------------------------------

def test_top_k_never_leaves_the_top_k():
    logits = torch.randn(1, 32, generator=torch.Generator().manual_seed(4))
    top5 = set(torch.topk(logits[0], 5).indices.tolist())
    tokens = draw(logits, P(temperature=1.5, top_k=5), 2000)
    assert set(tokens.tolist()) == top5  # nothing outside, and every one of the 5 shows up


def test_top_p_keeps_exactly_the_nucleus():
    # Sorted mass: 0.5, 0.8, 0.95, 1.0. With p = 0.8, id 0 (0.5 < 0.8) is not enough; id 1 reaches
    # 0.8 and is kept; id 2's preceding mass is already 0.8, so it is dropped (vLLM/FlashInfer).
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    tokens = draw(logits, P(top_p=0.8), 2000)
    assert set(tokens.tolist()) == {0, 1}
    freq = frequencies(tokens, 4)
    assert abs(freq[0] - 0.5 / 0.8) < 0.04
    assert set(draw(logits, P(top_p=0.81), 2000).tolist()) == {0, 1, 2}
    shuffled = logits[:, [3, 2, 0, 1]]  # top token is id 2: it always survives, however small p
    assert set(draw(shuffled, P(top_p=0.3), 200).tolist()) == {2}
    assert set(draw(shuffled, P(top_p=1e-9), 50).tolist()) == {2}


def test_top_p_boundary_allows_float_slack():
    # Mass before id 2 is 0.79999995 (< 0.8 by float rounding only): it still counts as reaching p.
    probs = torch.tensor([[0.5, 0.29999995, 0.15, 0.05000005]])
    info = make_info([P(top_p=0.8)], vocab_size=4)
    kept = _top_k_top_p_sorted(probs.clone(), info.top_ks, info.top_ps)
    assert torch.equal(kept, torch.tensor([[0.5, 0.29999995, 0.0, 0.0]]))
    info = make_info([P(top_p=0.7999)], vocab_size=4)  # beyond the slack: id 1 still needed
    assert torch.equal(_top_k_top_p_sorted(probs.clone(), info.top_ks, info.top_ps), kept)
    info = make_info([P(top_p=1.0), P(top_p=0.8)], vocab_size=4)  # p = 1 rows untouched
    tiny = torch.tensor([[1.0 - 3e-7, 1e-7, 1e-7, 1e-7]] * 2)
    assert torch.equal(_top_k_top_p_sorted(tiny.clone(), info.top_ks, info.top_ps)[0], tiny[0])


def test_top_k_and_top_p_are_joint():
    # Joint (SGLang/FlashInfer "joint"): top_p judged on the full distribution, not the top-k one.
    # Renormalised top-2 would be [0.625, 0.375] and p = 0.55 would then keep only id 0.
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    assert set(draw(logits, P(top_k=3, top_p=0.55), 1000).tolist()) == {0, 1}
    assert set(draw(logits, P(top_k=2, top_p=0.99), 1000).tolist()) == {0, 1}


def test_min_p_drops_low_tokens():
    probs = torch.tensor([[0.4, 0.3, 0.19, 0.07, 0.04]])
    tokens = draw(probs.log(), P(min_p=0.2), 2000)  # threshold 0.08
    assert set(tokens.tolist()) == {0, 1, 2}
    freq = frequencies(tokens, 5)
    assert torch.allclose(freq[:3], probs[0, :3].double() / 0.89, atol=0.04)


# --- distributions -------------------------------------------------------------------------------

@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_empirical_distribution_matches_softmax(temperature):
    logits = torch.tensor([[1.0, 0.5, 0.0, -0.5, -1.0, 0.25]])
    expected = torch.softmax(logits[0].double() / temperature, dim=-1)
    torch.manual_seed(12)
    tokens = draw(logits, P(temperature=temperature), 20000, seeded=False)
    assert (frequencies(tokens, 6) - expected).abs().max() < 0.01


def test_lower_temperature_sharpens():
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    f1 = frequencies(draw(logits, P(temperature=1.0), 5000), 3)
    f05 = frequencies(draw(logits, P(temperature=0.5), 5000), 3)
    assert f05[0] > f1[0] + 0.15  # 0.867 vs 0.665
    assert abs(f05[0] - math.exp(4) / (math.exp(4) + math.exp(2) + 1)) < 0.02


# --- logits processors ---------------------------------------------------------------------------

def test_frequency_and_presence_penalties_exact():
    V = 8
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(5))
    params = [P(frequency_penalty=0.5, presence_penalty=0.25),
              P(frequency_penalty=-1.0, presence_penalty=2.0), P()]
    outputs = [[1, 1, 3, 1], [2, 7], [4, 4]]
    info = make_info(params, outputs, V)
    counts = torch.zeros(3, V)
    for i, out in enumerate(outputs):
        for t in out:
            counts[i, t] += 1
    freq = torch.tensor([[0.5], [-1.0], [0.0]])
    pres = torch.tensor([[0.25], [2.0], [0.0]])
    expected = logits - (freq * counts + pres * (counts > 0))
    assert torch.equal(apply_logits_processors(logits.clone(), info), expected)
    assert expected[0, 1] == logits[0, 1] - 1.75 and expected[2].equal(logits[2])


def test_no_processors_is_a_noop():
    info = make_info([P(), P(temperature=0.0)], [[1, 2], [3]], 8)
    assert info.penalties is None and info.min_tokens_block is None and info.logit_bias is None
    logits = torch.randn(2, 8)
    assert torch.equal(apply_logits_processors(logits.clone(), info), logits)


def test_logit_bias_forces_a_token():
    logits = torch.randn(4, 20, generator=torch.Generator().manual_seed(6))
    params = [P(logit_bias={"13": 100.0}, sampling_seed=i) for i in range(3)] + [P(temperature=0)]
    info = make_info(params, vocab_size=20)
    out = apply_logits_processors(logits.clone(), info)
    assert out[0, 13] == logits[0, 13] + 100.0
    assert torch.equal(out[3], logits[3])
    assert sample(out, info)[:3].tolist() == [13, 13, 13]
    merged = make_info([P(logit_bias={"2": 1.5, "02": 0.5})], vocab_size=20)
    assert apply_logits_processors(torch.zeros(1, 20), merged)[0, 2] == 2.0


@pytest.mark.parametrize("temperature,bias", [(1.0, 1e39), (0.5, 3e38), (2e-6, 1e33)])
def test_logits_that_overflow_after_temperature_still_sample_their_token(temperature, bias):
    """A logit that is +inf after the bias or the temperature (1e39 is inf in float32; 3e38 / 0.5 and
    1e33 / 2e-6 overflow) must win the row, not turn its softmax into NaN and the sample into token 0
    (a newcomer's 1e39 logit_bias gave output_ids [0, 0, 0])."""
    logits = torch.randn(3, 20, generator=torch.Generator().manual_seed(8))
    params = [P(temperature=temperature, logit_bias={"13": bias}, sampling_seed=i,
                top_p=0.9 if i == 1 else 1.0, min_p=0.1 if i == 2 else 0.0) for i in range(3)]
    info = make_info(params, vocab_size=20)
    out = apply_logits_processors(logits.clone(), info)
    assert not info.has_greedy
    assert sample(out, info).tolist() == [13] * 3
    probs = temperature_probs(out, info.temperatures)
    assert torch.isfinite(probs).all() and (probs[:, 13] == 1).all()


def test_repetition_penalty_divides_positive_and_multiplies_negative_seen_logits():
    logits = torch.tensor([[2.0, -2.0, 3.0, -1.0, 0.5], [2.0, -2.0, 3.0, -1.0, 0.5]])
    params = [P(repetition_penalty=2.0), P()]
    info = SamplingBatchInfo.from_requests(params, [[1, 1], [1]], 5, [frozenset()] * 2, prompt_ids=[[0, 4, 0], [0]])
    assert info.edits_logits and info.repetition is not None
    out = apply_logits_processors(logits.clone(), info)
    # row 0 saw 0, 4 (prompt) and 1 (output, twice: counted once); row 1 has no penalty
    assert out[0].tolist() == [1.0, -4.0, 3.0, -1.0, 0.25]
    assert torch.equal(out[1], logits[1])
    assert not make_info([P(), P(temperature=0)]).edits_logits
    with pytest.raises(ValueError, match="prompt_ids"):
        SamplingBatchInfo.from_requests(params, [[1], [1]], 5, [frozenset()] * 2)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        SamplingBatchInfo.from_requests(params, [[1], [1]], 5, [frozenset()] * 2, prompt_ids=[[7], [0]])


def test_min_new_tokens_masks_stop_ids_until_reached():
    V, stops = 10, [frozenset({0, 5})]
    logits = torch.zeros(1, V)
    logits[0, 0] = 10.0  # EOS is the argmax
    params = [P(temperature=0.0, min_new_tokens=3, stop_token_ids=[5])]
    for n_out, masked in [(0, True), (2, True), (3, False), (4, False)]:
        info = make_info(params, [[1] * n_out], V, stops)
        out = apply_logits_processors(logits.clone(), info)
        assert (out[0, [0, 5]] == float("-inf")).all().item() is masked
        assert torch.equal(out[0, 1:5], logits[0, 1:5])
        assert sample(out, info).item() == (1 if masked else 0)


def pack_bitmask(allowed: torch.Tensor) -> torch.Tensor:
    """Reference packer: bit j % 32 of word j // 32, as signed int32."""
    bs, V = allowed.shape
    words = torch.zeros(bs, (V + 31) // 32, dtype=torch.int32)
    for r in range(bs):
        for w in range(words.shape[1]):
            value = sum(1 << b for b in range(32) if w * 32 + b < V and allowed[r, w * 32 + b])
            words[r, w] = value - (1 << 32) if value >= 1 << 31 else value
    return words


def test_vocab_mask_applies_exactly():
    V = 70  # not a multiple of 32: 3 words, the last one partly used
    gen = torch.Generator().manual_seed(7)
    allowed = torch.rand(3, V, generator=gen) < 0.5
    allowed[0, 31] = allowed[0, 63] = True  # sign bits set: negative words
    allowed[2] = True  # unconstrained row
    mask = pack_bitmask(allowed)
    mask[2] = -1  # all-ones, including the unused tail bits
    assert (mask[0, :2] < 0).all()
    assert torch.equal(unpack_vocab_mask(mask, V), allowed)
    logits = torch.randn(3, V, generator=gen)
    expected = logits.masked_fill(~allowed, float("-inf"))
    info = make_info([P()] * 3, vocab_size=V)
    assert torch.equal(apply_logits_processors(logits.clone(), info, mask), expected)
    tokens = draw(logits[:1], P(), 300)
    masked_info = make_info([P(sampling_seed=i) for i in range(300)], vocab_size=V)
    masked = apply_logits_processors(logits[:1].expand(300, -1).clone(), masked_info,
                                     mask[:1].expand(300, -1))
    assert allowed[0, sample(masked, masked_info)].all()
    assert not allowed[0, tokens].all()


def test_vocab_mask_matches_xgrammar():
    xgr = pytest.importorskip("xgrammar")
    V = 70
    allowed = torch.rand(4, V, generator=torch.Generator().manual_seed(8)) < 0.3
    mask = pack_bitmask(allowed)
    logits = torch.randn(4, V)
    ours = apply_logits_processors(logits.clone(), make_info([P()] * 4, vocab_size=V), mask)
    theirs = logits.clone()
    xgr.apply_token_bitmask_inplace(theirs, mask)
    assert torch.equal(ours, theirs)


def test_processor_order_penalty_then_mask_then_bias():
    V = 33
    params = [P(frequency_penalty=1.0, min_new_tokens=2, logit_bias={"3": 5.0, "0": 7.0})]
    info = make_info(params, [[3]], V, [frozenset({0})])
    allowed = torch.ones(1, V, dtype=torch.bool)
    allowed[0, 32] = False
    out = apply_logits_processors(torch.zeros(1, V), info, pack_bitmask(allowed))
    assert out[0, 3] == 4.0  # 0 - 1 (penalty) + 5 (bias)
    assert out[0, 0] == float("-inf")  # bias does not revive a masked stop id
    assert out[0, 32] == float("-inf")
    assert out[0, 1] == 0.0


def test_invalid_inputs_raise():
    with pytest.raises(ValueError, match="one entry per row"):
        SamplingBatchInfo.from_requests([P()], [], 8, [frozenset()])
    with pytest.raises(ValueError, match="logit_bias"):
        make_info([P(logit_bias={"8": 1.0})], vocab_size=8)
    with pytest.raises(ValueError, match="stop"):
        make_info([P(min_new_tokens=1)], vocab_size=8, stops=[frozenset({9})])
    with pytest.raises(ValueError, match="output"):
        make_info([P(presence_penalty=1.0)], [[8]], vocab_size=8)
    with pytest.raises(ValueError, match="vocab_mask"):
        apply_logits_processors(torch.zeros(1, 70), make_info([P()], vocab_size=70),
                                torch.zeros(1, 2, dtype=torch.int32))


def test_from_requests_fields():
    params = [P(temperature=0.0), P(temperature=0.7, top_k=-1, top_p=0.9, sampling_seed=3),
              P(top_k=100, min_p=0.1)]
    info = make_info(params, [[], [1, 2], [3]], vocab_size=50)
    assert info.temperatures.shape == (3, 1) and info.temperatures.dtype == torch.float32
    assert info.temperatures[:, 0].tolist() == pytest.approx([1.0, 0.7, 1.0])
    assert info.top_ks.tolist() == [50, 50, 50] and info.top_ks.dtype == torch.int64
    assert info.greedy_mask.tolist() == [True, False, False]
    assert (info.need_top_p, info.need_top_k, info.need_min_p) == (True, False, True)
    assert info.seeds == [None, 3, None] and info.steps == [0, 2, 1]
    assert info.seeded_rows == ((1, generator_seed(3, 2)),)


# --- logprobs ------------------------------------------------------------------------------------

def test_compute_logprobs_matches_log_softmax_and_topk():
    logits = torch.randn(5, 40, generator=torch.Generator().manual_seed(9))
    ids = torch.tensor([0, 39, 7, 7, 12])
    ref = torch.log_softmax(logits, dim=-1)
    chosen, vals, top_ids = compute_logprobs(logits, ids, top_k=4)
    assert chosen.dtype == torch.float32
    assert torch.equal(chosen, ref.gather(1, ids[:, None]).squeeze(1))
    topk = torch.topk(ref, 4, dim=-1)
    assert torch.equal(vals, topk.values) and torch.equal(top_ids, topk.indices)
    assert compute_logprobs(logits, ids)[1:] == (None, None)
    assert compute_logprobs(logits, ids, top_k=100)[1].shape == (5, 40)
