"""Paged batches laid out as the scheduler lays them out (KVManager + RadixCache + PagePool), for
attention tests on CPU and GPU: shared cached prefixes, scattered pages, partial last pages."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from radixlm.managers.io_struct import TokenizedGenerateReq
from radixlm.managers.kv_manager import KVManager
from radixlm.managers.schedule_batch import Req
from radixlm.radix_cache import PagePool, RadixCache
from radixlm.srt.forward_batch import ForwardMode, ModelWorkerBatch
from radixlm.srt.kv_pool import KVPool, ReqToTokenPool
from radixlm.srt.sampling_params import SamplingParams


@dataclass
class PagedSetup:
    page_pool: PagePool
    tree: RadixCache
    kv: KVManager
    req_to_token_pool: ReqToTokenPool
    kv_pool: KVPool


def make_setup(page_size: int, num_pages: int = 256, rows: int = 8, context: int = 512, num_layers: int = 1,
               kv_heads: int = 2, head_dim: int = 8, dtype: torch.dtype = torch.float32,
               device: str = "cpu", seed: int = 0, layout: str = "NHD") -> PagedSetup:
    """Pools with a scrambled free list, so requests get non-contiguous, non-ascending pages."""
    pool = PagePool(num_pages, page_size)
    pages = pool.alloc(num_pages)
    random.Random(seed).shuffle(pages)
    pool.free(pages)
    tree = RadixCache(pool, page_size)
    r2t = ReqToTokenPool(rows, context, device)
    kv_pool = KVPool(num_pages, page_size, num_layers, kv_heads, head_dim, dtype, device, layout=layout)
    return PagedSetup(pool, tree, KVManager(pool, tree, r2t), r2t, kv_pool)


def make_req(rid: str, ids: list[int]) -> Req:
    msg = TokenizedGenerateReq(rid=rid, input_ids=list(ids), sampling_params=SamplingParams(max_new_tokens=8))
    return Req(msg, frozenset(), 8)


def cache_prompt(setup: PagedSetup, ids: list[int]) -> None:
    """Run ``ids`` as an earlier, finished request: its aligned prefix ends up in the tree."""
    r = make_req("earlier", ids)
    assert setup.kv.match_and_lock(r)
    setup.kv.alloc_tokens(r, len(ids) - r.num_cached)
    r.num_cached = len(ids)
    setup.kv.release(r, insert=True)


def schedule_extend(setup: PagedSetup, prompts: list[list[int]]) -> tuple[list[Req], ModelWorkerBatch]:
    """Admit every prompt whole (prefix from the tree, new slots for the rest), as the scheduler does."""
    reqs, input_ids, slots = [], [], []
    for i, ids in enumerate(prompts):
        r = make_req(f"r{i}", ids)
        assert setup.kv.match_and_lock(r)
        r.extend_len = len(ids) - r.num_cached
        slots.extend(setup.kv.alloc_tokens(r, r.extend_len))
        input_ids.extend(ids[r.num_cached:])
        reqs.append(r)
    batch = ModelWorkerBatch(ForwardMode.EXTEND, input_ids, [r.req_pool_idx for r in reqs],
                             [r.num_cached for r in reqs], [r.extend_len for r in reqs], slots)
    return reqs, batch


def finish_step(reqs: list[Req], next_token: int = 5) -> None:
    """What the result processor does after a forward: count the KV, append a sampled token."""
    for r in reqs:
        r.num_cached += r.extend_len
        r.output_ids.append(next_token)


def schedule_decode(setup: PagedSetup, reqs: list[Req]) -> ModelWorkerBatch:
    slots = []
    for r in reqs:
        r.extend_len = 1
        slots.extend(setup.kv.alloc_tokens(r, 1))
    return ModelWorkerBatch(ForwardMode.DECODE, [r.output_ids[-1] for r in reqs], [r.req_pool_idx for r in reqs],
                            [r.num_cached for r in reqs], [1] * len(reqs), slots)


def mixed_prompts(page_size: int, seed: int = 0) -> tuple[list[int], list[list[int]]]:
    """(earlier prompt to cache, batch prompts): two share its prefix (one beyond its end), two are
    fresh; lengths straddle page boundaries for page sizes 1 and 16."""
    rng = random.Random(seed)
    base = [rng.randrange(3, 500) for _ in range(41)]
    fresh1 = [rng.randrange(3, 500) for _ in range(23)]
    fresh2 = [rng.randrange(3, 500) for _ in range(3)]
    return base, [base[:35] + [7, 8, 9], fresh1, base + [11] * 9, fresh2]
