"""Hierarchical KV cache benchmark: bench_serving's multi-turn dataset against radixlm with a device KV
pool several times smaller than the workload's working set, with the cache tiers off and on.

Configurations (one server each, started and stopped here, same flags otherwise):

- ``radix``: the radix tree alone (``--max-total-tokens`` = the small pool);
- ``radix-large``: the radix tree alone with the device pool grown by the host pool's size
  (``pool * (1 + ratio)``): what the same memory does without tiers on a CPU, where both are RAM;
- ``host``: ``--enable-hierarchical-cache --hicache-ratio R`` (host tier);
- ``host+file``: plus ``--hicache-storage-backend file`` in a fresh folder;
- ``restart``: a new server on the same storage folder runs the workload again: the first turns,
  which no radix tree or host pool of this process has seen, come from storage.

Reports, per configuration: the cache hit rate (all turns, and turns after the first = the second
and later visits of each conversation), the hit rate per tier, TTFT (mean / median, ms; all and later
turns), duration and output throughput; prints a table and writes JSON (``--output``).

    python benchmarks/bench_hicache.py --model-path <folder or .gguf> --max-total-tokens 512
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional


def _load_sibling(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"_radixlm_bench_{name}", Path(__file__).with_name(f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = mod  # type: ignore[union-attr]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def summarize(result: dict, state: dict) -> dict[str, Optional[float]]:
    """The table row of one configuration from bench_serving's result and the server's final state."""
    m = result["metrics"]
    reqs = [r for r in result["requests"] if r["success"]]
    later = [r for r in reqs if (r.get("turn") or 0) > 0]

    def hit(rs: list[dict], tier: Optional[str] = None) -> Optional[float]:
        prompt = sum(r["prompt_len"] for r in rs)
        if not prompt:
            return None
        if tier is None:
            return sum(r["cached_tokens"] or 0 for r in rs) / prompt
        return sum((r["cached_tokens_details"] or {}).get(tier, 0) for r in rs) / prompt

    def ms(rs: list[dict], median: bool = False) -> Optional[float]:
        vals = sorted(r["ttft"] * 1000 for r in rs if r["ttft"])
        if not vals:
            return None
        return vals[len(vals) // 2] if median else sum(vals) / len(vals)

    h = state.get("hicache") or {}
    return {"requests": len(reqs), "hit_rate": hit(reqs), "hit_rate_later_turns": hit(later),
            "later_from_device": hit(later, "device") if h else None,
            "later_from_host": hit(later, "host") if h else None,
            "later_from_storage": hit(later, "storage") if "storage_files" in h else None,
            "all_from_storage": hit(reqs, "storage") if "storage_files" in h else None,
            "mean_ttft_ms": m["mean_ttft_ms"], "median_ttft_ms": m["median_ttft_ms"],
            "mean_ttft_later_turns_ms": ms(later), "median_ttft_later_turns_ms": ms(later, True),
            "duration_s": m["duration_s"], "output_throughput": m["output_throughput"],
            "hicache_load_s": h.get("load_seconds"), "hicache_save_s": h.get("save_seconds"),
            "loaded_tokens": (h.get("loaded_host_tokens", 0) + h.get("loaded_storage_tokens", 0)) if h else None,
            "retractions": state.get("num_retractions")}


def main(argv: Optional[list[str]] = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path", default=None, help="default: the demo model (SmolLM2-135M)")
    ap.add_argument("--tokenizer", default=None, help="bench_serving's --tokenizer (default: the model)")
    ap.add_argument("--max-total-tokens", type=int, default=512, help="the small device KV pool (tokens)")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--hicache-ratio", type=float, default=8.0)
    ap.add_argument("--hicache-write-policy", default="write_through")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--mt-conversations", type=int, default=8)
    ap.add_argument("--mt-turns", type=int, default=4)
    ap.add_argument("--mt-turn-len", type=int, nargs=2, default=[32, 64])
    ap.add_argument("--mt-output-len", type=int, default=16)
    ap.add_argument("--max-concurrency", type=int, default=1)
    ap.add_argument("--configs", default="radix,radix-large,host,host+file,restart")
    ap.add_argument("--output", default="bench_results/bench_hicache.json")
    args = ap.parse_args(argv)
    bench = _load_sibling("bench_serving")
    common = _load_sibling("common")

    model = args.model_path
    if model is None:
        from radixlm.srt.model_loader import resolve_model_path

        model = resolve_model_path(None)  # converts the demo GGUF once, before any server starts
    base = ["--model-path", model, "--max-total-tokens", str(args.max_total_tokens), "--page-size", str(args.page_size),
            "--dtype", args.dtype, "--log-level", "warning"]
    hicache = ["--enable-hierarchical-cache", "--hicache-ratio", str(args.hicache_ratio),
               "--hicache-write-policy", args.hicache_write_policy]
    storage_dir = tempfile.mkdtemp(prefix="bench_hicache_storage_")
    large = list(base)
    large[large.index("--max-total-tokens") + 1] = str(int(args.max_total_tokens * (1 + args.hicache_ratio)))
    flags = {"radix": base, "radix-large": large, "host": base + hicache,
             "host+file": base + hicache + ["--hicache-storage-backend", "file", "--hicache-storage-dir", storage_dir],
             "restart": base + hicache + ["--hicache-storage-backend", "file", "--hicache-storage-dir", storage_dir]}
    rows, raw = [], {}
    for label in args.configs.split(","):
        server = common.Server(flags[label], log_prefix="bench_hicache_")
        try:
            bargs = ["--backend", "radixlm", "--base-url", f"{label}={server.url}", "--tokenizer", args.tokenizer or model,
                     "--dataset-name", "multi-turn", "--mt-conversations", str(args.mt_conversations),
                     "--mt-turns", str(args.mt_turns), "--mt-turn-len", *map(str, args.mt_turn_len),
                     "--mt-output-len", str(args.mt_output_len), "--max-concurrency", str(args.max_concurrency),
                     "--disable-tqdm", "--output", os.path.join(tempfile.gettempdir(), f"bench_hicache_{os.getpid()}.json")]
            result = bench.main(bargs)["targets"][0]
            state = server.state()
        finally:
            server.stop()
        raw[label] = {"metrics": result["metrics"], "requests": result["requests"], "state": state}
        rows.append({"config": label, **summarize(result, state)})
    cols = ["config", "hit_rate", "hit_rate_later_turns", "later_from_device", "later_from_host", "later_from_storage",
            "all_from_storage", "mean_ttft_ms", "median_ttft_ms", "mean_ttft_later_turns_ms",
            "median_ttft_later_turns_ms", "duration_s", "output_throughput", "hicache_load_s", "hicache_save_s",
            "loaded_tokens", "retractions"]
    return common.report("bench_hicache", args, model, rows, cols, raw)


if __name__ == "__main__":
    main()
