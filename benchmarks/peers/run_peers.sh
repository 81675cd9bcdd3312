#!/usr/bin/env bash
# Start radixlm and whichever peers are installed, each on a free port, and benchmark them side by
# side in ONE bench_serving invocation (same prompts, in turn; ratios vs radixlm). Peers that are
# not installed are reported as skipped. Every server this script started is stopped on exit.
#
#   bash benchmarks/peers/run_peers.sh [bench_serving flags...]
#   bash benchmarks/peers/run_peers.sh --dataset-name generated-shared-prefix --gsp-num-groups 8 \
#       --gsp-prompts-per-group 16 --gsp-system-prompt-len 512 --gsp-question-len 32 --gsp-output-len 32
#   bash benchmarks/peers/run_peers.sh --exec CMD [ARGS...]   # run CMD instead of one bench_serving,
#       # with BENCH_TARGETS = the bench_serving flags of the started targets (shell-quoted; what
#       # run_suite.py reads to run several workloads against the same servers)
#
# Targets (labels): radixlm, radixlm-nocache (--disable-radix-cache), radixlm-ngram
# (--speculative-algorithm NGRAM), radixlm-q4 (the demo GGUF, its Q4_1 blocks kept: --quantization gguf), vllm, llama-server,
# llama-server-q4 (the same demo GGUF in llama.cpp), hf-serve
# (`transformers serve --continuous-batching`), hf-static (transformers static-batch generate, run
# inside bench_serving: no server). PEERS picks them (space-separated labels); the default is
# "radixlm radixlm-ngram radixlm-q4 vllm llama-server", plus radixlm-nocache with NO_CACHE=1, hf-static with HF_STATIC=1 and
# hf-serve with HF_SERVE=1.
#
# Environment: MODEL_DIR (default: radixlm's SmolLM2 folder; vLLM refuses stories260K), THREADS (2),
# PEERS_DIR / RADIXLM_PEERS_DIR (where the install scripts put things), RADIXLM_ARGS (extra radixlm
# server flags), LLAMA_NP (llama-server slots, 64), LLAMA_GGUF (default: the SmolLM2 f32 GGUF of
# build_llama_server.sh, used only when MODEL_DIR is the default SmolLM2 folder), VLLM_KV_GB (vLLM's
# CPU KV cache, 4), HF_CB_BLOCKS (transformers serve KV blocks of 256 tokens, 256), START_TIMEOUT (s,
# 600), RADIXLM_PYTHON (python3), DTYPE (auto: what radixlm's --dtype auto picks on this CPU, bfloat16
# with AMX-BF16 / AVX512-BF16, else float32; every float server gets that --dtype; radixlm-q4 keeps its own --dtype auto, as `radixlm serve` of the GGUF does: fp32 activations for the kept blocks). The servers stay up together while each is benchmarked in turn:
# the idle ones cost little CPU.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PEERS_DIR="${RADIXLM_PEERS_DIR:-$HOME/.cache/radixlm/peers}"
PY="${RADIXLM_PYTHON:-python3}"
THREADS="${THREADS:-2}"
START_TIMEOUT="${START_TIMEOUT:-600}"
LOGS="$(mktemp -d /tmp/radixlm-peers.XXXXXX)"
DEFAULT_MODEL="$("$PY" -c 'from radixlm.srt.model_loader import resolve_model_path; print(resolve_model_path(None))')"
MODEL_DIR="${MODEL_DIR:-$DEFAULT_MODEL}"
DTYPE="${DTYPE:-auto}"
if [ "$DTYPE" = auto ]; then
    DTYPE="$("$PY" -c 'from radixlm.srt.cpu_runtime import cpu_info, prefers_bf16; print("bfloat16" if prefers_bf16(cpu_info()) else "float32")')"
fi
echo "dtype: $DTYPE (radixlm, vLLM, transformers); llama-server runs its GGUF's own types"
export OMP_NUM_THREADS="$THREADS"
if [ -z "${PEERS:-}" ]; then
    PEERS="radixlm radixlm-ngram radixlm-q4 vllm llama-server"
    [ "${NO_CACHE:-0}" = 1 ] && PEERS="$PEERS radixlm-nocache"
    [ "${HF_STATIC:-0}" = 1 ] && PEERS="$PEERS hf-static"
    [ "${HF_SERVE:-0}" = 1 ] && PEERS="$PEERS hf-serve"
