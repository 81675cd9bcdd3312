"""CUDA graphs for decode (SGLang's ``model_executor/cuda_graph_runner.py``).

At start-up the model's decode forward is captured once per batch size in ``capture_batch_sizes``
(SGLang's list: 1, 2, 4, 8, 12, then 16..256 step 8, 272..512 step 16, then step 32), capped by
``--max-running-requests``. A decode batch of ``bs`` requests is padded up to the next captured size:
padded rows read token 0 at position 0, write their K/V to slot 0 (the dummy page) and attend to
one key at slot 0; their logits are dropped. Extend batches, and decode batches larger than the
largest captured size, run eagerly. ``--disable-cuda-graph`` turns this off.

Static inputs are one (4, max_bs) int64 device tensor whose rows are input_ids, positions,
out_cache_loc and req_pool_indices; replay copies a batch into it with one host-to-device copy,
re-plans the attention backend's graph metadata outside the graph, replays and returns a copy of
the captured logits rows. The attention backend must provide ``supports_cuda_graph = True``,
``init_cuda_graph_state(max_bs, max_num_tokens, device)`` and
``init_forward_metadata_cuda_graph(forward_batch, num_real)`` (FlashInfer does; torch_native's
per-batch shapes cannot be captured).

ModelRunner hook::

    self.cuda_graph_runner = CudaGraphRunner.maybe_create(self)      # end of __init__
    if self.cuda_graph_runner and self.cuda_graph_runner.can_run(batch):   # start of forward
        logits = self.cuda_graph_runner.replay(batch)                      # widened to fp32 there
"""

from __future__ import annotations

import bisect
import logging
import time
from typing import TYPE_CHECKING, Any, Optional

import torch

from radixlm.srt.forward_batch import ForwardBatch, ForwardMode, ModelWorkerBatch

if TYPE_CHECKING:
    from radixlm.srt.model_runner import ModelRunner

logger = logging.getLogger(__name__)

_INPUT_IDS, _POSITIONS, _OUT_CACHE_LOC, _REQ_POOL_INDICES = range(4)


def capture_batch_sizes(max_bs: int) -> list[int]:
    """SGLang's decode capture sizes up to ``max_bs``, plus ``max_bs`` itself (ascending).

    Raises:
        ValueError: ``max_bs < 1``.
    """
    if max_bs < 1:
        raise ValueError(f"max batch size must be >= 1, got {max_bs}")
    sizes = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 513, 16))
    sizes += list(range(544, max_bs + 1, 32))
    out = [s for s in sizes if s <= max_bs]
    if out[-1] != max_bs:
        out.append(max_bs)
    return out


def padded_batch_size(batch_sizes: list[int], bs: int) -> Optional[int]:
    """The smallest captured size >= ``bs`` (``batch_sizes`` ascending), or None if none is."""
    i = bisect.bisect_left(batch_sizes, bs)
    return batch_sizes[i] if i < len(batch_sizes) else None


