#!/usr/bin/env bash
# Build llama.cpp's C++ `llama-server` (continuous batching with -np N) and an f32 GGUF of SmolLM2.
#
#   bash benchmarks/peers/build_llama_server.sh       # ~20 min on 2 cores; cached afterwards
#
# Source: the llama-cpp-python==0.3.36 source package from PyPI, whose vendor/llama.cpp is a full
# llama.cpp tree (no other download). Built with cmake -DGGML_NATIVE=ON -DLLAMA_CURL=OFF
# -DLLAMA_OPENSSL=OFF, target llama-server only, statically linked; the binary is cached under $PEERS_DIR/llama.cpp/bin
# and the build is skipped when it is there. The GGUF is written by that tree's
# convert_hf_to_gguf.py (--outtype f32) from radixlm's SmolLM2 folder (or $MODEL_DIR), using its
# vendored gguf-py and radixlm's Python (torch, transformers, safetensors, sentencepiece).
#
# Start (what run_peers.sh does):
#   $PEERS_DIR/llama.cpp/bin/llama-server -m $PEERS_DIR/gguf/smollm2-f32.gguf -np 64 -c 65536 -t 2 --port N
set -euo pipefail

PEERS_DIR="${RADIXLM_PEERS_DIR:-$HOME/.cache/radixlm/peers}"
PY="${RADIXLM_PYTHON:-python3}"               # a Python with radixlm installed
JOBS="${JOBS:-$(nproc)}"
VERSION=0.3.36
SRC="$PEERS_DIR/llama_cpp_python-$VERSION"
BIN="$PEERS_DIR/llama.cpp/bin/llama-server"
GGUF="$PEERS_DIR/gguf/smollm2-f32.gguf"

mkdir -p "$PEERS_DIR" "$PEERS_DIR/llama.cpp/bin" "$PEERS_DIR/gguf"
if [ ! -d "$SRC/vendor/llama.cpp" ]; then
    "$PY" -m pip download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$PEERS_DIR/sdist"
    tar xzf "$PEERS_DIR/sdist/llama_cpp_python-$VERSION.tar.gz" -C "$PEERS_DIR"
fi
LLAMA="$SRC/vendor/llama.cpp"

if [ ! -x "$BIN" ]; then
    cmake -S "$LLAMA" -B "$LLAMA/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
        -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DBUILD_SHARED_LIBS=OFF
    cmake --build "$LLAMA/build" --target llama-server -j "$JOBS"
    cp "$LLAMA/build/bin/llama-server" "$BIN"
fi
"$BIN" --version

if [ ! -f "$GGUF" ]; then
    MODEL_DIR="${MODEL_DIR:-$("$PY" -c 'from radixlm.srt.model_loader import resolve_model_path; print(resolve_model_path(None))')}"
    PYTHONPATH="$LLAMA/gguf-py${PYTHONPATH:+:$PYTHONPATH}" \
        "$PY" "$LLAMA/convert_hf_to_gguf.py" "$MODEL_DIR" --outtype f32 --outfile "$GGUF"
fi
ls -la "$BIN" "$GGUF"