fi
want() { [[ " $PEERS " == *" $1 "* ]]; }

PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT INT TERM

free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# wait_healthy NAME URL PID: poll URL/health until 200 (or the process died / timed out)
wait_healthy() {
    local name="$1" url="$2" pid="$3" waited=0
    until curl -sf -o /dev/null "$url/health"; do
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "$name exited during startup; log: $LOGS/$name.log" >&2; tail -20 "$LOGS/$name.log" >&2; return 1
        fi
        if [ "$waited" -ge "$START_TIMEOUT" ]; then echo "$name not healthy after ${START_TIMEOUT}s" >&2; return 1; fi
        sleep 2; waited=$((waited + 2))
    done
    echo "$name ready at $url (${waited}s)"
}

TARGETS=()
STARTED=0
# start NAME BACKEND CMD...: CMD gets --port appended by the caller; adds the target when healthy
# (STARTED=1) or reports it skipped (STARTED=0)
start() {
    local name="$1" backend="$2" port="$3"; shift 3
    "$@" > "$LOGS/$name.log" 2>&1 &
    local pid=$!
    PIDS+=("$pid")
    if wait_healthy "$name" "http://127.0.0.1:$port" "$pid"; then
        TARGETS+=(--base-url "$name=http://127.0.0.1:$port" --backend "$backend")
        STARTED=1
    else
        echo "skipped: $name (did not start)"
        STARTED=0
    fi
}

read -r -a RADIXLM_USER <<< "${RADIXLM_ARGS:-}"
RADIXLM_EXTRA=(--dtype "$DTYPE" "${RADIXLM_USER[@]}")
if want radixlm; then
    port=$(free_port)
    start radixlm radixlm "$port" "$PY" -m radixlm.srt.launch_server --model-path "$MODEL_DIR" --port "$port" \
        "${RADIXLM_EXTRA[@]}"
fi
if want radixlm-nocache; then
    port=$(free_port)
    start radixlm-nocache radixlm "$port" "$PY" -m radixlm.srt.launch_server --model-path "$MODEL_DIR" \
        --port "$port" --disable-radix-cache "${RADIXLM_EXTRA[@]}"
fi
if want radixlm-q4; then  # the demo GGUF with its Q4_1 blocks kept (radixlm serve's default for it)
    if [ "$MODEL_DIR" = "$DEFAULT_MODEL" ]; then
        port=$(free_port)
        DEMO_GGUF="$("$PY" -c 'from radixlm.srt.model_loader import find_demo_model; print(find_demo_model())')"
        start radixlm-q4 radixlm "$port" "$PY" -m radixlm.srt.launch_server --model-path "$DEMO_GGUF" \
            --quantization gguf --port "$port" "${RADIXLM_USER[@]}"  # its own --dtype auto, as radixlm serve
    else
        echo "skipped: radixlm-q4 (only for the default SmolLM2 model)"
    fi
fi
if want radixlm-ngram; then
    port=$(free_port)
    start radixlm-ngram radixlm "$port" "$PY" -m radixlm.srt.launch_server --model-path "$MODEL_DIR" \
        --port "$port" --speculative-algorithm NGRAM "${RADIXLM_EXTRA[@]}"
fi

VLLM_PY="$PEERS_DIR/vllm-venv/bin/python"
if ! want vllm; then
    :
elif [ -x "$VLLM_PY" ] && "$VLLM_PY" -c 'import vllm' 2>/dev/null; then
    port=$(free_port)
    # nobind: vLLM's default ("auto") pins its OpenMP threads and reserves a core for its scheduler
    # process (on 2 cores: 1 thread); nobind leaves OMP_NUM_THREADS=$THREADS threads, unpinned, as the others.
    # VLLM_SERVER_DEV_MODE=1 adds POST /reset_prefix_cache, which bench_serving calls before every round
    # as it calls radixlm's /flush_cache: without it a repeated workload (--rounds, the busy rerun of
    # shared_prefix) finds its shared prefixes already cached in vLLM and skips half of its prefill.
    VLLM_SERVER_DEV_MODE=1 \
    VLLM_CPU_OMP_THREADS_BIND="${VLLM_CPU_OMP_THREADS_BIND:-nobind}" VLLM_CPU_KVCACHE_SPACE="${VLLM_KV_GB:-4}" \
        start vllm openai "$port" "$VLLM_PY" -m vllm.entrypoints.openai.api_server \
        --model "$MODEL_DIR" --dtype "$DTYPE" --enable-prefix-caching --enable-prompt-tokens-details \
        --host 127.0.0.1 --port "$port"
