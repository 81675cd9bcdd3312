"""Issue 8's serving workloads, each as one bench_serving invocation over the targets that
``peers/run_peers.sh --exec`` started (their flags in ``BENCH_TARGETS``), one JSON per workload under
``--out-dir``; then ``summary.py`` (``summary.md``, markdown tables) and ``plot.py`` (PNGs).

    bash benchmarks/run_all.sh            # starts every installed peer, runs this, stops them
    QUICK=1 bash benchmarks/run_all.sh    # a tiny version of every workload (smoke test)

Workloads (full size; ``QUICK`` ones in ``QUICK_WORKLOADS``), greedy, EOS ignored except json-schema:

- ``shared_prefix``: generated-shared-prefix 8 groups × 16 prompts, S=512, Q=32, O=32, all 128
  requests at once; every target (radixlm with and without the radix cache; hf-static batch 32).
- ``decode_heavy``: random, 64 requests, input 64–128 tokens, output 128, max concurrency 64 (all in
  flight); every target but radixlm-nocache (hf-static batch 32).
- ``random``: random, 64 requests, input 64–512, output 32–128, max concurrency 16 (hf-static
  batch 16).
- ``json_schema``: json-schema, 32 prompts, input 32–128, output ≤ 96, max concurrency 16:
  radixlm constrained vs ``radixlm-free`` (the same server, no schema sent), and vLLM likewise
  (``response_format``) when it runs. The target is the ratio of mean TPOTs.
- ``tool_calls``: tool-calls, 16 agent requests (4 tools each), output ≤ 128, max concurrency 4, on
  radixlm's ``/v1/chat/completions``: ``tool_choice`` required (calls forced by the grammar), auto, and
  none (the same requests, tools left out of the prompt, no grammar). The target: TPOT ÷ none.
- ``ngram_copy_c{1,8}`` / ``ngram_random``: n-gram speculative decoding (issue 15), radixlm vs
  ``radixlm-ngram`` (the same server flags plus ``--speculative-algorithm NGRAM``): copy-edit, 8 / 16
  prompts at max concurrency 1 / 8, and random (16 prompts, input 64–256, output 64–128, concurrency
  8). Greedy, so both must give the same text (``identical_outputs`` in the JSON).
- ``sweep_c{1,4,16,64}``: decode-heavy's shape (input 64–128, output 128) at max concurrency c with
  max(8, 2c) requests; hf-static batch c. For the throughput-vs-concurrency plot.

Target labels (``run_peers.sh``): radixlm, radixlm-nocache, radixlm-ngram, radixlm-q4, vllm, llama-server,
hf-serve, hf-static. ``radixlm-ngram`` and ``radixlm-q4`` (the sweep) only run in the workloads that name them.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
ALL = None  # every target but the ones only named workloads run (ONLY_NAMED)
NO_NOCACHE = ("radixlm", "vllm", "llama-server", "hf-serve", "hf-static")
NGRAM = ("radixlm", "radixlm-ngram")
ONLY_NAMED = ("radixlm-ngram", "radixlm-q4")
SWEEP_TARGETS = (*NO_NOCACHE, "radixlm-q4", "llama-server-q4")  # the Q4_1 demo GGUF in both, beside the float rows
SWEEP = (1, 4, 16, 64)
QUICK_SWEEP = (1, 2, 4)


def _load(name: str):
    """``benchmarks/<name>.py`` under bench_serving's private module name."""
    mod_name = f"_radixlm_bench_{name}"
    if mod_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(mod_name, HERE / f"{name}.py")
        sys.modules[mod_name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[mod_name])
    return sys.modules[mod_name]


