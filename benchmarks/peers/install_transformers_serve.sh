#!/usr/bin/env bash
# Make `transformers serve --continuous-batching` available for run_peers.sh (target hf-serve).
#
#   bash benchmarks/peers/install_transformers_serve.sh
#
# If radixlm's Python (RADIXLM_PYTHON, default python3) already has transformers' serving extras
# (fastapi, uvicorn, pydantic, openai: transformers[serving]), there is nothing to install: run_peers.sh
# runs `python -m transformers.cli.transformers serve` from it. Otherwise this creates a separate venv
# $PEERS_DIR/transformers-venv (default ~/.cache/radixlm/peers) with torch==2.13.0 first (so the
# extras cannot pull in another torch) and then transformers[serving] at radixlm's transformers version,
# which run_peers.sh then prefers. radixlm's own environment is never changed.
#
# Start (what run_peers.sh does; the first request initialises the paged cache, bench_serving's
# warm-up takes it):
#   python -m transformers.cli.transformers serve --continuous-batching --device cpu --dtype float32 \
#       --cb-num-blocks 256 --host 127.0.0.1 --port N <model folder>
# It serves /v1/completions (continuous batching included, streaming, usage in the last chunk) under
# the model name = the folder path; it rejects unknown fields (ignore_eos: 422), so bench_serving's
# hf-serve backend disables EOS with generation_config='{"eos_token_id": -1}' instead.
set -euo pipefail

PEERS_DIR="${RADIXLM_PEERS_DIR:-$HOME/.cache/radixlm/peers}"
PY="${RADIXLM_PYTHON:-python3}"
VENV="$PEERS_DIR/transformers-venv"
CHECK='from transformers.utils.import_utils import is_serve_available as a; assert a()'

if "$PY" -c "$CHECK" 2>/dev/null; then
    echo "transformers serve is available in radixlm's environment ($("$PY" -c 'import sys; print(sys.executable)')): nothing to install"
    exit 0
fi
VERSION="$("$PY" -c 'import transformers; print(transformers.__version__)' 2>/dev/null || echo "")"
mkdir -p "$PEERS_DIR"
[ -x "$VENV/bin/python" ] || "${PYTHON:-python3}" -m venv "$VENV"
"$VENV/bin/pip" install --upgrade pip
"$VENV/bin/pip" install torch==2.13.0
"$VENV/bin/pip" install "transformers[serving]${VERSION:+==$VERSION}" safetensors sentencepiece
"$VENV/bin/python" -c "$CHECK; import torch, transformers; print('transformers', transformers.__version__, 'torch', torch.__version__)"
echo "installed: $VENV"
