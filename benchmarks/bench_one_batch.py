"""Static-batch latency of the engine: one prefill of the whole batch, then decode steps.

Drives the Scheduler in-process (no HTTP), like SGLang's ``bench_one_batch``: for each batch size ×
input length × output length it reports prefill throughput, decode throughput and the scheduler's
per-step CPU overhead of the scheduler and runner (step time minus the model's forward itself:
batch building, KV allocation, attention metadata, sampling, result processing).

It also measures this machine's matmul peak in the same run, in each dtype the rows ran (a square
``torch.mm`` and a decode-shaped one; quantized rows compute in fp32, so their peak is fp32's) and
reports the decode's model FLOP/s against the peak of the row's dtype: FLOPs per token = 2 × (the
linear layers' and lm_head's parameters) + 4 × layers × heads × head_dim × (attended context).
A decode step must also read every weight and the attended KV cache at least once, so it measures the
memory read bandwidth too (``torch.sum`` over 1 GiB) and gives each row its roofline (Williams et al.
2009): ``roofline_ms`` = max(those bytes at that bandwidth, the step's FLOPs at the peak),
``roofline_pct_of_peak`` = the best share of the peak such a step can reach on this machine, and
``pct_of_roofline`` = roofline_ms / decode_step_ms (how close the step came to it).

    python benchmarks/bench_one_batch.py --model stories260k --batch-sizes 1 8 32 --input-lens 128 --output-lens 32
    python benchmarks/bench_one_batch.py --model smollm2 --batch-sizes 1 32 --input-lens 128 --output-lens 32
    python benchmarks/bench_one_batch.py --model smollm2 --quantizations none int8 gguf --batch-sizes 1 8 32

``--quantizations`` runs one engine per ``--quantization`` value (``gguf``: the demo model's Q4_1 blocks
kept; needs ``--model smollm2`` or a .gguf path); ``none`` is the float reference.
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from common import print_table, random_ids, resolve_model, write_json

from radixlm.managers.io_struct import TokenizedGenerateReq
from radixlm.srt.cpu_runtime import tune_malloc
from radixlm.srt.engine import Engine
from radixlm.srt.kv_pool import KVPool
from radixlm.srt.sampling_params import SamplingParams


def run_case(engine: Engine, bs: int, in_len: int, out_len: int, seed: int) -> dict:
    sched = engine.scheduler
    engine.flush_cache()
    rng = random.Random(seed)
    vocab = engine.model_config.vocab_size
    params = SamplingParams(temperature=0, max_new_tokens=out_len, min_new_tokens=out_len)
    for i in range(bs):
        sched.add_request(TokenizedGenerateReq(rid=f"b{i}", input_ids=random_ids(rng, in_len, vocab), sampling_params=params))
    t0 = time.perf_counter()
    while sched.chunked_req is not None or sched.waiting:  # prefill (possibly several extend steps)
        sched.step()
    t1 = time.perf_counter()
    timing0 = dict(sched.timing)
    runner = engine.worker.model_runner
    model0 = runner.model_time_s
    steps = 0
    while sched.step():
        steps += 1
    t2 = time.perf_counter()
    engine._outbox.clear()
    dt = sched.timing["step_s"] - timing0["step_s"]
    model_s = runner.model_time_s - model0  # the model's forward alone: the rest is scheduler + runner overhead
    nsteps = max(sched.timing["steps"] - timing0["steps"], 1)
    return {"batch": bs, "input_len": in_len, "output_len": out_len,
            "prefill_s": t1 - t0, "prefill_tok_s": bs * in_len / (t1 - t0),
            "decode_s": t2 - t1, "decode_tok_s": bs * (out_len - 1) / max(t2 - t1, 1e-9),
            "decode_step_ms": 1000 * dt / nsteps, "overhead_ms_per_step": 1000 * (dt - model_s) / nsteps}


def matmul_peak_gflops(m: int, k: int, n: int, seconds: float = 1.0, dtype: torch.dtype = torch.float32) -> float:
    """GFLOP/s of ``torch.mm`` (m, k) @ (k, n) in ``dtype``, best of repeated runs over ~``seconds``."""
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    torch.mm(a, b)
    best, end = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * m * k * n / best / 1e9


def linear_modules(engine: Engine) -> list:
    """The model's linears and LM head: the modules whose weights a gemm backend prepared."""
    return [m for m in engine.worker.model_runner.model.modules() if hasattr(m, "process_weights_after_loading")]


def decode_flops_per_token(engine: Engine, context: float) -> float:
    """Model FLOPs of one decode token at an attended context of ``context`` tokens."""
    # logical weights of the linears and the LM head (a quantized weight's tensor holds bytes, not weights)
    # (the cpu backend's packed weights are (out / 16, in, 16): numel is still out x in)
    linear = sum((m.weight.shape[0] * m.gemm.in_features) if hasattr(m.gemm, "in_features") else m.weight.numel()
                 for m in linear_modules(engine))
    cfg = engine.model_config
    attn = 4 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * context
    return 2 * linear + attn


def decode_bytes_per_step(engine: Engine, batch: int, context: float) -> float:
    """Bytes a decode step must read at least once: every linear's and the LM head's weights as stored
    (packed, bf16, fp32 or quantized blocks) and the attended KV cache (K and V of ``context`` tokens
    per request, every layer, in the pool's dtype)."""
    runner, cfg = engine.worker.model_runner, engine.model_config
    weights = sum(m.weight.numel() * m.weight.element_size() for m in linear_modules(engine))
    kv_per_token = KVPool.bytes_per_token(cfg.num_hidden_layers, runner.num_kv_heads, cfg.head_dim, runner.dtype)
    return weights + batch * context * kv_per_token


