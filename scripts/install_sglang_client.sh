#!/usr/bin/env bash
# Install SGLang's Python frontend (client only) into the active Python environment, for the
# `compat` tests (tests/lang/test_compat_sglang.py) that drive `radixlm serve` with `sgl.RuntimeEndpoint`.
#
#   bash scripts/install_sglang_client.sh          # uses $PYTHON or `python`
#
# sglang itself goes in with --no-deps (its full dependency set is the GPU server); then only what
# `import sglang` and its frontend need at run time. torch is pinned to the version radixlm uses;
# torchvision is never installed (sglang does not need it for the frontend, and a mismatched build
# breaks transformers' image imports).
set -euo pipefail
PY="${PYTHON:-python}"
"$PY" -m pip install --no-deps "sglang==0.5.23"
"$PY" -m pip install "torch==2.13.0" triton numpy orjson psutil pybase64 requests pillow starlette \
    typing_extensions packaging aiohttp msgspec tqdm pydantic pyzmq IPython
"$PY" - <<'PY'
import sglang as sgl
print("sglang", getattr(sgl, "__version__", "?"), "frontend importable:", callable(sgl.RuntimeEndpoint))
PY
