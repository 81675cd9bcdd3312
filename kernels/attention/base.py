"""Attention backend interface (SGLang's ``AttentionBackend`` shape).

A backend is planned once per batch (``init_forward_metadata``) and then called once per layer.
Shapes: q (T, num_heads * head_dim); k, v (T, num_kv_heads * head_dim); output
(T, num_heads * head_dim), where T is the number of new tokens in the batch.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from radixlm.srt.forward_batch import ForwardBatch


class AttentionBackend(abc.ABC):
    """Computes paged attention and writes the new tokens' K/V into the KV pool.

    ``kv_layout`` is the ``KVPool`` layout the backend reads ("NHD" or "HND"; see ``KVPool``).
    """

    name = ""
    kv_layout = "NHD"

    @abc.abstractmethod
    def init_forward_metadata(self, forward_batch: "ForwardBatch") -> None:
        """Precompute per-batch indices (e.g. from ``req_to_token``); called once per forward."""

    @abc.abstractmethod
    def forward_extend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                       forward_batch: "ForwardBatch") -> torch.Tensor:
        """Causal attention of new tokens over the cached prefix plus themselves."""

    @abc.abstractmethod
    def forward_decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                       forward_batch: "ForwardBatch") -> torch.Tensor:
        """One query token per request over all of its cached tokens."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                forward_batch: "ForwardBatch") -> torch.Tensor:
        from radixlm.srt.forward_batch import ForwardMode

        if forward_batch.forward_mode is ForwardMode.DECODE:
            return self.forward_decode(q, k, v, layer_id, forward_batch)
        return self.forward_extend(q, k, v, layer_id, forward_batch)
