"""A pure-torch stand-in for the parts of ``flashinfer`` that FlashInferAttnBackend calls, written
from FlashInfer's documented semantics (0.7.2.post1 docstrings), so the backend's planning, K/V
stores, ragged/paged/merge logic and CUDA-graph padding run on CPU against torch_native.

Semantics emulated: indptr/indices CSR over pages (NHD caches ``(pages, page_size, KVH, D)``);
``kv_len = (num_pages - 1) * page_size + last_page_len`` (0 for no pages); causal masks aligned
bottom-right (query i of n sees keys up to kv_len - n + i); GQA by grouping query heads; ``lse`` in
base 2; ``merge_state`` merges two (o, lse) pairs. Every ``plan`` call is recorded in ``CALLS``.
"""

from __future__ import annotations

import math
import types
from typing import Any

import torch

CALLS: list[tuple[str, dict[str, Any]]] = []


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float):
    """q (n, H, D), k/v (m, KVH, D) -> o (n, H, D) in q's dtype, lse (n, H) float32 base 2."""
    n, h, d = q.shape
    m, kvh = k.shape[0], k.shape[1]
    if m == 0:
        return torch.zeros_like(q), torch.full((n, h), float("-inf"))
    g = h // kvh
    qf = q.float().view(n, kvh, g, d)
    s = torch.einsum("nkgd,mkd->kgnm", qf, k.float()) * scale
    if causal:
        allowed = torch.arange(m)[None, :] <= torch.arange(n)[:, None] + (m - n)
        s = s.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # (KVH, G, n)
    o = torch.einsum("kgnm,mkd->nkgd", torch.softmax(s, dim=-1), v.float()).reshape(n, h, d)
    return o.to(q.dtype), (lse / math.log(2)).permute(2, 0, 1).reshape(n, h)


def _gather_pages(cache: torch.Tensor, indptr, indices, last_page_len, i: int) -> torch.Tensor:
    pages = indices[int(indptr[i]):int(indptr[i + 1])].long()
    if pages.numel() == 0:
        return cache.new_zeros((0,) + tuple(cache.shape[2:]))
    flat = cache[pages].reshape(-1, *cache.shape[2:])  # (pages * page_size, KVH, D)
    kv_len = (pages.numel() - 1) * cache.shape[1] + int(last_page_len[i])
    return flat[:kv_len]


class _Wrapper:
    kind = "?"

    def __init__(self, workspace: torch.Tensor, kv_layout: str = "NHD", **kwargs: Any):
        assert kv_layout == "NHD"
        self.init_kwargs = kwargs

    def _record(self, **plan: Any) -> None:
        self.plan_args = plan
        CALLS.append((self.kind, plan))


class BatchPrefillWithRaggedKVCacheWrapper(_Wrapper):
    kind = "ragged"

    def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, *, causal=False,
             sm_scale=None, q_data_type=None, kv_data_type=None):
        assert qo_indptr.dtype == kv_indptr.dtype == torch.int32 and qo_indptr.device.type == "cpu"
        self._record(qo_indptr=qo_indptr.clone(), kv_indptr=kv_indptr.clone(), heads=(num_qo_heads, num_kv_heads,
                     head_dim_qk), causal=causal, sm_scale=sm_scale, dtype=(q_data_type, kv_data_type))

    def run(self, q, k, v, return_lse=False):
        p = self.plan_args
        assert q.dtype == p["dtype"][0] and k.dtype == p["dtype"][1]
        qo, kv = p["qo_indptr"], p["kv_indptr"]
        out, lse = torch.empty_like(q), torch.empty(q.shape[:2])
        for i in range(qo.numel() - 1):
            a, b, c, e = int(qo[i]), int(qo[i + 1]), int(kv[i]), int(kv[i + 1])
            out[a:b], lse[a:b] = _attend(q[a:b], k[c:e], v[c:e], p["causal"], p["sm_scale"])
        return (out, lse) if return_lse else out


