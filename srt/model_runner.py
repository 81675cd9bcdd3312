"""Owns the model, the KV pools and the attention backend of one tensor-parallel rank.

``ModelRunner.forward(batch)`` turns a ``ModelWorkerBatch`` into logits. Pool sizing follows
SGLang: ``--max-total-tokens`` if given, else what fits in ``--mem-fraction-static`` of the device's
memory after the weights.
"""

from __future__ import annotations

import logging
import os
import time

import torch

from radixlm.kernels.attention import create_attention_backend
from radixlm.kernels.elementwise import create_elementwise_backend
from radixlm.kernels.gemm import create_gemm_backend
from radixlm.radix_cache import PagePool
from radixlm.srt.distributed import all_reduce_min
from radixlm.srt.forward_batch import ForwardBatch, ModelWorkerBatch
from radixlm.srt.kv_pool import KVPool, ReqToTokenPool
from radixlm.srt.layers.parallel_state import TpGroup
from radixlm.srt.model_config import ModelConfig
from radixlm.srt.model_loader import iter_weights
from radixlm.srt.models.registry import get_model_class
from radixlm.srt.quantization import plan_quantization, resolve_quantization
from radixlm.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda was asked for, but CUDA is not available")
    return torch.device(device)


class ModelRunner:
    """Model + pools of one rank.

    Attributes:
        req_to_token_pool: (max_running_requests + 1, context_len) slot map.
        kv_pool: per-layer K/V buffers of ``max_total_num_tokens`` slots (+ one dummy page).
        page_pool: the page allocator the scheduler's radix tree frees into.
    """

    def __init__(self, model_config: ModelConfig, server_args: ServerArgs, tp: TpGroup = TpGroup(),
                 device: torch.device | None = None):
        self.model_config = model_config
        self.server_args = server_args
        self.tp = tp
        self.device = device or resolve_device(server_args.device)
        self.dtype = model_config.dtype
        cfg = model_config.hf_config
        model_cls = get_model_class(model_config.architecture)
        with torch.device(self.device):
            self.model = model_cls(cfg, tp, self.dtype)
        self.model.load_weights(iter_weights(model_config.model_path))
        self.model.eval()
        self.gemm_backend = create_gemm_backend(server_args.kernel_backend("gemm"), self.device, self.dtype)
        # Quantized linears get their own backend (kernels/quant); the others the GEMM backend.
        self.quantization = plan_quantization(
            self.model, resolve_quantization(server_args.quantization_method(), server_args.model_path, self.device),
            server_args.model_path, tp)
        for module in self.model.modules():
            if hasattr(module, "process_weights_after_loading"):
                module.process_weights_after_loading(self.quantization.backends.get(module, self.gemm_backend))
        self.elementwise_backend = create_elementwise_backend(server_args.kernel_backend("elementwise"), self.device)
        for module in self.model.modules():
            if hasattr(module, "elementwise"):
                module.elementwise = self.elementwise_backend
        logger.info("GEMM backend: %s, elementwise: %s (%s)", self.gemm_backend.name, self.elementwise_backend.name,
                    self.dtype)
        attn = self.model.layers[0].self_attn
        self.num_kv_heads = attn.num_kv_heads
        self.attn_backend = create_attention_backend(
            server_args.kernel_backend("attention"), str(self.device), dtype=self.dtype, num_heads=attn.num_heads,
            num_kv_heads=attn.num_kv_heads, head_dim=attn.head_dim, scaling=attn.head_dim ** -0.5)
        self._init_memory_pool()
        if hasattr(self.model, "decoder_stack"):
            from radixlm.srt.models.decoder_stack import CpuDecoderStack

            self.model.decoder_stack = CpuDecoderStack.maybe_create(self.model, self.attn_backend)
        from radixlm.srt.cuda_graph_runner import CudaGraphRunner

        self.cuda_graph_runner = CudaGraphRunner.maybe_create(self)  # None on CPU or --disable-cuda-graph
        # Seconds spent inside the model's forward (benchmarks subtract it to get per-step overhead).
        self.model_time_s = 0.0

    def _init_memory_pool(self) -> None:
        args, mc = self.server_args, self.model_config
        per_token = KVPool.bytes_per_token(mc.num_hidden_layers, self.num_kv_heads, mc.head_dim, self.dtype)
        if args.max_total_tokens is not None:
            total = args.max_total_tokens
        else:
            weight_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
            budget = int(_device_memory(self.device) * args.mem_fraction_static) - weight_bytes
            if budget <= per_token * args.page_size * 2:
                raise RuntimeError(
                    f"--mem-fraction-static {args.mem_fraction_static} leaves no room for the KV cache "
                    f"(weights take {weight_bytes / 2**20:.0f} MiB); raise it or set --max-total-tokens")
            # No point holding more than every running request at full context.
            total = min(budget // per_token, mc.context_len * args.max_running_requests)
        # Every rank must hold the same number of pages (same scheduling decisions).
        total = all_reduce_min(self.tp, total)
        num_pages = max(2, total // args.page_size)
        self.max_total_num_tokens = num_pages * args.page_size
        self.page_pool = PagePool(num_pages, args.page_size)
        self.kv_pool = KVPool(num_pages, args.page_size, mc.num_hidden_layers, self.num_kv_heads,
                              mc.head_dim, self.dtype, self.device, layout=self.attn_backend.kv_layout)
        # One row more than max running: the chunked request holds a row while not yet running.
        self.req_to_token_pool = ReqToTokenPool(args.max_running_requests + 1, mc.context_len, self.device)
        logger.info("KV cache: %d tokens in %d pages of %d (%.1f MiB)", self.max_total_num_tokens,
                    num_pages, args.page_size, self.max_total_num_tokens * per_token / 2**20)

    def forward(self, batch: ModelWorkerBatch, float_logits: bool = True) -> torch.Tensor:
        """Run the model; returns logits (R, vocab) for the rows chosen by the batch: float32, or with
        ``float_logits=False`` in the model's dtype as its LM head gives them (bf16 logits widen to
        fp32 exactly, so either gives the same values; a greedy-only step skips the (R, vocab) copy)."""
        if self.cuda_graph_runner is not None and self.cuda_graph_runner.can_run(batch):
            logits = self.cuda_graph_runner.replay(batch)
        else:
            fb = ForwardBatch.init_new(batch, self.req_to_token_pool, self.kv_pool, self.attn_backend, self.device)
            t0 = time.perf_counter()
            logits = self.model(fb.input_ids, fb.positions, fb)
            self.model_time_s += time.perf_counter() - t0  # on CUDA: launch time only (no sync)
        return logits.float() if float_logits else logits


def _device_memory(device: torch.device) -> int:
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return free
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
