"""The host tier of the hierarchical KV cache: KV pages kept outside the device pool.

``HostKVPool.buffer`` is one tensor of shape ``(num_pages + 1, num_layers, 2, page_size,
num_kv_heads, head_dim)`` in the KV dtype (index 0 of dim 2 is K, 1 is V; page 0 unused, like the
device pool's dummy page). The layout per page is the same whatever the device pool's (NHD or HND),
so one page's bytes are also the storage tier's payload. On CUDA the buffer is pinned, so copies can
run asynchronously on a stream; on CPU it is ordinary memory allocated with ``torch.empty``, so the
operating system only backs the pages that are ever written (a large ``--hicache-ratio`` costs
nothing until it is used).
"""

from __future__ import annotations

import torch

from radixlm.srt.kv_pool import KVPool


class HostKVPool:
    def __init__(self, num_pages: int, kv_pool: KVPool, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> None:
        """A host buffer of ``num_pages`` pages shaped like ``kv_pool``'s pages (heads of this rank)."""
        self.num_pages = num_pages
        self.page_size = kv_pool.page_size
        self.num_layers = kv_pool.num_layers
        self.page_shape = (self.num_layers, 2, self.page_size, num_kv_heads, head_dim)
        self.dtype = dtype
        pin = torch.cuda.is_available() and kv_pool.k_buffers[0].is_cuda
        self.buffer = torch.empty((num_pages + 1, *self.page_shape), dtype=dtype, pin_memory=pin)
        self.page_bytes = self.buffer[0].numel() * self.buffer.element_size()

    # ---- device <-> host ------------------------------------------------------------------------
    @staticmethod
    def _paged(kv_pool: KVPool, buf: torch.Tensor) -> tuple[torch.Tensor, int]:
        """A view of one layer's K or V buffer with pages as a dimension, and that dimension:
        NHD (slots, H, D) -> (pages, ps, H, D), dim 0; HND (H, slots, D) -> (H, pages, ps, D), dim 1."""
        ps = kv_pool.page_size
        if kv_pool.layout == "NHD":
            return buf.view(-1, ps, *buf.shape[1:]), 0
        return buf.view(buf.shape[0], -1, ps, buf.shape[2]), 1

    def gather_device(self, kv_pool: KVPool, device_pages: list[int]) -> torch.Tensor:
        """K/V of ``device_pages`` as a contiguous (n, *page_shape) tensor on the KV pool's device."""
        dev = kv_pool.k_buffers[0].device
        idx = torch.tensor(device_pages, dtype=torch.int64, device=dev)
        out = torch.empty((len(device_pages), *self.page_shape), dtype=self.dtype, device=dev)
        for layer in range(self.num_layers):
            for j, buf in enumerate(kv_pool.get_kv(layer)):
                paged, dim = self._paged(kv_pool, buf)
                pages = paged.index_select(dim, idx)
                out[:, layer, j].copy_(pages if dim == 0 else pages.permute(1, 2, 0, 3))  # (n, ps, H, D)
        return out

    def save(self, kv_pool: KVPool, device_pages: list[int], host_pages: list[int]) -> None:
        """Copy device pages into host pages (``host_pages[i]`` gets ``device_pages[i]``; distinct ids)."""
        if not device_pages:
            return
        data = self.gather_device(kv_pool, device_pages)
        self.buffer.index_copy_(0, torch.tensor(host_pages, dtype=torch.int64), data.to("cpu"))

    def gather(self, host_pages: list[int]) -> torch.Tensor:
        """A copy of ``host_pages`` as (n, *page_shape) (safe to keep while the pages are reused)."""
        return self.buffer.index_select(0, torch.tensor(host_pages, dtype=torch.int64))

    @classmethod
    def load(cls, kv_pool: KVPool, data: torch.Tensor, device_pages: list[int]) -> None:
        """Write ``data`` (n, L, 2, ps, H, D) into ``device_pages`` of ``kv_pool``."""
        dev = kv_pool.k_buffers[0].device
        data = data.to(dev, non_blocking=True)
        idx = torch.tensor(device_pages, dtype=torch.int64, device=dev)
        for layer in range(data.shape[1]):
            for j, buf in enumerate(kv_pool.get_kv(layer)):
                paged, dim = cls._paged(kv_pool, buf)
                src = data[:, layer, j]  # (n, ps, H, D)
                paged.index_copy_(dim, idx, src if dim == 0 else src.permute(2, 0, 1, 3))

    # ---- host <-> storage payloads --------------------------------------------------------------
    def page_payload(self, page: torch.Tensor) -> bytes:
        """One page (page_shape) as bytes in the KV dtype."""
        return page.contiguous().view(torch.uint8).numpy().tobytes()

    def page_from_payload(self, payload: bytes) -> torch.Tensor:
        """The inverse of ``page_payload``: a (page_shape) tensor (a copy)."""
        flat = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        return flat.view(self.dtype).view(self.page_shape)
