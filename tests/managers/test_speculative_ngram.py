"""N-gram speculative decoding, unit level: the suffix index, the back-off, and the acceptance rule
(exact on greedy rows; the target distribution on sampled rows, by a chi-square test)."""

from __future__ import annotations

import random

import pytest
import torch

from radixlm.kernels.sampling import SamplingBatchInfo
from radixlm.managers.speculative.ngram import COOLDOWN_BASE, MISS_LIMIT, DraftBudget, NgramDrafter, NgramIndex
from radixlm.managers.speculative.verify import accept_length, sample_targets, verified_tokens
from radixlm.radix_cache import PagePool, RadixCache
from radixlm.srt.sampling_params import SamplingParams


def _brute(seq: list[int], lo: int, hi: int, k: int) -> list[int]:
    """The reference rule: longest suffix first, its latest earlier occurrence's continuation."""
    for n in range(min(hi, len(seq) - 1), lo - 1, -1):
        suffix = seq[len(seq) - n:]
        for end in range(len(seq) - 1, n - 1, -1):
            if seq[end - n:end] == suffix:
                return seq[end:end + k]
    return []


def test_index_matches_the_brute_force_rule_as_the_sequence_grows():
    rng = random.Random(0)
    for lo, hi in [(1, 1), (1, 4), (2, 6)]:
        idx = NgramIndex(lo, hi)
        seq: list[int] = []
        for _ in range(300):
            seq.append(rng.randrange(5))
            if rng.random() < 0.5:  # updates may skip steps: the index catches up
                idx.update(seq)
                assert idx.lookup(seq, 4) == _brute(seq, lo, hi, 4)


def test_index_prefers_the_longest_window_then_the_latest_occurrence():
    seq = [1, 2, 3, 9, 2, 3, 8, 1, 2, 3]
    idx = NgramIndex(1, 3)
    idx.update(seq)
    assert idx.lookup(seq, 3) == [9, 2, 3]  # "1 2 3" occurred at the start
    seq2 = [5, 2, 3, 9, 6, 2, 3, 8, 4, 2, 3]
    idx2 = NgramIndex(1, 3)
    idx2.update(seq2)
    assert idx2.lookup(seq2, 2) == [8, 4]  # "2 3" twice: the latest one
    assert NgramIndex(2, 3).lookup([1, 2], 4) == []
    with pytest.raises(ValueError):
        NgramIndex(3, 2)


def test_budget_backs_off_on_misses_and_recovers_on_hits():
    b = DraftBudget(7)
    assert b.allowed() == 7
    b.record(7, 7)
    assert b.allowed() == 7
    b.record(7, 2)
    assert b.allowed() == 3  # accepted + 1
    b.record(3, 3)
    assert b.allowed() == 6  # doubled
    for _ in range(MISS_LIMIT):
        b.record(b.length, 0)
    paused = [b.allowed() for _ in range(COOLDOWN_BASE)]
    assert paused == [0] * COOLDOWN_BASE and b.allowed() == 1
    b.record(1, 0)  # one more miss doubles the pause
    assert [b.allowed() for _ in range(2 * COOLDOWN_BASE)] == [0] * (2 * COOLDOWN_BASE)
    b.record(1, 1)
    assert b.misses == 0 and b.allowed() == 2


def test_drafter_prefers_the_radix_tree_and_falls_back_to_the_own_text():
    pool = PagePool(64, 1)
    tree = RadixCache(pool, 1)
    tree.insert([4, 5, 6, 7, 8, 9], pool.alloc(6))
    drafter = NgramDrafter(tree, num_draft_tokens=4, min_window=1, max_window=3)
    state = drafter.new_state()
    assert drafter.propose(state, [4, 5, 6], 10) == [7, 8, 9]  # max_draft = 3
    assert drafter.propose(state, [4, 5, 6], 2) == [7, 8]
    own = drafter.new_state()
    assert drafter.propose(own, [1, 2, 3, 1, 2], 10) == [3, 1, 2]
    assert drafter.propose(own, [1, 2, 3, 1, 2], 0) == []