def workloads(quick: bool) -> list[tuple[str, Optional[tuple[str, ...]], list[str]]]:
    """(name, target labels or None for all, bench_serving flags) per workload."""
    if quick:
        return [
            ("shared_prefix", ALL, ["--dataset-name", "generated-shared-prefix", "--gsp-num-groups", "2",
                                    "--gsp-prompts-per-group", "2", "--gsp-system-prompt-len", "32",
                                    "--gsp-question-len", "8", "--gsp-output-len", "8", "--hf-batch-size", "4"]),
            ("decode_heavy", NO_NOCACHE, _random(4, (8, 16), (8, 8), 4, 4)),
            ("random", NO_NOCACHE, _random(4, (8, 32), (4, 8), 2, 2)),
            ("json_schema", ("radixlm", "vllm"), ["--dataset-name", "json-schema", "--num-prompts", "2",
                                                  "--json-input-len", "16", "32", "--json-output-len", "48",
                                                  "--max-concurrency", "2"]),
            ("tool_calls", ("radixlm",), ["--dataset-name", "tool-calls", "--num-prompts", "2",
                                          "--tool-output-len", "64", "--max-concurrency", "2"]),
            *[(f"sweep_c{c}", SWEEP_TARGETS, _random(2 * c, (8, 16), (8, 8), c, c)) for c in QUICK_SWEEP],
            ("busy2_c1", NO_NOCACHE, [*_random(2, (8, 16), (8, 8), 1, 1), "--busy-procs", "2"]),
            *_ngram(True),
        ]
    return [
        ("shared_prefix", ALL, ["--dataset-name", "generated-shared-prefix", "--gsp-num-groups", "8",
                                "--gsp-prompts-per-group", "16", "--gsp-system-prompt-len", "512",
                                "--gsp-question-len", "32", "--gsp-output-len", "32", "--hf-batch-size", "32"]),
        ("decode_heavy", NO_NOCACHE, _random(64, (64, 128), (128, 128), 64, 32)),
        ("random", NO_NOCACHE, _random(64, (64, 512), (32, 128), 16, 16)),
        ("json_schema", ("radixlm", "vllm"), ["--dataset-name", "json-schema", "--num-prompts", "32",
                                              "--json-input-len", "32", "128", "--json-output-len", "96",
                                              "--max-concurrency", "16"]),
        ("tool_calls", ("radixlm",), ["--dataset-name", "tool-calls", "--num-prompts", "16",
                                      "--tool-output-len", "128", "--max-concurrency", "4"]),
        *[(f"sweep_c{c}", SWEEP_TARGETS, _random(max(8, 2 * c), (64, 128), (128, 128), c, c)) for c in SWEEP],
        # Contention: shared_prefix and concurrency 1 again with two busy processes beside the servers;
        # compare each system's row with its quiet one (the fraction of throughput it keeps).
        ("busy2_shared_prefix", NO_NOCACHE, ["--dataset-name", "generated-shared-prefix", "--gsp-num-groups", "8",
                                             "--gsp-prompts-per-group", "16", "--gsp-system-prompt-len", "512",
                                             "--gsp-question-len", "32", "--gsp-output-len", "32",
                                             "--hf-batch-size", "32", "--busy-procs", "2"]),
        ("busy2_c1", NO_NOCACHE, [*_random(8, (64, 128), (128, 128), 1, 1), "--busy-procs", "2"]),
        *_ngram(False),
    ]


def _ngram(quick: bool) -> list[tuple[str, Optional[tuple[str, ...]], list[str]]]:
    """Speculative decoding on vs off: copy-heavy at concurrency 1 and 8, random at 8."""
    def copy(n: int, conc: int, out: int) -> list[str]:
        return ["--dataset-name", "copy-edit", "--num-prompts", str(n), "--copy-output-len", str(out),
                "--max-concurrency", str(conc)]

    if quick:
        return [("ngram_copy_c1", NGRAM, copy(2, 1, 32)), ("ngram_copy_c8", NGRAM, copy(4, 4, 32)),
                ("ngram_random", NGRAM, _random(4, (8, 32), (8, 16), 4, 4))]
    return [("ngram_copy_c1", NGRAM, copy(8, 1, 256)), ("ngram_copy_c8", NGRAM, copy(16, 8, 256)),
            ("ngram_random", NGRAM, _random(16, (64, 256), (64, 128), 8, 8))]


def _random(n: int, inp: tuple[int, int], out: tuple[int, int], conc: int, hf_batch: int) -> list[str]:
    return ["--dataset-name", "random", "--num-prompts", str(n), "--random-input-len", *map(str, inp),
            "--random-output-len", *map(str, out), "--max-concurrency", str(conc), "--hf-batch-size", str(hf_batch)]


