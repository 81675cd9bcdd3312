"""Offline throughput on SGLang's generated-shared-prefix workload: radixlm with the radix cache on
and off, and transformers ``generate`` on the same prompts, in one run (ratios, not absolutes).

Workload: G groups × P prompts; each prompt = a group's shared S-token system prefix + its own
Q-token question; O greedy output tokens (EOS ignored, so every system produces exactly O).

    python benchmarks/bench_offline.py --model stories260k            # 8 × 16, S=512, Q=32, O=32
    python benchmarks/bench_offline.py --model smollm2 --groups 2 --prompts 8
"""

from __future__ import annotations

import argparse
import random
import time

from common import hf_generate, load_hf_model, print_table, random_ids, resolve_model, write_json

from radixlm.srt.engine import Engine


def build_prompts(seed: int, groups: int, per_group: int, sys_len: int, q_len: int, vocab: int) -> list[list[int]]:
    rng = random.Random(seed)
    prompts = []
    for _ in range(groups):
        prefix = random_ids(rng, sys_len, vocab)
        prompts += [prefix + random_ids(rng, q_len, vocab) for _ in range(per_group)]
    return prompts


def run_radixlm(path, prompts, out_len, **kwargs) -> dict:
    engine = Engine(path, **kwargs)
    sp = {"temperature": 0, "max_new_tokens": out_len, "ignore_eos": True}
    engine.generate(input_ids=prompts[:1], sampling_params={**sp, "max_new_tokens": 2})  # warm-up
    engine.flush_cache()
    t0 = time.perf_counter()
    outs = engine.generate(input_ids=prompts, sampling_params=sp)
    dt = time.perf_counter() - t0
    cached = sum(o["meta_info"]["cached_tokens"] for o in outs)
    return {"seconds": dt, "cache_hit_rate": cached / sum(map(len, prompts)),
            "outputs": [o["output_ids"] for o in outs]}


def run_transformers(path, prompts, out_len, batch_size: int) -> dict:
    model = load_hf_model(path)
    outs = []
    t0 = time.perf_counter()
    for i in range(0, len(prompts), batch_size):
        outs += hf_generate(model, prompts[i:i + batch_size], out_len)
    return {"seconds": time.perf_counter() - t0, "cache_hit_rate": 0.0, "outputs": outs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="stories260k")
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=16, help="prompts per group")
    ap.add_argument("--system-len", type=int, default=512)
    ap.add_argument("--question-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--hf-batch-size", type=int, default=16)
    ap.add_argument("--max-running-requests", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-transformers", action="store_true")
    ap.add_argument("--output", default="bench_results/bench_offline.json")
    args = ap.parse_args()
    from radixlm.srt.model_loader import resolve_model_path

    path = resolve_model_path(resolve_model(args.model))
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(path).vocab_size
    prompts = build_prompts(args.seed, args.groups, args.prompts, args.system_len, args.question_len, vocab)
    n_out = len(prompts) * args.output_len
    kw = dict(max_running_requests=args.max_running_requests, max_total_tokens=len(prompts) * (args.system_len + args.question_len + args.output_len) + 4096,
              chunked_prefill_size=2048, max_prefill_tokens=8192)
    results = {"radixlm (radix cache)": run_radixlm(path, prompts, args.output_len, **kw),
               "radixlm (no cache)": run_radixlm(path, prompts, args.output_len, disable_radix_cache=True, **kw)}
    if not args.skip_transformers:
        results["transformers generate"] = run_transformers(path, prompts, args.output_len, args.hf_batch_size)
    base = results["radixlm (radix cache)"]["seconds"]
    rows = [{"system": name, "seconds": r["seconds"], "output_tok_s": n_out / r["seconds"],
             "cache_hit_rate": r["cache_hit_rate"], "time_vs_radix": r["seconds"] / base} for name, r in results.items()]
    print(f"{len(prompts)} prompts ({args.groups} groups x {args.prompts}), prefix {args.system_len}, "
          f"question {args.question_len}, output {args.output_len}, model {args.model}")
    print_table(rows, ["system", "seconds", "output_tok_s", "cache_hit_rate", "time_vs_radix"])
    ref = results["radixlm (radix cache)"]["outputs"]
    agree = {name: sum(a == b for a, b in zip(ref, r["outputs"])) / len(ref) for name, r in results.items()}
    print("greedy outputs identical to radixlm (radix cache):", {k: f"{v:.0%}" for k, v in agree.items()})
    write_json(args.output, {"benchmark": "bench_offline", "model": args.model, "args": vars(args), "rows": rows,
                             "identical_outputs": agree})


if __name__ == "__main__":
    main()
