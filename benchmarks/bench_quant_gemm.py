"""Linear-layer kernels at SmolLM2-135M's shapes: fp32 vs weights kept quantized, per call.

For each (N, K) shape of the model (qkv, o, gate_up, down, LM head) and rows M, the median time of
y = x W^T with:

- ``fp32``: ``F.linear`` on the dense weight; ``onednn``: the prepacked oneDNN linear (radixlm's fp32
  default on CPU);
- ``int8``, ``q8_0``, ``q4_0``, ``q4_1``: radixlm's C++ kernel (``torch.ops.radixlm_cpu.quant_linear``)
  with 8-bit activations, the same with an ``f`` (``q4_1f``): fp32 activations, with a ``p``
  (``q4_1p``): ``quant_linear_panels`` (the batched path: panels unpacked into the fp32 microkernel),
  and ``deq+mm`` (dequantize the Q4_1 weight, then ``F.linear``: the batched path before panels);
- ``cpu``: radixlm's fp32 packed-panel GEMM (the fp32 default);
- ``torch_int8``: ``torch._weight_int8pack_mm`` (torch's weight-only int8 CPU kernel, per-channel
  scales) and ``torch_int4``: ``torch._weight_int4pack_mm_for_cpu`` (group size 32), when this torch has them.

It prints a table (µs per call; and, for M = 1, the weight bytes read per second) and writes JSON; the
"model" rows sum one decode step's linears (30 layers + LM head). Speed depends on the machine and its
load: quote ``uptime`` with any number.

    python benchmarks/bench_quant_gemm.py --ms 1 4 8 16 32 64
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
import torch.nn.functional as F

from common import print_table, write_json

from radixlm.kernels.cpu_extension import load_cpu_kernels
from radixlm.kernels.quant.formats import get_format, quantize_int8

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536), "lm_head": (49152, 576)}
LAYERS = 30


def timed(fn, seconds: float) -> float:
    fn()
    times, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 5:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def kernels_for(w: torch.Tensor):
    """name -> (fn(x) -> y, weight bytes)"""
    import gguf

    ops = torch.ops.radixlm_cpu
    n, k = w.shape
    out = {"fp32": (lambda x: F.linear(x, w), w.numel() * 4)}
    packed_w = torch.ops.mkldnn._reorder_linear_weight(w)
    out["onednn"] = (lambda x: torch.ops.mkldnn._linear_pointwise(x, packed_w, None, "none", [], ""), w.numel() * 4)
    panels_w = ops.pack_linear_weight(w)
    out["cpu"] = (lambda x: ops.linear_packed(x, panels_w, None), w.numel() * 4)  # radixlm's fp32 default
    types = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0,
             "q4_1": gguf.GGMLQuantizationType.Q4_1}
    for fmt in ("int8", "q8_0", "q4_0", "q4_1"):
        packed = quantize_int8(w) if fmt == "int8" else torch.from_numpy(
            np.ascontiguousarray(gguf.quants.quantize(w.numpy(), types[fmt])))
        code = get_format(fmt).code
        out[fmt] = (lambda x, p=packed, c=code: ops.quant_linear(x, p, c, k, True), packed.numel())
        out[fmt + "f"] = (lambda x, p=packed, c=code: ops.quant_linear(x, p, c, k, False), packed.numel())
        out[fmt + "p"] = (lambda x, p=packed, c=code: ops.quant_linear_panels(x, p, c, k, None), packed.numel())
        if fmt == "q4_1":
            out["deq+mm"] = (lambda x, p=packed, c=code: F.linear(x, ops.quant_dequantize(p, c, k)), packed.numel())
    if hasattr(torch, "_weight_int8pack_mm"):
        scale = w.abs().amax(dim=1) / 127
        q8 = torch.round(w / scale[:, None]).to(torch.int8)
        out["torch_int8"] = (lambda x: torch._weight_int8pack_mm(x, q8, scale), q8.numel())
    if hasattr(torch, "_weight_int4pack_mm_for_cpu"):
        try:
            g = 32
            wg = w.reshape(n, k // g, g)
            lo, hi = wg.amin(-1), wg.amax(-1)
            sc = ((hi - lo) / 15).clamp(min=1e-8)
            q = torch.round((wg - lo[..., None]) / sc[..., None]).clamp(0, 15).to(torch.int32).reshape(n, k)
            zeros = lo + 8 * sc  # torch's int4 dequant: (q - 8) * scale + zero
            sz = torch.stack([sc, zeros], dim=-1).transpose(0, 1).contiguous()  # (k/g, n, 2)
            packed4 = torch._convert_weight_to_int4pack_for_cpu(q, 2)
            torch._weight_int4pack_mm_for_cpu(torch.randn(1, k), packed4, g, sz)
            out["torch_int4"] = (lambda x: torch._weight_int4pack_mm_for_cpu(x, packed4, g, sz), n * k // 2)
        except (RuntimeError, TypeError) as e:
            print(f"torch int4 kernel unavailable: {e}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ms", type=int, nargs="+", default=[1, 4, 8, 16, 32, 64])
    ap.add_argument("--seconds", type=float, default=0.3, help="time per (shape, M, kernel)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--output", default="bench_results/bench_quant_gemm.json")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    load_cpu_kernels()
    torch.manual_seed(0)
    rows, per_model = [], {}
    with torch.inference_mode():
        for shape, (n, k) in SHAPES.items():
            w = torch.randn(n, k) * 0.05
            kernels = kernels_for(w)
            for m in args.ms:
                x = torch.randn(m, k)
                row = {"shape": f"{shape} {n}x{k}", "M": m}
                for name, (fn, nbytes) in kernels.items():
                    t = timed(lambda: fn(x), args.seconds)
                    row[name] = 1e6 * t
                    per_model[(name, m)] = per_model.get((name, m), 0.0) + t * (1 if shape == "lm_head" else LAYERS)
                    if m == 1:
                        row[f"{name}_GB/s"] = nbytes / t / 1e9
                rows.append(row)
    names = list(kernels)
    model_rows = [{"shape": "model step (ms)", "M": m, **{nm: 1e3 * per_model[(nm, m)] for nm in names}} for m in args.ms]
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, load average {os.getloadavg()}")
    print("µs per call (model step rows: ms for 30 layers + LM head)")
    print_table(rows + model_rows, ["shape", "M", *names])
    print("M = 1, weight bytes read per second (GB/s)")
    print_table([r for r in rows if r["M"] == 1], ["shape", *[f"{nm}_GB/s" for nm in names]])
    write_json(args.output, {"benchmark": "bench_quant_gemm", "threads": torch.get_num_threads(),
                             "load_average": os.getloadavg(), "rows": rows, "model_rows": model_rows})


if __name__ == "__main__":
    main()
