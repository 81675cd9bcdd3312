"""What one model forward needs: ``ModelWorkerBatch`` (plain lists from the scheduler) and
``ForwardBatch`` (tensors), following SGLang's ``forward_batch_info.py``.

``ForwardBatch.init_new`` is the one place where Python lists become tensors.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

import torch

if TYPE_CHECKING:
    from radixlm.srt.kv_pool import KVPool, ReqToTokenPool


class ForwardMode(enum.Enum):
    EXTEND = 1  # forward over tokens not yet cached (prefill, or a prefill chunk), after a cached prefix
    DECODE = 2  # one new token per request
    # Speculative verify: an extend of the last token + drafted tokens per request (1 + k, k >= 0),
    # with logits at every new position (attention treats it as an extend over the cached prefix).
    TARGET_VERIFY = 3


@dataclass
class ModelWorkerBatch:
    """A scheduled batch as plain Python data (built by ``ScheduleBatch``).

    For request ``i``: ``prefix_lens[i]`` tokens already have KV, ``extend_lens[i]`` new tokens are
    computed now (1 in decode), ``seq_lens[i] = prefix_lens[i] + extend_lens[i]``.
    ``input_ids`` and ``out_cache_loc`` are flat over all new tokens, request by request.
    ``logprob_start_lens[i]``: for EXTEND with input logprobs, the first position (relative to the
    extend start) whose next-token logprob is needed; None when only the last token is needed.
    """

    forward_mode: ForwardMode
    input_ids: list[int]
    req_pool_indices: list[int]
    prefix_lens: list[int]
    extend_lens: list[int]
    out_cache_loc: list[int]
    logprob_start_lens: list[Optional[int]] = field(default_factory=list)
    _layout: Optional[tuple[list[int], list[int]]] = field(default=None, repr=False, compare=False)

    @property
    def batch_size(self) -> int:
        return len(self.req_pool_indices)

    @property
    def seq_lens(self) -> list[int]:
        return [p + e for p, e in zip(self.prefix_lens, self.extend_lens)]

    def logits_layout(self) -> tuple[list[int], list[int]]:
        """(rows, offsets): the flat token rows to project to logits, and per request the slice
        ``offsets[i]:offsets[i+1]`` of those rows. A request's last row is its last new token.
        Computed once per batch (the runner and the worker both ask)."""
        if self._layout is None:
            self._layout = self._compute_logits_layout()
        return self._layout

    def _compute_logits_layout(self) -> tuple[list[int], list[int]]:
        if self.forward_mode is ForwardMode.DECODE:
            return list(range(self.batch_size)), list(range(self.batch_size + 1))
        if self.forward_mode is ForwardMode.TARGET_VERIFY:  # every new position of every request
            offsets = [0]
            for ext in self.extend_lens:
                offsets.append(offsets[-1] + ext)
            return list(range(offsets[-1])), offsets
        rows: list[int] = []
        offsets = [0]
        start = 0
        starts = self.logprob_start_lens or [None] * self.batch_size
        for ext, lp_start in zip(self.extend_lens, starts):
            first = start + ext - 1 if lp_start is None else start + max(0, min(lp_start, ext - 1))
            rows.extend(range(first, start + ext))
            offsets.append(len(rows))
            start += ext
        return rows, offsets


@dataclass
class ForwardBatch:
    """Tensors of one forward pass. T = number of new tokens, bs = number of requests.

    input_ids, positions, out_cache_loc: (T,) int64.
    logits_indices: (R,) int64 rows of the hidden states to project to logits: the last new token
    of each request, plus, for requests asking for input logprobs, the earlier positions.
    """

    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: list[int]
    prefix_lens: list[int]
    extend_lens: list[int]
    logits_indices: torch.Tensor
    # Per request, the slice of logits_indices' rows that belong to it.
    logits_row_offsets: list[int]
    req_to_token_pool: "ReqToTokenPool"
    kv_pool: "KVPool"
    attn_backend: Any
    attn_metadata: Any = None

    @classmethod
    def init_new(
        cls,
        batch: ModelWorkerBatch,
        req_to_token_pool: "ReqToTokenPool",
        kv_pool: "KVPool",
        attn_backend: Any,
        device: torch.device,
    ) -> "ForwardBatch":
        if batch.forward_mode is ForwardMode.DECODE:
            positions = batch.prefix_lens
        else:
            positions = []
            for prefix, ext in zip(batch.prefix_lens, batch.extend_lens):
                positions.extend(range(prefix, prefix + ext))
        logits_indices, row_offsets = batch.logits_layout()

        def t(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64).to(device, non_blocking=True)

        fb = cls(
            forward_mode=batch.forward_mode,
            batch_size=batch.batch_size,
            input_ids=t(batch.input_ids),
            positions=t(positions),
            out_cache_loc=t(batch.out_cache_loc),
            req_pool_indices=t(batch.req_pool_indices),
            seq_lens=batch.seq_lens,
            prefix_lens=list(batch.prefix_lens),
            extend_lens=list(batch.extend_lens),
            logits_indices=t(logits_indices),
            logits_row_offsets=row_offsets,
            req_to_token_pool=req_to_token_pool,
            kv_pool=kv_pool,
            attn_backend=attn_backend,
        )
        attn_backend.init_forward_metadata(fb)
        return fb