class CudaGraphRunner:
    """Captures and replays decode forwards of one ModelRunner.

    Args:
        model_runner: provides ``model``, ``attn_backend``, ``device``, ``req_to_token_pool``,
            ``kv_pool`` and ``server_args.max_running_requests``.
        batch_sizes: sizes to capture (default ``capture_batch_sizes(max_running_requests)``).
    Raises:
        RuntimeError: capture failed (the message suggests ``--disable-cuda-graph``).
    """

    def __init__(self, model_runner: "ModelRunner", batch_sizes: Optional[list[int]] = None):
        self.model = model_runner.model
        self.backend = model_runner.attn_backend
        self.device = model_runner.device
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.kv_pool = model_runner.kv_pool
        sizes = batch_sizes or capture_batch_sizes(model_runner.server_args.max_running_requests)
        self.batch_sizes = sorted(set(sizes))
        self.max_bs = self.batch_sizes[-1]
        # Row i of the static block: see the _INPUT_IDS.. constants.
        self._static = torch.zeros((4, self.max_bs), dtype=torch.int64, device=self.device)
        self._logits_indices = torch.arange(self.max_bs, dtype=torch.int64, device=self.device)
        # Shared requests list the same slots, so a batch's keys are bounded by bs x context length.
        max_keys = self.max_bs * self.req_to_token_pool.max_context_len
        self.backend.init_cuda_graph_state(self.max_bs, max_keys, self.device)
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._outputs: dict[int, torch.Tensor] = {}
        self._batches: dict[int, ForwardBatch] = {}
        self._pool: Any = None
        self._stream = torch.cuda.Stream(device=self.device)
        t0 = time.perf_counter()
        try:
            for bs in reversed(self.batch_sizes):  # largest first, so smaller graphs reuse its pool
                self._capture(bs)
        except Exception as exc:
            raise RuntimeError(f"CUDA graph capture failed ({exc}); run with --disable-cuda-graph") from exc
        logger.info("captured decode CUDA graphs for batch sizes %s in %.1f s", self.batch_sizes,
                    time.perf_counter() - t0)

    @classmethod
    def maybe_create(cls, model_runner: "ModelRunner") -> Optional["CudaGraphRunner"]:
        """A runner when decode can be captured: CUDA device, ``--disable-cuda-graph`` not set
        and an attention backend with ``supports_cuda_graph``; otherwise None."""
        if model_runner.device.type != "cuda" or model_runner.server_args.disable_cuda_graph:
            return None
        if not getattr(model_runner.attn_backend, "supports_cuda_graph", False):
            logger.info("attention backend %s cannot be captured; decode runs eagerly",
                        type(model_runner.attn_backend).__name__)
            return None
        return cls(model_runner)

    def can_run(self, batch: ModelWorkerBatch) -> bool:
        return batch.forward_mode is ForwardMode.DECODE and 0 < batch.batch_size <= self.max_bs

    # ---- capture --------------------------------------------------------------------------------
    def _forward_batch(self, bs: int) -> ForwardBatch:
        s = self._static[:, :bs]
        return ForwardBatch(
            forward_mode=ForwardMode.DECODE, batch_size=bs, input_ids=s[_INPUT_IDS],
            positions=s[_POSITIONS], out_cache_loc=s[_OUT_CACHE_LOC], req_pool_indices=s[_REQ_POOL_INDICES],
            seq_lens=[], prefix_lens=[], extend_lens=[1] * bs, logits_indices=self._logits_indices[:bs],
            logits_row_offsets=list(range(bs + 1)), req_to_token_pool=self.req_to_token_pool,
            kv_pool=self.kv_pool, attn_backend=self.backend)

    def _capture(self, bs: int) -> None:
        fb = self._forward_batch(bs)
        self._static[:, :bs].zero_()  # every row padding: token 0, position 0, writes to slot 0
        self.backend.init_forward_metadata_cuda_graph(fb, num_real=0)
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._stream):
            for _ in range(2):  # warm-up: lazy initialisation and allocator growth outside capture
                self.model(fb.input_ids, fb.positions, fb)
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, stream=self._stream):
            out = self.model(fb.input_ids, fb.positions, fb)
        torch.cuda.synchronize(self.device)
        self._pool = graph.pool()
        self._graphs[bs], self._outputs[bs], self._batches[bs] = graph, out, fb

    # ---- replay ---------------------------------------------------------------------------------
    def replay(self, batch: ModelWorkerBatch) -> torch.Tensor:
        """Decode ``batch`` (``can_run`` must hold) through the graph of the next captured size.

        Returns:
            (bs, vocab) logits in the model's dtype, a fresh tensor (the graph's output is reused by
            the next replay).
        """
        bs = batch.batch_size
        pbs = padded_batch_size(self.batch_sizes, bs)
        if batch.forward_mode is not ForwardMode.DECODE or pbs is None:
            raise ValueError(f"cannot replay a {batch.forward_mode.name} batch of {bs} requests")
        pad = [0] * (pbs - bs)
        # Decode positions: the new token sits right after the cached ones.
        host = torch.tensor([batch.input_ids + pad, batch.prefix_lens + pad, batch.out_cache_loc + pad,
                             batch.req_pool_indices + pad], dtype=torch.int64)
        self._static[:, :pbs].copy_(host, non_blocking=True)
        fb = self._batches[pbs]
        fb.seq_lens, fb.prefix_lens = batch.seq_lens, list(batch.prefix_lens)
        self.backend.init_forward_metadata_cuda_graph(fb, num_real=bs)
        self._graphs[pbs].replay()
        return self._outputs[pbs][:bs].clone()