else
    echo "skipped: vllm (not installed; bash $HERE/install_vllm_cpu.sh)"
fi

LLAMA_BIN="$PEERS_DIR/llama.cpp/bin/llama-server"
if [ -z "${LLAMA_GGUF:-}" ] && [ "$MODEL_DIR" = "$DEFAULT_MODEL" ]; then LLAMA_GGUF="$PEERS_DIR/gguf/smollm2-f32.gguf"; fi
if ! want llama-server; then
    :
elif [ -z "${LLAMA_GGUF:-}" ]; then
    echo "skipped: llama-server (no GGUF of $MODEL_DIR; set LLAMA_GGUF)"
elif [ -x "$LLAMA_BIN" ] && [ -f "$LLAMA_GGUF" ]; then
    port=$(free_port)
    np="${LLAMA_NP:-64}"
    start llama-server openai "$port" "$LLAMA_BIN" -m "$LLAMA_GGUF" -np "$np" -c $((np * 1024)) \
        -t "$THREADS" -tb "$THREADS" --host 127.0.0.1 --port "$port"
else
    echo "skipped: llama-server (not built; bash $HERE/build_llama_server.sh)"
fi
if want llama-server-q4; then  # the demo GGUF's own Q4_1 blocks, as radixlm-q4 serves them
    if [ -x "$LLAMA_BIN" ] && [ "$MODEL_DIR" = "$DEFAULT_MODEL" ]; then
        port=$(free_port)
        np="${LLAMA_NP:-64}"
        DEMO_GGUF="$("$PY" -c 'from radixlm.srt.model_loader import find_demo_model; print(find_demo_model())')"
        q4=("$LLAMA_BIN" -m "$DEMO_GGUF" -np "$np" -c $((np * 1024)) -t "$THREADS" -tb "$THREADS" --host 127.0.0.1)
        start llama-server-q4 openai "$port" "${q4[@]}" --port "$port"
        if [ "$STARTED" = 0 ]; then
            # llama.cpp repacks Q4 weights for its AVX-512 / AMX kernels at load; that repack crashed
            # (SIGSEGV) on an AMX Xeon (2026-12-03). Its own switch keeps the blocks as stored.
            echo "llama-server-q4: retrying with --no-repack"
            port=$(free_port)
            start llama-server-q4 openai "$port" "${q4[@]}" --no-repack --port "$port"
        fi
    else
        echo "skipped: llama-server-q4 (needs the llama-server build and the default SmolLM2 model)"
    fi
fi

# transformers serve: radixlm's Python when it has the serving extras, else install_transformers_serve.sh's venv
HF_PY="$PEERS_DIR/transformers-venv/bin/python"
[ -x "$HF_PY" ] || HF_PY="$PY"
if ! want hf-serve; then
    :
elif "$HF_PY" -c 'from transformers.utils.import_utils import is_serve_available as a; assert a()' 2>/dev/null; then
    port=$(free_port)
    start hf-serve hf-serve "$port" "$HF_PY" -m transformers.cli.transformers serve --continuous-batching \
        --device cpu --dtype "$DTYPE" --cb-num-blocks "${HF_CB_BLOCKS:-256}" --host 127.0.0.1 --port "$port" \
        "$MODEL_DIR"
else
    echo "skipped: hf-serve (transformers serving extras missing; bash $HERE/install_transformers_serve.sh)"
fi

if want hf-static; then  # in-process in bench_serving: no server to start
    TARGETS+=(--base-url "hf-static=$MODEL_DIR" --backend hf-static)
fi

if [ "${#TARGETS[@]}" -eq 0 ]; then echo "no target started; logs in $LOGS" >&2; exit 1; fi
TARGETS=(--tokenizer "$MODEL_DIR" "${TARGETS[@]}")
if [ "${1:-}" = "--exec" ]; then
    shift
    BENCH_TARGETS="$(printf '%q ' "${TARGETS[@]}")" "$@"
else
    "$PY" "$HERE/../bench_serving.py" "${TARGETS[@]}" "$@"
fi
echo "server logs: $LOGS"
