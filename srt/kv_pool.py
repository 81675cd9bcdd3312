"""Device-side memory pools: the request-to-token map and the paged KV cache.

Follows SGLang's ``mem_cache/memory_pool.py``: ``ReqToTokenPool`` rows map a request's token
positions to KV slots; ``KVPool`` holds per-layer K and V buffers indexed by slot. Pages are handed
out by ``radixlm.radix_cache.PagePool`` (page 0 is a dummy page that padded writes may target); a
slot is ``page * page_size + offset``.
"""

from __future__ import annotations

from typing import Optional

import torch


class ReqToTokenPool:
    """Rows of KV slot indices, one row per running request.

    ``req_to_token``: (size, max_context_len) int64; row ``r`` column ``i`` is the KV slot of
    token position ``i`` of the request holding row ``r``.
    """

    def __init__(self, size: int, max_context_len: int, device: torch.device | str = "cpu"):
        self.size = size
        self.max_context_len = max_context_len
        self.req_to_token = torch.zeros((size, max_context_len), dtype=torch.int64, device=device)
        self._free: list[int] = list(range(size - 1, -1, -1))

    @property
    def available_size(self) -> int:
        return len(self._free)

    def alloc(self) -> Optional[int]:
        """Take one free row, or None when all rows are held."""
        return self._free.pop() if self._free else None

    def free(self, row: int) -> None:
        if not 0 <= row < self.size or row in self._free:
            raise ValueError(f"req_to_token row {row} is not held")
        self._free.append(row)

    def clear(self) -> None:
        self._free = list(range(self.size - 1, -1, -1))


class KVPool:
    """Per-layer K/V buffers of ``(num_pages + 1) * page_size`` slots.

    ``layout`` is the attention backend's choice: ``"NHD"`` buffers are (slots, num_kv_heads,
    head_dim) (FlashInfer's NHD with one slot per page); ``"HND"`` buffers are (num_kv_heads, slots,
    head_dim), so that gathering a request's slots yields per-head contiguous (L, head_dim) blocks
    ready for batched matmuls (the torch_native backend). Slots of page 0 are never handed out; they
    absorb writes of padded positions.
    """

    def __init__(
        self,
        num_pages: int,
        page_size: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        layout: str = "NHD",
    ):
        if layout not in ("NHD", "HND"):
            raise ValueError(f"unknown KV layout {layout!r} (NHD or HND)")
        self.layout = layout
        self.num_pages = num_pages
        self.page_size = page_size
        self.num_layers = num_layers
        num_slots = (num_pages + 1) * page_size
        shape = (num_slots, num_kv_heads, head_dim) if layout == "NHD" else (num_kv_heads, num_slots, head_dim)
        self.k_buffers = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v_buffers = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """Bytes of K plus V for one token over all layers."""
        elem = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * num_kv_heads * head_dim * elem

    def set_kv(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write K/V of new tokens. loc: (T,) int64 slots; k, v: (T, num_kv_heads, head_dim)."""
        if self.layout == "NHD":
            self.k_buffers[layer_id][loc] = k
            self.v_buffers[layer_id][loc] = v
        else:
            self.k_buffers[layer_id].index_copy_(1, loc, k.transpose(0, 1))
            self.v_buffers[layer_id].index_copy_(1, loc, v.transpose(0, 1))

    def get_kv(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The raw (K, V) buffers of one layer, in ``self.layout``."""
        return self.k_buffers[layer_id], self.v_buffers[layer_id]

    def relayout(self, layout: str, dtype: Optional[torch.dtype] = None) -> "KVPool":
        """A copy of this pool in ``layout`` (and ``dtype``), same slots and contents: how a test
        runs the torch_native oracle (HND, fp32) on a FlashInfer pool (NHD, bf16)."""
        out = KVPool.__new__(KVPool)
        out.num_pages, out.page_size, out.num_layers, out.layout = self.num_pages, self.page_size, self.num_layers, layout

        def convert(buf: torch.Tensor) -> torch.Tensor:
            buf = buf.to(dtype or buf.dtype)
            return (buf.transpose(0, 1) if layout != self.layout else buf).contiguous().clone()

        out.k_buffers = [convert(b) for b in self.k_buffers]
        out.v_buffers = [convert(b) for b in self.v_buffers]
        return out
