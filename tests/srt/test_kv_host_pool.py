"""The host pool copies pages between the device KV pool (NHD or HND) and its own layout, bit for bit."""

from __future__ import annotations

import pytest
import torch

from radixlm.srt.kv_host_pool import HostKVPool
from radixlm.srt.kv_pool import KVPool

LAYERS, HEADS, DIM, PS = 3, 2, 4, 4


def filled_pool(layout: str, dtype: torch.dtype) -> KVPool:
    pool = KVPool(8, PS, LAYERS, HEADS, DIM, dtype, layout=layout)
    g = torch.Generator().manual_seed(0)
    slots = torch.arange(9 * PS)
    for layer in range(LAYERS):
        k = torch.randn(len(slots), HEADS, DIM, generator=g).to(dtype)
        v = torch.randn(len(slots), HEADS, DIM, generator=g).to(dtype)
        pool.set_kv(layer, slots, k, v)
    return pool


def page_kv(pool: KVPool, layer: int, page: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(PS, H, D) K and V of one page, whatever the layout."""
    k, v = pool.get_kv(layer)
    sl = slice(page * PS, (page + 1) * PS)
    if pool.layout == "NHD":
        return k[sl], v[sl]
    return k[:, sl].transpose(0, 1), v[:, sl].transpose(0, 1)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_save_then_load_into_other_pages_is_exact(layout, dtype):
    src = filled_pool(layout, dtype)
    host = HostKVPool(5, src, HEADS, DIM, dtype)
    host.save(src, [3, 7, 1], [2, 5, 1])
    dst = KVPool(8, PS, LAYERS, HEADS, DIM, dtype, layout=layout)
    HostKVPool.load(dst, host.gather([5, 2]), [4, 6])  # device page 7 -> 4, 3 -> 6
    for layer in range(LAYERS):
        for s_page, d_page in ((7, 4), (3, 6)):
            ks, vs = page_kv(src, layer, s_page)
            kd, vd = page_kv(dst, layer, d_page)
            assert torch.equal(ks, kd) and torch.equal(vs, vd)
        assert not page_kv(dst, layer, 2)[0].any()  # untouched pages stay zero


def test_page_payload_roundtrip_and_size():
    src = filled_pool("HND", torch.bfloat16)
    host = HostKVPool(2, src, HEADS, DIM, torch.bfloat16)
    host.save(src, [2], [1])
    page = host.gather([1])[0]
    payload = host.page_payload(page)
    assert len(payload) == host.page_bytes == LAYERS * 2 * PS * HEADS * DIM * 2
    assert torch.equal(host.page_from_payload(payload), page)