class _PagedBase(_Wrapper):
    def _run(self, q, paged_kv_cache, qo_indptr, return_lse):
        p = self.plan_args
        k_cache, v_cache = paged_kv_cache
        assert k_cache.dim() == 4 and k_cache.shape[1] == p["page_size"] and q.dtype == p["dtype"][0]
        out, lse = torch.empty_like(q), torch.empty(q.shape[:2])
        for i in range(qo_indptr.numel() - 1):
            a, b = int(qo_indptr[i]), int(qo_indptr[i + 1])
            args = (p["indptr"], p["indices"], p["last_page_len"], i)
            out[a:b], lse[a:b] = _attend(q[a:b], _gather_pages(k_cache, *args), _gather_pages(v_cache, *args),
                                         p["causal"], p["sm_scale"])
        return (out, lse) if return_lse else out


class BatchPrefillWithPagedKVCacheWrapper(_PagedBase):
    kind = "paged"

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
             num_kv_heads, head_dim_qk, page_size, *, causal=False, sm_scale=None, q_data_type=None,
             kv_data_type=None):
        assert paged_kv_indices.dtype == torch.int32 and paged_kv_indptr.device.type == "cpu"
        self._record(qo_indptr=qo_indptr.clone(), indptr=paged_kv_indptr.clone(), indices=paged_kv_indices.clone(),
                     last_page_len=paged_kv_last_page_len.clone(), heads=(num_qo_heads, num_kv_heads, head_dim_qk),
                     page_size=page_size, causal=causal, sm_scale=sm_scale, dtype=(q_data_type, kv_data_type))

    def run(self, q, paged_kv_cache, return_lse=False):
        return self._run(q, paged_kv_cache, self.plan_args["qo_indptr"], return_lse)


class BatchDecodeWithPagedKVCacheWrapper(_PagedBase):
    kind = "decode"

    def __init__(self, workspace, kv_layout="NHD", use_cuda_graph=False, use_tensor_cores=False,
                 paged_kv_indptr_buffer=None, paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None,
                 backend="auto"):
        super().__init__(workspace, kv_layout, use_tensor_cores=use_tensor_cores, backend=backend)
        self.use_cuda_graph = use_cuda_graph
        self.buffers = (paged_kv_indptr_buffer, paged_kv_indices_buffer, paged_kv_last_page_len_buffer)
        if use_cuda_graph:
            assert paged_kv_indptr_buffer.numel() == paged_kv_last_page_len_buffer.numel() + 1

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, *,
             q_data_type=None, kv_data_type=None, sm_scale=None):
        assert indices.dtype == torch.int32 and indptr.device.type == "cpu"
        if self.use_cuda_graph:  # the real wrapper copies into its fixed-size buffers
            ip, ix, lp = self.buffers
            assert last_page_len.numel() == lp.numel(), "batch size is fixed in cudagraph mode"
            ip.copy_(indptr)
            ix[:indices.numel()].copy_(indices)
            lp.copy_(last_page_len)
            indptr, indices, last_page_len = ip.cpu(), ix.clone(), lp.cpu()
        self._record(indptr=indptr.clone(), indices=indices.clone(), last_page_len=last_page_len.clone(),
                     heads=(num_qo_heads, num_kv_heads, head_dim), page_size=page_size, causal=False,
                     sm_scale=sm_scale, dtype=(q_data_type, kv_data_type))

    def run(self, q, paged_kv_cache, return_lse=False):
        return self._run(q, paged_kv_cache, torch.arange(q.shape[0] + 1), return_lse)


def merge_state(v_a, s_a, v_b, s_b):
    s = torch.logaddexp2(s_a, s_b)
    w_a, w_b = torch.exp2(s_a - s)[..., None], torch.exp2(s_b - s)[..., None]
    return (v_a.float() * w_a + v_b.float() * w_b).to(v_a.dtype), s


def module() -> types.ModuleType:
    """A fresh ``flashinfer`` module object with the wrappers above (install it in sys.modules)."""
    m = types.ModuleType("flashinfer")
    for name in ("BatchPrefillWithRaggedKVCacheWrapper", "BatchPrefillWithPagedKVCacheWrapper",
                 "BatchDecodeWithPagedKVCacheWrapper", "merge_state"):
        setattr(m, name, globals()[name])
    m.__version__ = "fake"
    return m
