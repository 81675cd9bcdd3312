"""The torch_native backend (blocked, padded, batched) against a dense float64 per-request reference,
on batches laid out by the real KV manager: cached prefixes, scattered pages, mixed extend lengths
(several blocks), heterogeneous decode lengths, GQA."""

from __future__ import annotations

import random

import pytest
import torch

from radixlm.kernels.attention.torch_native import (CASCADE_MIN_PREFIX, PAD_FACTOR, PAD_SLACK, TorchNativeAttnBackend,
                                                   plan_blocks)
from radixlm.srt.forward_batch import ForwardBatch
from tests.kernels.paged_batches import cache_prompt, finish_step, make_setup, mixed_prompts, schedule_decode, schedule_extend

H, KVH, D = 6, 2, 16


def reference(setup, batch, q, layer=0, heads=H, kv_heads=KVH, d=D):
    """Per request, dense causal attention over its slots in float64 (after the backend stored K/V)."""
    H, KVH, D = heads, kv_heads, d  # noqa: N806
    k_buf, v_buf = (b.double() for b in setup.kv_pool.get_kv(layer))  # (KVH, slots, D)
    table = setup.req_to_token_pool.req_to_token
    outs, start = [], 0
    for row, prefix, ext in zip(batch.req_pool_indices, batch.prefix_lens, batch.extend_lens):
        seq = prefix + ext
        slots = table[row, :seq]
        k = k_buf[:, slots].repeat_interleave(H // KVH, dim=0)  # (H, seq, D)
        v = v_buf[:, slots].repeat_interleave(H // KVH, dim=0)
        qi = q[start:start + ext].double().view(ext, H, D).transpose(0, 1)  # (H, ext, D)
        scores = qi @ k.transpose(1, 2) * D ** -0.5
        allowed = torch.arange(seq)[None, :] <= (prefix + torch.arange(ext))[:, None]
        scores = scores.masked_fill(~allowed, float("-inf"))
        outs.append((scores.softmax(-1) @ v).transpose(0, 1).reshape(ext, H * D))
        start += ext
    return torch.cat(outs)


def run(setup, batch, seed):
    g = torch.Generator().manual_seed(seed)
    t = len(batch.input_ids)
    q, k, v = (torch.randn(t, n * D, generator=g) for n in (H, KVH, KVH))
    backend = TorchNativeAttnBackend(H, KVH, D, D ** -0.5)
    fb = ForwardBatch.init_new(batch, setup.req_to_token_pool, setup.kv_pool, backend, torch.device("cpu"))
    out = backend.forward(q, k, v, 0, fb)
    k_buf, v_buf = setup.kv_pool.get_kv(0)
    loc = torch.tensor(batch.out_cache_loc)
    assert torch.equal(k_buf[:, loc].transpose(0, 1), k.view(t, KVH, D))  # stored where the batch says
    assert torch.equal(v_buf[:, loc].transpose(0, 1), v.view(t, KVH, D))
    return fb, out, reference(setup, batch, q)


def hnd_setup(page_size, seed=0):
    setup = make_setup(page_size, num_pages=2048 // page_size, rows=40, context=600, kv_heads=KVH, head_dim=D,
                       layout="HND", seed=seed)
    g = torch.Generator().manual_seed(seed)
    for buf in setup.kv_pool.k_buffers + setup.kv_pool.v_buffers:  # "cached" K/V everywhere
        buf.copy_(torch.randn(buf.shape, generator=g))
    return setup


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_extend_then_decode_match_reference(page_size):
    setup = hnd_setup(page_size)
    earlier, prompts = mixed_prompts(page_size)
    cache_prompt(setup, earlier)
    reqs, batch = schedule_extend(setup, prompts)
    fb, out, ref = run(setup, batch, seed=1)
    assert fb.attn_metadata[0].q_index is not None  # mixed lengths: padded rows, gathered and scattered
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    finish_step(reqs)
    for step in range(3):
        batch = schedule_decode(setup, reqs)
        _, out, ref = run(setup, batch, seed=2 + step)
        torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
        finish_step(reqs)


def test_many_random_batches_match_reference():
    rng = random.Random(3)
    multi_block = 0
    for trial in range(6):
        setup = hnd_setup(rng.choice([1, 2, 8]), seed=trial)
        shared = [rng.randrange(3, 500) for _ in range(rng.randrange(1, 400))]
        cache_prompt(setup, shared)
        prompts = []
        for _ in range(rng.randrange(1, 12)):
            head = shared[:rng.randrange(0, len(shared) + 1)] if rng.random() < 0.7 else []
            prompts.append(head + [rng.randrange(3, 500) for _ in range(rng.choice([1, 5, 60, 180]))])
        reqs, batch = schedule_extend(setup, prompts)
        fb, out, ref = run(setup, batch, seed=trial)
        multi_block += len(fb.attn_metadata) > 1
        torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
        finish_step(reqs)
        batch = schedule_decode(setup, reqs)
        _, out, ref = run(setup, batch, seed=100 + trial)
        torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    assert multi_block >= 2  # the blocked path (several blocks in one forward) was exercised


@pytest.mark.parametrize("page_size", [1, 16])
def test_shared_prefix_cascade_matches_reference(page_size):
    """Requests hitting one cached prefix attend to it as a cascade block (prefix K/V gathered once,
    one softmax over prefix + suffix); others in the same batch take the ordinary path."""
    rng = random.Random(page_size)
    setup = hnd_setup(page_size)
    shared = [rng.randrange(3, 500) for _ in range(100)]
    other = [rng.randrange(3, 500) for _ in range(70)]
    cache_prompt(setup, shared)
    cache_prompt(setup, other)
    prompts = [shared + [rng.randrange(3, 500) for _ in range(n)] for n in (1, 3, 17, 40, 9)]
    prompts += [other + [5, 6], [7] * 12]  # a lone hit on another prefix, and a fresh prompt
    reqs, batch = schedule_extend(setup, prompts)
    fb, out, ref = run(setup, batch, seed=5)
    cascades = [b for b in fb.attn_metadata if b.prefix_slots is not None]
    assert len(cascades) >= 1 and sorted(i for b in cascades for i in b.req_ids) == [0, 1, 2, 3, 4]
    assert all(b.prefix_slots.numel() >= CASCADE_MIN_PREFIX for b in cascades)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    finish_step(reqs)
    for step in range(3):  # decode: every request's cached prefix now covers its prompt
        batch = schedule_decode(setup, reqs)
        fb, out, ref = run(setup, batch, seed=6 + step)
        assert any(b.prefix_slots is not None and len(b.req_ids) >= 5 for b in fb.attn_metadata)
        torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
        finish_step(reqs)


def test_a_row_does_not_depend_on_its_batch():
    """The same request alone and inside a uniform batch (one block, no padding) gives identical bits."""
    setup = hnd_setup(1)
    prompts = [[5 + i] * 20 for i in range(4)]
    _, batch = schedule_extend(setup, prompts)
    g = torch.Generator().manual_seed(0)
    t = len(batch.input_ids)
    q, k, v = (torch.randn(t, n * D, generator=g) for n in (H, KVH, KVH))
    backend = TorchNativeAttnBackend(H, KVH, D, D ** -0.5)
    fb = ForwardBatch.init_new(batch, setup.req_to_token_pool, setup.kv_pool, backend, torch.device("cpu"))
    together = backend.forward(q, k, v, 0, fb)
    alone_batch = type(batch)(batch.forward_mode, batch.input_ids[:20], batch.req_pool_indices[:1],
                              batch.prefix_lens[:1], batch.extend_lens[:1], batch.out_cache_loc[:20])
    fb1 = ForwardBatch.init_new(alone_batch, setup.req_to_token_pool, setup.kv_pool, backend, torch.device("cpu"))
    alone = backend.forward(q[:20], k[:20], v[:20], 0, fb1)
    assert torch.equal(alone, together[:20])


@pytest.mark.parametrize("seed", range(5))
def test_plan_blocks_partitions_and_bounds_padding(seed):
    rng = random.Random(seed)
    n = rng.randrange(1, 50)
    ext = [rng.choice([1, 1, 1, rng.randrange(1, 600)]) for _ in range(n)]
    pre = [rng.randrange(0, 2000) for _ in range(n)]
    blocks = plan_blocks(pre, ext)
    assert sorted(i for b in blocks for i in b) == list(range(n))
    for b in blocks:
        real = sum(ext[i] * (pre[i] + ext[i]) for i in b)
        padded = len(b) * max(ext[i] for i in b) * max(pre[i] + ext[i] for i in b)
        assert len(b) == 1 or padded <= PAD_FACTOR * real + PAD_SLACK
    assert plan_blocks([0] * 8, [16] * 8) == [list(range(8))]  # uniform prefill: one block
    assert len(plan_blocks([0, 4000], [1, 4000])) == 2  # a long prefill is not padded with a short one
