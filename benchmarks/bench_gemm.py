"""Linear-layer GEMM backends side by side on a model's real layer shapes.

For each row count M (the tokens of a step: 1 = batch-1 decode, 32-64 = batched decode, 512 =
prefill) it runs every linear of every decoder layer once, in order, with each backend
(``kernels/gemm``: torch_native = ``F.linear``, onednn = oneDNN's prepacked weights, cpu = radixlm's
packed-panel C++ kernel), so the weights stream from memory as in a real step (the whole set is
far larger than the caches). Reports the best of ``--repeats`` passes: wall and process-CPU
milliseconds and GFLOP/s; prints a table and writes JSON.

    python benchmarks/bench_gemm.py --rows 1 32 64 512 --threads 2
    python benchmarks/bench_gemm.py --rows 1 32 64 --backends onednn cpu --dtype bfloat16
    python benchmarks/bench_gemm.py --hidden 576 --intermediate 1536 --heads 9 --kv-heads 3 --layers 30

Defaults are SmolLM2-135M's shapes. On a shared machine, CPU time per FLOP is the steadier figure.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch


def layer_shapes(hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int) -> list[tuple[int, int]]:
    """(out, in) of qkv, o, gate_up, down."""
    qkv = (heads + 2 * kv_heads) * head_dim
    return [(qkv, hidden), (hidden, heads * head_dim), (2 * intermediate, hidden), (hidden, intermediate)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 64, 512])
    ap.add_argument("--backends", nargs="+", default=["torch_native", "onednn", "cpu"])
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--intermediate", type=int, default=1536)
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="weights and activations")
    ap.add_argument("--output", default="bench_results/bench_gemm.json")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from radixlm.kernels.gemm import create_gemm_backend

    dtype = getattr(torch, args.dtype)
    shapes = layer_shapes(args.hidden, args.intermediate, args.heads, args.kv_heads, args.head_dim) * args.layers
    g = torch.Generator().manual_seed(0)
    dense = [(torch.randn(n, k, generator=g) * 0.02).to(dtype) for n, k in shapes]
    rows_out = []
    for name in args.backends:
        gemm = create_gemm_backend(name, torch.device("cpu"), dtype)
        weights = [gemm.prepare(w.clone()) for w in dense]
        for m in args.rows:
            xs = {k: torch.randn(m, k, generator=g).to(dtype) for k in {k for _, k in shapes}}

            def run() -> None:
                for (_, k), w in zip(shapes, weights):
                    gemm.linear(xs[k], w)

            run()
            wall, cpu = float("inf"), float("inf")
            for _ in range(args.repeats):
                t, c = time.perf_counter(), time.process_time()
                run()
                wall, cpu = min(wall, time.perf_counter() - t), min(cpu, time.process_time() - c)
            flops = sum(2 * m * n * k for n, k in shapes)
            rows_out.append({"backend": gemm.name, "rows": m, "wall_ms": 1000 * wall, "cpu_ms": 1000 * cpu,
                             "gflop_s_wall": flops / wall / 1e9, "gflop_s_cpu": flops / cpu / 1e9})
        del weights
    load = os.getloadavg()
    print(f"{len(shapes)} linears ({sum(n * k for n, k in shapes) * dense[0].element_size() / 1e6:.0f} MB {args.dtype}), threads {torch.get_num_threads()}, "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"{'backend':>13} {'rows':>5} {'wall ms':>9} {'cpu ms':>9} {'GFLOP/s wall':>13} {'GFLOP/s cpu':>12}")
    for r in rows_out:
        print(f"{r['backend']:>13} {r['rows']:>5} {r['wall_ms']:>9.1f} {r['cpu_ms']:>9.1f} {r['gflop_s_wall']:>13.1f} "
              f"{r['gflop_s_cpu']:>12.1f}")
    os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
    with open(args.output, "w") as f:
        json.dump({"threads": torch.get_num_threads(), "dtype": args.dtype, "load_average": load, "rows": rows_out}, f, indent=1)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