def read_bandwidth_gb_s(mib: int = 1024, seconds: float = 1.0) -> float:
    """GB/s of a plain ``torch.sum`` over ``mib`` MiB of fp32 (far larger than any cache): the rate at
    which this machine's threads read memory, best of repeated runs over ~``seconds``."""
    x = torch.ones(mib * (1 << 20) // 4)
    x.sum()
    best, end = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t0)
    return mib * (1 << 20) / best / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="stories260k", help="stories260k | smollm2 | a path")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--input-lens", type=int, nargs="+", default=[128, 512])
    ap.add_argument("--output-lens", type=int, nargs="+", default=[32])
    ap.add_argument("--page-size", type=int, default=1)
    ap.add_argument("--attention-backends", nargs="+", default=["auto"],
                    help="one engine per backend, rows side by side (e.g. cpu torch_native)")
    ap.add_argument("--gemm-backends", nargs="+", default=["auto"], help="likewise for the linear layers")
    ap.add_argument("--elementwise-backends", nargs="+", default=["auto"],
                    help="likewise for RMSNorm/RoPE/SiLU-and-mul (e.g. cpu torch_native)")
    ap.add_argument("--quantizations", nargs="+", default=["default"],
                    help="likewise for --quantization: none | int8 | gguf | default (the model's default)")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--output", default="bench_results/bench_one_batch.json")
    args = ap.parse_args()
    tune_malloc()  # as the server's scheduler process does (radixlm.srt.cpu_runtime.tune_malloc)
    if args.threads:
        torch.set_num_threads(args.threads)
    max_bs = max(args.batch_sizes)
    max_tokens = max_bs * (max(args.input_lens) + max(args.output_lens)) + 1024
    rows = []
    combos = [(a, g, e, q) for a in args.attention_backends for g in args.gemm_backends
              for e in args.elementwise_backends for q in args.quantizations]
    for attn, gemm, elementwise, quant in combos:
        engine = Engine(resolve_model(args.model), max_total_tokens=max_tokens, max_running_requests=max_bs,
                        chunked_prefill_size=-1, max_prefill_tokens=max_tokens, page_size=args.page_size,
                        attention_backend=attn, gemm_backend=gemm, elementwise_backend=elementwise,
                        dtype=args.dtype, quantization=None if quant == "default" else quant)
        runner = engine.worker.model_runner
        names = {"attention": runner.attn_backend.name, "gemm": runner.gemm_backend.name,
                 "elementwise": runner.elementwise_backend.name, "dtype": str(runner.dtype).removeprefix("torch."),
                 "quantization": runner.quantization.method}
        run_case(engine, 1, 16, 4, args.seed)  # warm-up
        for bs in args.batch_sizes:
            for i in args.input_lens:
                for o in args.output_lens:
                    r = {**names, **run_case(engine, bs, i, o, args.seed)}
                    r["flops_per_token"] = decode_flops_per_token(engine, i + o / 2)
                    r["bytes_per_step"] = decode_bytes_per_step(engine, bs, i + o / 2)
                    rows.append(r)
        del engine, runner
    def peak_dtype(r: dict) -> str:
        return "float32" if r["quantization"] not in ("none", None) else r["dtype"]

    peaks = {dt: (matmul_peak_gflops(2048, 2048, 2048, dtype=getattr(torch, dt)),
                  matmul_peak_gflops(64, 576, 1536, dtype=getattr(torch, dt)))
             for dt in sorted({peak_dtype(r) for r in rows})}
    bandwidth = read_bandwidth_gb_s()
    for r in rows:
        flops_per_step = r["batch"] * r["flops_per_token"]
        r["model_gflop_s"] = r["decode_tok_s"] * r.pop("flops_per_token") / 1e9
        peak = peaks[peak_dtype(r)][0]
        r["pct_of_peak"] = 100 * r["model_gflop_s"] / peak
        # Roofline (Williams et al. 2009): a step takes at least max(its bytes at the read bandwidth, its
        # FLOPs at the peak); the best share of the peak a step can reach here, and how close it came.
        floor_s = max(r["bytes_per_step"] / (bandwidth * 1e9), flops_per_step / (peak * 1e9))
        r["roofline_ms"] = 1000 * floor_s
        r["roofline_pct_of_peak"] = 100 * flops_per_step / floor_s / (peak * 1e9)
        r["pct_of_roofline"] = 100 * r["roofline_ms"] / r["decode_step_ms"]
    for dt, (peak, peak_decode_shape) in peaks.items():
        print(f"{dt} matmul peak: {peak:.1f} GFLOP/s (2048^3), {peak_decode_shape:.1f} GFLOP/s (64x576x1536); "
              f"torch threads {torch.get_num_threads()}")
    print(f"memory read bandwidth: {bandwidth:.1f} GB/s (torch.sum over 1 GiB); roofline_ms = max(weights + KV "
          "read at that rate, FLOPs at the peak)")
    print_table(rows, ["attention", "gemm", "elementwise", "dtype", "quantization", "batch", "input_len", "output_len", "prefill_tok_s", "decode_tok_s", "decode_step_ms",
                       "overhead_ms_per_step", "model_gflop_s", "pct_of_peak", "roofline_ms", "roofline_pct_of_peak",
                       "pct_of_roofline"])
    write_json(args.output, {"benchmark": "bench_one_batch", "model": args.model, "page_size": args.page_size,
                             "threads": torch.get_num_threads(),
                             "matmul_peak_gflop_s": {dt: p[0] for dt, p in peaks.items()},
                             "matmul_decode_shape_gflop_s": {dt: p[1] for dt, p in peaks.items()},
                             "read_bandwidth_gb_s": bandwidth, "rows": rows})


if __name__ == "__main__":
    main()
