"""Data-parallel routing benchmark: bench_serving's generated-shared-prefix workload (several groups of
prompts sharing a long system prompt) against one replica and two, routed different ways.

Configurations (started and stopped here, one at a time, same model and flags otherwise):

- ``dp1``: one replica (``--dp-size 1``), all the cores;
- ``dp2-cache_aware``: ``--dp-size 2`` (each replica gets half the cores), the default routing;
- ``dp2-round_robin``: ``--dp-size 2 --load-balance-method round_robin``;
- ``sglang-router``: SGLang's router (``python -m sglang_router.launch_router --policy cache_aware``, the
  ``sglang-router`` package) in front of two ``--dp-size 1`` servers with half the cores each; skipped
  when the package is not installed.

Reports per configuration: cache hit rate (cached / prompt tokens, from every response's
``meta_info.cached_tokens``), TTFT (mean / median, ms), output and request throughput, duration, and
the prompt tokens each replica processed. Prints a table and writes JSON (``--output``).

    python benchmarks/bench_dp.py --model-path stories260k --gsp-num-groups 8 --gsp-prompts-per-group 4
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import httpx


def _load_sibling(name: str) -> Any:
    mod_name = f"_radixlm_bench_{name}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, Path(__file__).with_name(f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[mod_name] = mod
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


class Router:
    """``python -m sglang_router.launch_router`` over ``workers`` on a free port (log in a temp file)."""

    def __init__(self, workers: list[str], policy: str = "cache_aware", start_timeout_s: float = 120.0) -> None:
        self.port = _load_sibling("common").free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="bench_dp_router_", suffix=".log", delete=False)
        self.proc = subprocess.Popen([sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
                                      "--port", str(self.port), "--policy", policy, "--worker-urls", *workers],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + start_timeout_s
        while not self._ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"router not ready; log: {self.log.name}")
            time.sleep(0.5)

    def _ready(self) -> bool:
        try:
            return httpx.get(self.url + "/health", timeout=2).status_code == 200 and httpx.post(
                self.url + "/generate", json={"text": "Hello", "sampling_params": {"max_new_tokens": 1}},
                timeout=30).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        _load_sibling("common").stop_process(self.proc, self.log, 30)


def summarize(result: dict, prompt_tokens: list[int]) -> dict[str, Any]:
    """The table row of one configuration from bench_serving's result and the prompt tokens each replica processed."""
    m = result["metrics"]
    reqs = [r for r in result["requests"] if r["success"]]
    prompt = sum(r["prompt_len"] for r in reqs)
    return {"requests": len(reqs), "failed": len(result["requests"]) - len(reqs),
            "hit_rate": sum(r["cached_tokens"] or 0 for r in reqs) / prompt if prompt else None,
            "mean_ttft_ms": m["mean_ttft_ms"], "median_ttft_ms": m["median_ttft_ms"],
            "output_throughput": m["output_throughput"], "request_throughput": m["request_throughput"],
            "duration_s": m["duration_s"], "prompt_tokens_per_replica": prompt_tokens}


def _prompt_tokens(server: Any) -> list[int]:
    states = httpx.get(server.url + "/get_server_info", timeout=30).json()["internal_states"]
    return [s["num_prompt_tokens"] for s in states]


def main(argv: Optional[list[str]] = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path", default="smollm2", help="a folder, .gguf, or stories260k / smollm2 (the demo)")
    ap.add_argument("--gsp-num-groups", type=int, default=8)
    ap.add_argument("--gsp-prompts-per-group", type=int, default=4)
    ap.add_argument("--gsp-system-prompt-len", type=int, default=256)
    ap.add_argument("--gsp-question-len", type=int, default=32)
    ap.add_argument("--gsp-output-len", type=int, default=16)
    ap.add_argument("--max-concurrency", type=int, default=8)
    ap.add_argument("--request-rate", default="inf")
    ap.add_argument("--max-total-tokens", type=int, default=16384, help="KV pool per replica (tokens)")
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 1, help="CPU threads in all (split between replicas)")
    ap.add_argument("--configs", default="dp1,dp2-cache_aware,dp2-round_robin,sglang-router")
    ap.add_argument("--output", default="bench_results/bench_dp.json")
    args = ap.parse_args(argv)
    bench, common = _load_sibling("bench_serving"), _load_sibling("common")

    model = common.resolve_model(args.model_path)
    if model is None:
        from radixlm.srt.model_loader import resolve_model_path

        model = resolve_model_path(None)  # converts the demo GGUF once, before any server starts
    base = ["--model-path", model, "--max-total-tokens", str(args.max_total_tokens), "--log-level", "warning"]
    half = str(max(1, args.cores // 2))
    flags = {"dp1": base + ["--cpu-threads", str(args.cores)],
             "dp2-cache_aware": base + ["--dp-size", "2", "--cpu-threads", half],
             "dp2-round_robin": base + ["--dp-size", "2", "--cpu-threads", half, "--load-balance-method", "round_robin"]}
    bench_args = ["--backend", "radixlm", "--tokenizer", model, "--dataset-name", "generated-shared-prefix",
                  "--gsp-num-groups", str(args.gsp_num_groups), "--gsp-prompts-per-group", str(args.gsp_prompts_per_group),
                  "--gsp-system-prompt-len", str(args.gsp_system_prompt_len), "--gsp-question-len", str(args.gsp_question_len),
                  "--gsp-output-len", str(args.gsp_output_len), "--max-concurrency", str(args.max_concurrency),
                  "--request-rate", args.request_rate, "--disable-tqdm",
                  "--output", os.path.join(tempfile.gettempdir(), f"bench_dp_{os.getpid()}.json")]
    rows, raw = [], {}
    for label in args.configs.split(","):
        if label == "sglang-router" and importlib.util.find_spec("sglang_router") is None:
            print("sglang-router is not installed (pip install sglang-router); skipping that configuration")
            continue
        servers = ([common.Server(base + ["--cpu-threads", half], log_prefix="bench_dp_") for _ in range(2)] if label == "sglang-router"
                   else [common.Server(flags[label], log_prefix="bench_dp_")])
        router = None
        try:
            before = [_prompt_tokens(s) for s in servers]
            url = servers[0].url
            if label == "sglang-router":
                router = Router([s.url for s in servers])
                url = router.url
                before = [_prompt_tokens(s) for s in servers]  # the router's warm-up request is not part of the run
            result = bench.main([*bench_args, "--base-url", f"{label}={url}"])["targets"][0]
            after = [_prompt_tokens(s) for s in servers]
        finally:
            if router is not None:
                router.stop()
            for s in servers:
                s.stop()
        prompt_tokens = [a - b for sa, sb in zip(after, before) for a, b in zip(sa, sb)]
        raw[label] = {"metrics": result["metrics"], "requests": result["requests"], "prompt_tokens": prompt_tokens}
        rows.append({"config": label, **summarize(result, prompt_tokens)})
    cols = ["config", "requests", "failed", "hit_rate", "mean_ttft_ms", "median_ttft_ms", "output_throughput",
            "request_throughput", "duration_s", "prompt_tokens_per_replica"]
    return common.report("bench_dp", args, model, rows, cols, raw)


if __name__ == "__main__":
    main()