def test_accept_length_and_emitted_tokens():
    assert accept_length([5, 6, 7], [5, 6, 9, 1]) == 2
    assert verified_tokens([5, 6, 7], [5, 6, 9, 1]) == [5, 6, 9]
    assert verified_tokens([5, 6, 7], [5, 6, 7, 1]) == [5, 6, 7, 1]
    assert verified_tokens([], [4]) == [4]
    assert verified_tokens([3], [4, 0]) == [4]
    with pytest.raises(ValueError):
        accept_length([1], [1])


def _rows(params: SamplingParams, outputs: list[list[int]], vocab: int) -> SamplingBatchInfo:
    return SamplingBatchInfo.from_requests([params] * len(outputs), outputs, vocab, [frozenset()] * len(outputs))


def test_greedy_targets_are_the_argmax_of_processed_logits():
    torch.manual_seed(0)
    logits = torch.randn(4, 11)
    params = SamplingParams(temperature=0.0, frequency_penalty=5.0)
    # Row j of one request sees output + draft[:j]: the penalty hits the drafted token from row 1 on.
    top = int(logits[1].argmax())
    logits[0, top] = logits[0].max() + 1
    outs = [[], [top], [top], [top, 3]]
    targets = sample_targets(logits.clone(), _rows(params, outs, 11))
    expect = []
    for j, out in enumerate(outs):
        row = logits[j].clone()
        for t in set(out):
            row[t] -= 5.0 * out.count(t)
        expect.append(int(row.argmax()))
    assert targets.tolist() == expect


def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    n = counts.sum()
    keep = probs > 0
    expected = probs[keep] * n
    return float(((counts[keep] - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.8),
                                    SamplingParams(temperature=1.3, top_k=4, top_p=0.9)])
def test_sampled_verify_keeps_the_target_distribution(params):
    """Emitted tokens follow the target p; a draft d is accepted with probability p(d); a rejected
    position emits from p with d removed, renormalised (the standard rule for a point-mass draft)."""
    torch.manual_seed(1)
    vocab, n = 6, 60000
    logits = torch.tensor([2.0, 1.5, 0.3, -0.5, 1.0, 0.0])
    probs = torch.softmax(logits / params.temperature, dim=0)
    if params.top_k > 0:  # the same filters as the sampler: joint top-k 4, top-p 0.9
        order = torch.argsort(probs, descending=True)
        keep = torch.zeros(vocab, dtype=torch.bool)
        mass = 0.0
        for rank, t in enumerate(order.tolist()):
            if rank >= params.top_k or mass >= params.top_p - 1e-6:
                break
            keep[t] = True
            mass += float(probs[t])
        probs = torch.where(keep, probs, torch.zeros(()))
        probs = probs / probs.sum()
    draft = 1
    targets = sample_targets(logits.repeat(n, 1), _rows(params, [[]] * n, vocab)).tolist()
    # Each row is one verify step of a one-token draft (its second target is never needed here).
    emitted = [verified_tokens([draft], [t, 0])[0] for t in targets]
    counts = torch.bincount(torch.tensor(emitted), minlength=vocab).double()
    assert counts[probs == 0].sum() == 0
    # chi-square, df <= 5: the 0.1 % critical value is 20.5.
    assert _chi_square(counts, probs.double()) < 20.5
    accepted = sum(accept_length([draft], [t, 0]) for t in targets) / n
    p_d = float(probs[draft])
    assert abs(accepted - p_d) < 4 * (p_d * (1 - p_d) / n) ** 0.5
    rejected = torch.tensor([t for t in emitted if t != draft])
    residual = probs.double().clone()
    residual[draft] = 0
    residual /= residual.sum()
    assert _chi_square(torch.bincount(rejected, minlength=vocab).double(), residual) < 20.5
