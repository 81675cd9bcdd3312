#!/usr/bin/env bash
# Download into .whl/ what the GPU machine lacks, for scripts/gpu_check.sh (that machine has no network).
#
# The GPU machine (device kind nvidia-h200, see the device notes): Python 3.12, torch 2.11.0+cu130,
# nvcc 13.0, transformers, safetensors, tokenizers, numpy, jinja2, requests, packaging, tqdm, einops,
# tabulate, click, ninja, nvidia-ml-py, cuda-bindings are already there. Missing: flashinfer-python
# and its apache-tvm-ffi (FlashInfer >= 0.4 JIT-compiles its kernels with nvcc through TVM-FFI, so
# one pure-Python wheel serves any torch/CUDA, torch 2.11 + CUDA 13 included), and msgspec (radixlm).
# flashinfer-python's wheel (62 MB) carries the CUDA sources of every kernel family; only 64 MiB
# travel per call, so the sources in data/csrc/<subdir>/ (MoE, MLA, Blackwell, ... kernels) are
# dropped: prefill, decode, cascade (merge_state) and sampling build from data/csrc/*.cu + headers.
#
#   bash scripts/fetch_gpu_wheels.sh          # then: run scripts/gpu_check.sh with carry [".whl"]
set -euo pipefail
cd "$(dirname "$0")/.."
FLASHINFER_VERSION=${FLASHINFER_VERSION:-0.7.2.post1}
TVM_FFI_VERSION=${TVM_FFI_VERSION:-0.1.15.post2}  # flashinfer 0.7.2.post1 needs >=0.1.11,<0.2
MSGSPEC_VERSION=${MSGSPEC_VERSION:-0.23.0}
PY=${PYTHON:-python3}
grep -qx '/.whl/' .gitignore || grep -qsx '/.whl/' .git/info/exclude || { mkdir -p .git/info && echo /.whl/ >> .git/info/exclude; }
rm -rf .whl && mkdir -p .whl
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
    -d .whl "apache-tvm-ffi==$TVM_FFI_VERSION" "msgspec==$MSGSPEC_VERSION"
$PY -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "flashinfer-python==$FLASHINFER_VERSION"
$PY - "$tmp"/flashinfer_python-*.whl .whl <<'PYEOF'
"""Rewrite the flashinfer wheel without data/csrc/<subdir>/ (RECORD updated; same file name)."""
import os, re, sys, zipfile
src, out_dir = sys.argv[1], sys.argv[2]
drop = re.compile(r"^flashinfer/data/csrc/[^/]+/")
dst = os.path.join(out_dir, os.path.basename(src))
kept = dropped = 0
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
    for info in zin.infolist():
        if drop.match(info.filename):
            dropped += 1
            continue
        data = zin.read(info.filename)
        if info.filename.endswith(".dist-info/RECORD"):
            lines = data.decode().splitlines()
            data = ("\n".join(l for l in lines if not drop.match(l)) + "\n").encode()
        zout.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
        kept += 1
print(f"{os.path.basename(dst)}: kept {kept} files, dropped {dropped}, {os.path.getsize(dst) / 2**20:.1f} MiB")
PYEOF
du -ch .whl/*.whl
