"""Server and engine configuration: one frozen dataclass, the CLI derived from its fields.

Flag names follow SGLang's (``--model-path --port --tp-size --page-size --chunked-prefill-size
--max-running-requests --mem-fraction-static --schedule-policy --disable-radix-cache
--grammar-backend --attention-backend --device``). Unknown options are errors.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any, Optional, get_type_hints

from radixlm.srt.function_call import TOOL_CALL_PARSERS
from radixlm.srt.multinode import node_layout_error
from radixlm.srt.reasoning_parser import REASONING_PARSERS

SCHEDULE_POLICIES = ("lpm", "fcfs")
ATTENTION_BACKENDS = ("auto", "torch_native", "cpu", "flashinfer")
GEMM_BACKENDS = ("auto", "torch_native", "onednn", "cpu")
ELEMENTWISE_BACKENDS = ("auto", "torch_native", "cpu")
GRAMMAR_BACKENDS = ("xgrammar", "outlines", "none")
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")
HICACHE_WRITE_POLICIES = ("write_through", "write_back")
HICACHE_STORAGE_BACKENDS = ("file",)
SPECULATIVE_ALGORITHMS = ("NGRAM",)
LOAD_BALANCE_METHODS = ("cache_aware", "round_robin", "shortest_queue")  # managers/load_balance
QUANTIZATION_METHODS = ("none", "int8", "gguf")


class ServerArgsError(ValueError):
    """An invalid combination or value of server arguments."""


@dataclass(frozen=True)
class ServerArgs:
    """All options of ``radixlm serve`` and ``radixlm.Engine``.

    Sizes are in tokens unless said otherwise. ``None`` means "choose automatically".
    """

    model_path: Optional[str] = field(default=None, metadata={"help": "HF folder, .gguf file or hub id; default: the SmolLM2-135M-Instruct demo model"})
    tokenizer_path: Optional[str] = field(default=None, metadata={"help": "tokenizer folder (default: the model's)"})
    served_model_name: Optional[str] = field(default=None, metadata={"help": "model id reported by /v1/models"})
    chat_template: Optional[str] = field(default=None, metadata={"help": "Jinja chat template file overriding the tokenizer's"})
    tool_call_parser: Optional[str] = field(default=None, metadata={"help": (
        "format of tool calls in model output for /v1/chat/completions tools: hermes|qwen25|llama3|mistral|"
        "pythonic (default: the one the chat template writes, else hermes, the format radixlm renders tools in for "
        "templates without tool support)")})
    reasoning_parser: Optional[str] = field(default=None, metadata={"help": (
        "split <think> reasoning into message.reasoning_content: deepseek-r1|qwen3|qwen3-thinking|deepseek-v3|"
        "glm45|kimi (default: off, the reasoning stays in content)")})
    responses_store_size: int = field(default=1024, metadata={"help": (
        "how many /v1/responses answers are kept in memory (those with store: true, which is what OpenAI assumes "
        "when a request leaves it out) for GET /v1/responses/{id} and previous_response_id, the oldest dropped "
        "first; 0: none, store is then false")})
    host: str = field(default="127.0.0.1", metadata={"help": "HTTP bind address"})
    port: int = field(default=30000, metadata={"help": "HTTP port"})
    api_key: Optional[str] = field(default=None, metadata={"help": "require 'Authorization: Bearer KEY' on every route but /health* and /metrics (as SGLang)"})
    device: str = field(default="auto", metadata={"help": "auto|cpu|cuda"})
    dtype: str = field(default="auto", metadata={"help": "auto|float32|bfloat16|float16; auto on CPU: bfloat16 "
                                                          "with AMX-BF16 or AVX512-BF16 units, else float32"})
    context_length: Optional[int] = field(default=None, metadata={"help": "override the model's context length (longer than the model's own needs RADIXLM_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1, as SGLang)"})
    tp_size: int = field(default=1, metadata={"help": "tensor-parallel ranks"})
    # Multi-node tensor parallelism (SGLang's flags; srt/multinode.py).
    nnodes: int = field(default=1, metadata={"help": (
        "nodes the --tp-size ranks are spread over, tp_size / nnodes each; node 0 serves HTTP, the others run "
        "only their scheduler ranks and exit when node 0 stops")})
    node_rank: int = field(default=0, metadata={"help": "this node's index, 0..nnodes-1"})
    dist_init_addr: Optional[str] = field(default=None, metadata={"help": (
        "HOST:PORT where node 0 opens the torch.distributed rendezvous (tcp); the same on every node, needed "
        "with --nnodes > 1")})
    cpu_threads: Optional[int] = field(default=None, metadata={"help": (
        "intra-op CPU threads per scheduler rank (default: OMP_NUM_THREADS, else the available cores "
        "split between the TP ranks of all --dp-size replicas)")})
    # ---- data parallelism (managers/data_parallel_controller.py, managers/load_balance/) ----
    dp_size: int = field(default=1, metadata={"help": (
        "data-parallel replicas: N scheduler process groups (each --tp-size ranks) with their own model copy, "
        "KV pool and radix cache behind this one server; the CPU cores are split between them")})
    load_balance_method: str = field(default="cache_aware", metadata={"help": (
        "how requests are spread over the --dp-size replicas: cache_aware (the replica whose approximate "
        "prefix tree matches the prompt best, else the least loaded; SGLang router's algorithm), round_robin, "
        "shortest_queue (fewest unfinished requests)")})
    router_cache_threshold: float = field(default=0.3, metadata={"help": (
        "cache_aware: follow the prefix match when it covers more than this fraction of the prompt (0..1)")})
    router_balance_abs_threshold: int = field(default=64, metadata={"help": (
        "cache_aware: loads count as imbalanced (the least loaded replica then gets the request) when "
        "max - min exceeds this many requests and max > min * --router-balance-rel-threshold")})
    router_balance_rel_threshold: float = field(default=1.5, metadata={"help": "cache_aware: see --router-balance-abs-threshold (>= 1)"})
    router_max_tree_size: Optional[int] = field(default=None, metadata={"help": (
        "cache_aware: tokens per replica in the approximate prefix tree, least recently routed prefixes "
        "pruned first (default: the replica's KV pool size, --max-total-tokens)")})
    page_size: int = field(default=1, metadata={"help": "tokens per KV page (power of two)"})
    max_total_tokens: Optional[int] = field(default=None, metadata={"help": "KV pool size in tokens (default: from --mem-fraction-static)"})
    mem_fraction_static: float = field(default=0.1, metadata={"help": "fraction of (CPU or GPU) memory for weights + KV pool"})
    max_running_requests: int = field(default=128, metadata={"help": "max requests in a decode batch (bigger CPU batches use the GEMMs better; vLLM: 256)"})
    max_queued_requests: Optional[int] = field(default=None, metadata={"help": "answer 503 beyond this many waiting requests"})
    chunked_prefill_size: int = field(default=512, metadata={"help": "max tokens of one request per extend step; -1 disables chunking"})
    max_prefill_tokens: int = field(default=4096, metadata={"help": "token budget of one extend batch"})
    shutdown_timeout: Optional[float] = field(default=None, metadata={"help": (
        "seconds SIGTERM / Ctrl-C waits for open requests to finish (new ones get 503) before stopping; "
        "default: until they have (a second signal stops at once); 0: stop at once")})
    enable_mixed_chunk: bool = field(default=False, metadata={"help": (
        "mix prefill and decode in a batch (SGLang's flag): the running requests take their decode step "
        "inside each extend batch, so a long prompt's chunks no longer pause every stream (their tokens "
        "count against --chunked-prefill-size and --max-prefill-tokens); not with --speculative-algorithm")})
    schedule_policy: str = field(default="lpm", metadata={"help": (
        "lpm: the waiting request with the longest cached prefix first (ties in arrival order; a long "
        "queue falls back to arrival order), so requests that share a prompt run together | fcfs: "
        "arrival order, for workloads without shared prefixes where latency order matters")})
    schedule_conservativeness: float = field(default=1.0, metadata={"help": "scales the decode-memory reservation"})
    disable_radix_cache: bool = field(default=False, metadata={"help": "turn prefix caching off"})
    enable_deterministic_inference: bool = field(default=False, metadata={"help": (
        "batch-invariant kernels (SGLang's flag): a request's logits are bitwise the same whatever batch, "
        "chunking or cache hit it runs with. CPU only: attention, GEMM and elementwise ops all run radixlm's "
        "C++ kernels (what auto already picks for fp32, and for bf16 on CPUs with AVX512-BF16, AMX included); "
        "the flag refuses other choices (--gemm-backend onednn, whose blocking depends on the batch) and loads "
        "a GGUF's kept blocks dequantized")})
    enable_hierarchical_cache: bool = field(default=False, metadata={"help": (
        "keep pages evicted from the KV pool in a host pool (and, with --hicache-storage-backend, in files) and "
        "load them back on a prefix match")})
    hicache_ratio: float = field(default=2.0, metadata={"help": "host pool size relative to the device KV pool (pages)"})
    hicache_write_policy: str = field(default="write_through", metadata={"help": (
        "write_through: copy pages to host (and storage) as soon as they enter the radix tree; write_back: when "
        "they are evicted from the KV pool (storage writes then go through a background thread)")})
    hicache_storage_backend: Optional[str] = field(default=None, metadata={"help": (
        "file: a storage tier of page files under --hicache-storage-dir, shared by replicas and kept across "
        "restarts (default: none)")})
    hicache_storage_dir: Optional[str] = field(default=None, metadata={"help": (
        "folder of the file storage tier (default: $RADIXLM_CACHE_DIR/hicache or ~/.cache/radixlm/hicache)")})
    hicache_storage_max_gb: float = field(default=8.0, metadata={"help": (
        "size cap of the file storage tier in GiB, per model layout; least recently used pages are deleted beyond it")})
    hicache_storage_prefetch_policy: str = field(default="timeout", metadata={"help": (
        "when a request whose prefix is being read from storage in the background may start: best_effort "
        "(at once, with the pages read so far), wait_complete (when the read ends), timeout (when it ends or "
        "after min(max, base + per_ki_token * prompt tokens / 1024) s; SGLang's default)")})
    hicache_storage_backend_extra_config: Optional[str] = field(default=None, metadata={"help": (
        "JSON object for the storage tier: prefetch_timeout_base (s, default 2.0), prefetch_timeout_per_ki_token "
        "(s, 0.1), prefetch_timeout_max (s, 30.0)")})
    attention_backend: str = field(default="auto", metadata={"help": (
        "auto|torch_native|cpu|flashinfer; auto = cpu on CPU (one C++ kernel call per layer, cascade over shared "
        "prefixes, compiled on first use; torch_native when no compiler), flashinfer on CUDA when installed, "
        "else torch_native")})
    gemm_backend: str = field(default="auto", metadata={"help": (
        "linear layers: auto|torch_native|onednn|cpu; auto on CPU = cpu for fp32 (radixlm's C++ kernel over "
        "weights packed once into 16-column panels; bitwise batch-invariant), else onednn (oneDNN's prepacked "
        "weights) where oneDNN supports the dtype, else torch_native (F.linear)")})
    quantization: Optional[str] = field(default=None, metadata={"help": (
        "weights kept quantized (CPU): none (float, the reference) | int8 (any model: linear weights quantized at "
        "load, per output channel) | gguf (a GGUF model keeps its Q8_0/Q4_0/Q4_1 blocks as they are); default: "
        "gguf for a .gguf model path (the demo model included), else none")})
    elementwise_backend: str = field(default="auto", metadata={"help": (
        "RMSNorm + residual add, RoPE, SiLU-and-mul: auto|torch_native|cpu; auto = cpu (fused C++ kernels, "
        "compiled on first use) on CPU, else torch_native (the reference torch ops)")})
    grammar_backend: str = field(default="xgrammar", metadata={"help": "xgrammar|outlines|none"})
    grammar_compile_timeout: float = field(default=30.0, metadata={"help": "seconds a grammar may take to compile before its request ends with an error"})
    request_timeout: Optional[float] = field(default=None, metadata={"help": "seconds any request may take (from its arrival) before it is aborted, keeping its partial output; a request's own 'timeout' field can only lower it (default: no limit)"})
    grammar_any_whitespace: bool = field(default=False, metadata={"help": "let JSON grammars emit any whitespace (default: compact separators, so output cannot run away in whitespace)"})
    decode_log_interval: int = field(default=40, metadata={"help": (
        "log a 'Decode batch.' line (running requests, KV tokens and usage, generation throughput since the last "
        "line, queued requests) every N decode steps; every extend batch logs a 'Prefill batch.' line (SGLang's "
        "flag and lines, at log level info)")})
    stream_interval: int = field(default=1, metadata={"help": "streamed requests get their new tokens every N decode steps (the first token at once): larger values cut the per-token work of the HTTP and detokenizer processes, smaller ones stream more smoothly; a request's sampling_params.stream_interval overrides it"})
    speculative_algorithm: Optional[str] = field(default=None, metadata={"help": (
        "speculative decoding: NGRAM drafts from the request's own prompt and output and from continuations in "
        "the radix cache, verified in one forward (default: off)")})
    speculative_num_draft_tokens: int = field(default=8, metadata={"help": (
        "tokens per request in one verify forward: the last token plus up to N-1 drafted ones")})
    speculative_ngram_min_match_window_size: int = field(default=1, metadata={"help": (
        "shortest suffix of the sequence (tokens) matched against earlier text to draft from")})
    speculative_ngram_max_match_window_size: int = field(default=12, metadata={"help": (
        "longest suffix (tokens) matched; longer matches are tried first")})
    disable_cuda_graph: bool = field(default=False, metadata={"help": "run decode eagerly on CUDA"})
    random_seed: int = field(default=0, metadata={"help": "seed of unseeded sampling"})
    cache_dir: Optional[str] = field(default=None, metadata={"help": "where converted GGUF weights are cached"})
    log_level: str = field(default="info", metadata={"help": "logging level"})
    log_requests: bool = field(default=False, metadata={"help": "log each request's prompt, sampling parameters and output at INFO (off: user data stays out of the log)"})

    def validate(self) -> None:
        """Raise ``ServerArgsError`` naming the offending option."""
        def choice(name: str, allowed: tuple[str, ...]) -> None:
            if getattr(self, name) not in allowed:
                raise ServerArgsError(f"--{name.replace('_', '-')} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")

        choice("schedule_policy", SCHEDULE_POLICIES)
        choice("attention_backend", ATTENTION_BACKENDS)
        choice("gemm_backend", GEMM_BACKENDS)
        choice("elementwise_backend", ELEMENTWISE_BACKENDS)
        choice("grammar_backend", GRAMMAR_BACKENDS)
        choice("device", DEVICES)
        choice("dtype", DTYPES)
        if self.quantization is not None:
            choice("quantization", QUANTIZATION_METHODS)
        if self.tool_call_parser is not None:
            choice("tool_call_parser", tuple(TOOL_CALL_PARSERS))
        if self.reasoning_parser is not None:
            choice("reasoning_parser", tuple(REASONING_PARSERS))
        choice("hicache_write_policy", HICACHE_WRITE_POLICIES)
        if self.hicache_storage_backend is not None:
            choice("hicache_storage_backend", HICACHE_STORAGE_BACKENDS)
        self._validate_hicache()
        self._validate_deterministic()
        self._validate_dp()
        if self.page_size < 1 or self.page_size & (self.page_size - 1):
            raise ServerArgsError(f"--page-size must be a power of two, got {self.page_size}")
        if self.cpu_threads is not None and self.cpu_threads < 1:
            raise ServerArgsError(f"--cpu-threads must be >= 1, got {self.cpu_threads}")
        if self.responses_store_size < 0:
            raise ServerArgsError(f"--responses-store-size must be >= 0, got {self.responses_store_size}")
        if self.tp_size < 1:
            raise ServerArgsError(f"--tp-size must be >= 1, got {self.tp_size}")
        nodes_problem = node_layout_error(self.tp_size, self.nnodes, self.node_rank, self.dist_init_addr)
        if nodes_problem is not None:
            raise ServerArgsError(nodes_problem)
        if self.chunked_prefill_size != -1 and self.chunked_prefill_size < 1:
            raise ServerArgsError("--chunked-prefill-size must be -1 (off) or >= 1")
        if self.max_running_requests < 1:
            raise ServerArgsError("--max-running-requests must be >= 1")
        if self.max_prefill_tokens < 1:
            raise ServerArgsError("--max-prefill-tokens must be >= 1")
        if self.max_total_tokens is not None and self.max_total_tokens < self.page_size * 2:
            raise ServerArgsError("--max-total-tokens must hold at least two pages")
        if not 0 < self.mem_fraction_static < 1:
            raise ServerArgsError("--mem-fraction-static must be in (0, 1)")
        if self.request_timeout is not None and not 0 < self.request_timeout < float("inf"):
            raise ServerArgsError(f"--request-timeout must be a number of seconds > 0, got {self.request_timeout}")
        if self.context_length is not None and self.context_length < 2:
            raise ServerArgsError(f"--context-length must be >= 2, got {self.context_length}")
        if self.stream_interval < 1:
            raise ServerArgsError("--stream-interval must be >= 1")
        if self.decode_log_interval < 1:
            raise ServerArgsError("--decode-log-interval must be >= 1")
        if self.grammar_compile_timeout <= 0:
            raise ServerArgsError("--grammar-compile-timeout must be > 0")
        if self.speculative_algorithm is not None and self.speculative_algorithm.upper() not in SPECULATIVE_ALGORITHMS:
            raise ServerArgsError(f"--speculative-algorithm must be one of {', '.join(SPECULATIVE_ALGORITHMS)}, "
                                  f"got {self.speculative_algorithm!r}")
        if self.speculative_algorithm is None:
            changed = [f.name for f in dataclasses.fields(self) if f.name.startswith("speculative_")
                       and f.name != "speculative_algorithm" and getattr(self, f.name) != f.default]
            if changed:
                raise ServerArgsError(f"--{changed[0].replace('_', '-')} needs --speculative-algorithm NGRAM")
        if self.speculative_num_draft_tokens < 2:
            raise ServerArgsError(f"--speculative-num-draft-tokens must be >= 2, got {self.speculative_num_draft_tokens}")
        if self.shutdown_timeout is not None and not self.shutdown_timeout >= 0:
            raise ServerArgsError(f"--shutdown-timeout must be >= 0 seconds, got {self.shutdown_timeout}")
        if self.enable_mixed_chunk and self.speculative_algorithm is not None:
            raise ServerArgsError("--enable-mixed-chunk does not combine with --speculative-algorithm (its decode "
                                  "steps are verify steps of several tokens)")
        lo, hi = self.speculative_ngram_min_match_window_size, self.speculative_ngram_max_match_window_size
        if not 1 <= lo <= hi:
            raise ServerArgsError("--speculative-ngram-min-match-window-size must be >= 1 and <= "
                                  f"--speculative-ngram-max-match-window-size, got {lo} and {hi}")
        if not 1 <= self.port <= 65535:
            raise ServerArgsError(f"--port must be in 1..65535, got {self.port}")

    def _validate_deterministic(self) -> None:
        """``--enable-deterministic-inference`` takes the batch-invariant C++ kernels only (``kernel_backend``)."""
        if not self.enable_deterministic_inference:
            return
        if self.device not in ("auto", "cpu"):
            raise ServerArgsError("--enable-deterministic-inference runs on CPU only (batch-invariant C++ kernels); "
                                  f"got --device {self.device}")
        if self.quantization not in (None, "none"):
            raise ServerArgsError("--enable-deterministic-inference runs float weights (its GEMM is batch-invariant, "
                                  f"the quantized kernels are not); drop --quantization {self.quantization}")
        for kind in ("attention", "gemm", "elementwise"):
            value = getattr(self, f"{kind}_backend")
            if value not in ("auto", "cpu"):
                raise ServerArgsError(f"--enable-deterministic-inference needs --{kind}-backend cpu "
                                      f"(the batch-invariant kernel), got {value}")

    def quantization_method(self) -> Optional[str]:
        """``--quantization`` as given (None: resolved from the model path), but ``none`` under
        ``--enable-deterministic-inference`` (GGUF files then load dequantized)."""
        return "none" if self.enable_deterministic_inference else self.quantization

    def model_dtype(self) -> str:
        """``--dtype`` for the model and its KV cache; ``auto`` with weights kept quantized on CPU
        (``--quantization int8 | gguf``, or a GGUF file's default) means float32, where the quantized
        kernels compute in fp32 and bf16 activations would only add a conversion around every linear
        layer; but GGUF blocks on a CPU with AVX512-BF16 mean bfloat16, where the 4-bit decode kernel
        takes bf16 activations as they are (``kernels.quant.gemm.bf16_decode_preferred``)."""
        if self.dtype != "auto" or self.device == "cuda":
            return self.dtype
        from radixlm.srt.quantization import gguf_source

        method = self.quantization_method()
        is_gguf = method == "gguf" or (method is None and gguf_source(self.model_path) is not None)
        if method == "int8" or is_gguf:
            import torch

            if self.device == "cpu" or not torch.cuda.is_available():
                from radixlm.kernels.quant.gemm import bf16_decode_preferred
                from radixlm.srt.cpu_runtime import cpu_info

                capability = torch.backends.cpu.get_cpu_capability()
                return "bfloat16" if is_gguf and bf16_decode_preferred(cpu_info(), capability) else "float32"
        return "auto"

    def kernel_backend(self, kind: str) -> str:
        """The backend name to build for ``kind`` (attention, gemm or elementwise): the flag's value, or
        ``cpu`` for ``auto`` under ``--enable-deterministic-inference``."""
        value = getattr(self, f"{kind}_backend")
        return "cpu" if self.enable_deterministic_inference and value == "auto" else value

    def _validate_hicache(self) -> None:
        self.prefetch_policy()  # raises on a bad policy or extra config
        if not self.enable_hierarchical_cache:
            if self.hicache_storage_backend is not None:
                raise ServerArgsError("--hicache-storage-backend needs --enable-hierarchical-cache")
            return
        if self.disable_radix_cache:
            raise ServerArgsError("--enable-hierarchical-cache needs the radix cache (drop --disable-radix-cache)")
        if not 0 < self.hicache_ratio < float("inf"):
            raise ServerArgsError(f"--hicache-ratio must be > 0, got {self.hicache_ratio}")
        if not 0 < self.hicache_storage_max_gb < float("inf"):
            raise ServerArgsError(f"--hicache-storage-max-gb must be > 0, got {self.hicache_storage_max_gb}")

    def prefetch_policy(self) -> "PrefetchPolicy":
        """The storage prefetch policy from ``--hicache-storage-prefetch-policy`` and
        ``--hicache-storage-backend-extra-config``.

        Raises:
            ServerArgsError: an unknown policy, malformed JSON, an unknown key or a negative time.
        """
        from radixlm.srt.kv_prefetch import PREFETCH_POLICIES, PrefetchPolicy

        name = self.hicache_storage_prefetch_policy
        if name not in PREFETCH_POLICIES:
            raise ServerArgsError(f"--hicache-storage-prefetch-policy must be one of {', '.join(PREFETCH_POLICIES)}, "
                                  f"got {name!r}")
        extra: dict[str, Any] = {}
        if self.hicache_storage_backend_extra_config:
            try:
                extra = json.loads(self.hicache_storage_backend_extra_config)
            except ValueError as e:
                raise ServerArgsError(f"--hicache-storage-backend-extra-config is not JSON: {e}") from None
            if not isinstance(extra, dict):
                raise ServerArgsError("--hicache-storage-backend-extra-config must be a JSON object")
        keys = {"prefetch_timeout_base": "timeout_base", "prefetch_timeout_per_ki_token": "timeout_per_ki_token",
                "prefetch_timeout_max": "timeout_max"}
        unknown = sorted(set(extra) - set(keys))
        if unknown:
            raise ServerArgsError(f"--hicache-storage-backend-extra-config: unknown key(s) {', '.join(unknown)}; "
                                  f"expected {', '.join(keys)}")
        values: dict[str, float] = {}
        for k, v in extra.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < float("inf"):
                raise ServerArgsError(f"--hicache-storage-backend-extra-config: {k} must be a number of seconds >= 0, "
                                      f"got {v!r}")
            values[keys[k]] = float(v)
        return PrefetchPolicy(name, **values)

    def _validate_dp(self) -> None:
        if self.load_balance_method not in LOAD_BALANCE_METHODS:
            raise ServerArgsError(f"--load-balance-method must be one of {', '.join(LOAD_BALANCE_METHODS)}, "
                                  f"got {self.load_balance_method!r}")
        if self.dp_size < 1:
            raise ServerArgsError(f"--dp-size must be >= 1, got {self.dp_size}")
        if self.dp_size > 1 and self.nnodes > 1:
            raise ServerArgsError("--dp-size > 1 with --nnodes > 1 is not supported yet (multi-node runs one replica "
                                  "whose TP ranks span the nodes)")
        if not 0 <= self.router_cache_threshold <= 1:
            raise ServerArgsError(f"--router-cache-threshold must be in [0, 1], got {self.router_cache_threshold}")
        if self.router_balance_abs_threshold < 0:
            raise ServerArgsError(f"--router-balance-abs-threshold must be >= 0, got {self.router_balance_abs_threshold}")
        if not 1 <= self.router_balance_rel_threshold < float("inf"):
            raise ServerArgsError(f"--router-balance-rel-threshold must be >= 1, got {self.router_balance_rel_threshold}")
        if self.router_max_tree_size is not None and self.router_max_tree_size < 1:
            raise ServerArgsError(f"--router-max-tree-size must be >= 1, got {self.router_max_tree_size}")

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> "ServerArgs":
        """Build from keyword arguments (the offline Engine's form); unknown names and values of the
        wrong type (``max_total_tokens="100"``) are ``ServerArgsError``s."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise ServerArgsError(f"unknown server argument(s): {', '.join(unknown)}")
        hints = get_type_hints(cls)
        for name, value in kwargs.items():
            typ = hints[name]
            base = _base_type(typ)
            if value is None and base is not typ:
                continue  # Optional: None is the default's meaning
            if base is str and isinstance(value, os.PathLike):
                value = kwargs[name] = os.fspath(value)  # a pathlib.Path for a path
            ok = isinstance(value, bool) if base is bool else (
                isinstance(value, (int, float)) and not isinstance(value, bool) if base is float else
                isinstance(value, base) and not isinstance(value, bool) if base is int else isinstance(value, base))
            if not ok:
                raise ServerArgsError(f"{name} must be {'an' if base is int else 'a'} {base.__name__}, got "
                                      f"{type(value).__name__} {value!r}")
        args = cls(**kwargs)
        args.validate()
        return args

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        """Add one ``--flag-name`` per field, typed from the field's annotation."""
        hints = get_type_hints(cls)
        for f in dataclasses.fields(cls):
            flag = "--" + f.name.replace("_", "-")
            typ = hints[f.name]
            help_text = f.metadata.get("help", "")
            if typ is bool:
                parser.add_argument(flag, action="store_true", default=f.default, help=help_text)
                continue
            base = _base_type(typ)
            # The help text may say its own default (e.g. "default: the model's"); None says nothing.
            if f.default is not None and "default" not in help_text:
                help_text = f"{help_text} (default: {f.default})"
            parser.add_argument(flag, type=base, default=f.default, help=help_text)

    @classmethod
    def from_cli_args(cls, ns: argparse.Namespace) -> "ServerArgs":
        args = cls(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(cls)})
        args.validate()
        return args

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("api_key", None)  # never echo the secret
        return d


def _base_type(typ: Any) -> type:
    args = getattr(typ, "__args__", None)
    if args:  # Optional[X]
        return next(a for a in args if a is not type(None))
    return typ