def parse_targets(flags: list[str]) -> tuple[list[str], list[tuple[str, str, str]]]:
    """``BENCH_TARGETS`` flags -> (other flags such as ``--tokenizer X``, [(label, url, backend)])."""
    other, targets, i = [], [], 0
    while i < len(flags):
        if flags[i] == "--base-url" and i + 3 < len(flags) and flags[i + 2] == "--backend":
            label, _, url = flags[i + 1].partition("=")
            targets.append((label, url, flags[i + 3]))
            i += 4
        else:
            other.append(flags[i])
            i += 1
    return other, targets


def target_flags(name: str, labels: Optional[tuple[str, ...]], targets: list[tuple[str, str, str]]) -> list[str]:
    """bench_serving target flags for one workload: the wanted labels, in run_peers order; for
    json_schema each server twice, constrained (``auto`` / vLLM ``response_format``) and ``-free``;
    for tool_calls each server three times on its chat route, ``-required``, ``-auto`` and ``-none``."""
    flags: list[str] = []
    for label, url, backend in targets:
        if (labels is None and label in ONLY_NAMED) or (labels is not None and label not in labels):
            continue
        if name == "json_schema":
            field = "response_format" if label == "vllm" else "auto"
            for lab, f in ((label, field), (f"{label}-free", "none")):
                flags += ["--base-url", f"{lab}={url}", "--backend", backend, "--json-schema-field", f]
        elif name == "tool_calls":
            for choice in ("required", "auto", "none"):
                flags += ["--base-url", f"{label}-{choice}={url}", "--backend", "openai-chat", "--tool-choice", choice]
        else:
            flags += ["--base-url", f"{label}={url}", "--backend", backend]
    return flags


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", default=os.environ.get("QUICK") == "1",
                    help="tiny workloads (default: $QUICK=1)")
    ap.add_argument("--out-dir", default=None, help="JSONs + summary.md (default bench_results, "
                                                    "QUICK: bench_results/quick)")
    ap.add_argument("--img-dir", default=None, help="PNGs (default docs/img, QUICK: <out-dir>/img)")
    ap.add_argument("--only", default="", help="comma-separated workload names (default: all)")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("THREADS", "2")), help="hf-static torch threads")
    ap.add_argument("--rounds", type=int, default=int(os.environ.get("ROUNDS", "1")),
                    help="bench_serving --rounds for every workload (default: $ROUNDS, else 1)")
    args = ap.parse_args(argv)
    flags = os.environ.get("BENCH_TARGETS")
    if not flags:
        print("run_suite: BENCH_TARGETS is not set; run it through benchmarks/run_all.sh "
              "(peers/run_peers.sh --exec python benchmarks/run_suite.py)", file=sys.stderr)
        return 2
    other, targets = parse_targets(shlex.split(flags))
    out_dir = Path(args.out_dir or ("bench_results/quick" if args.quick else "bench_results"))
    img_dir = Path(args.img_dir or (out_dir / "img" if args.quick else HERE.parent / "docs" / "img"))
    only = {w for w in args.only.split(",") if w}
    bench = _load("bench_serving")
    print(f"targets: {', '.join(label for label, _, _ in targets)}; {'QUICK' if args.quick else 'full'} workloads")
    for name, labels, wl_flags in workloads(args.quick):
        if only and name not in only:
            continue
        tflags = target_flags(name, labels, targets)
        if not tflags:
            print(f"== {name}: no target, skipped")
            continue
        argv_ = [*other, *tflags, *wl_flags, "--hf-threads", str(args.threads), "--disable-tqdm",
                 "--rounds", str(args.rounds), "--output", str(out_dir / f"{name}.json")]
        print(f"== {name}: bench_serving {shlex.join(argv_)}", flush=True)
        t0 = time.perf_counter()
        bench.main(argv_)
        print(f"== {name}: {time.perf_counter() - t0:.0f} s", flush=True)
    subprocess.run([sys.executable, str(HERE / "summary.py"), "--results-dir", str(out_dir),
                    "--output", str(out_dir / "summary.md")], check=True)
    subprocess.run([sys.executable, str(HERE / "plot.py"), "--results-dir", str(out_dir), "--out-dir", str(img_dir)],
                   check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
