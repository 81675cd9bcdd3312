#!/usr/bin/env bash
# The GPU check, in one command for the GPU machine (device kind nvidia-h200: Python 3.12,
# torch 2.11.0+cu130, nvcc 13.0, no network). Prepare here with `bash scripts/fetch_gpu_wheels.sh`, then
# call the device tool with:  command "bash scripts/gpu_check.sh", carry [".whl"], timeout_s 600.
#
# Stages (each under its own time limit; the whole run stays under ~9 minutes):
#   1. install the carried wheels (.whl/: flashinfer-python, apache-tvm-ffi, msgspec) and radixlm;
#   2. JIT-compile FlashInfer's kernels used here (bf16, head_dim 64: prefill/ragged + tensor-core
#      decode, CUDA-core decode, merge_state, sampling), four builds in parallel, timed;
#   3. pytest -m gpu tests/gpu (FlashInfer vs torch_native, engine vs transformers, CUDA graphs, sampling);
#   4. benchmarks/bench_one_batch.py on a random-weight model of SmolLM2-135M's shapes (the real
#      weights, 98 MB, do not fit in the 64 MiB that travels).
# A short report is printed at the end; logs and the benchmark JSON are left in $OUT.
# Compiled kernels stay in ~/.cache/flashinfer while the machine is warm: if stage 2 ran out of
# time, calling again at once resumes with what was built.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
SITE=/tmp/radixlm_site
PY=${PY:-python3}
WHEELS=${WHEELS:-.whl/*.whl}
BENCH_ARGS=${BENCH_ARGS:-"--batch-sizes 1 8 32 --input-lens 128 512 --output-lens 32"}
T0=$(date +%s)
declare -a REPORT

stage() {  # stage NAME LIMIT_S "COMMAND": run with a time limit, log to $OUT/NAME.log, record status
  local name=$1 limit=$2 cmd=$3
  local t=$(date +%s)
  echo "=== $name (limit ${limit}s)"
  timeout --kill-after=10 "$limit" bash -c "$cmd" > "$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$OUT/$name.log"
  REPORT+=("$(printf '%-10s rc=%-3s %4ss' "$name" "$rc" "$(( $(date +%s) - t ))")")
  return $rc
}

# ---- 1. install ---------------------------------------------------------------------------------
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
# FlashInfer derives CUDA_HOME from nvcc's path; a wrapper script outside the toolkit would mislead it.
[[ -z "${CUDA_HOME:-}" && -d /usr/local/cuda/lib64 ]] && export CUDA_HOME=/usr/local/cuda
CUDA_DIR=${CUDA_HOME:-/usr/local/cuda}
# The sampling kernels include <curand.h>; take it from a pip nvidia-curand if the toolkit lacks it.
if [[ ! -f "$CUDA_DIR/include/curand.h" ]]; then
  inc=$(find /opt /usr/local /usr/lib /usr/include -path "*nvidia*" -name curand.h 2>/dev/null | head -n 1)
  [[ -n "$inc" ]] && export FLASHINFER_EXTRA_CUDAFLAGS="-I$(dirname "$inc")"
fi
# JIT modules link with -lcuda: without the toolkit's stub, point the linker at the driver's library.
if [[ ! -f "$CUDA_DIR/lib64/stubs/libcuda.so" && ! -f "$CUDA_DIR/lib64/libcuda.so" ]]; then
  lib=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so/ {print $NF; exit}')
  [[ -z "$lib" ]] && lib=$(find /usr/local/nvidia /usr/lib -name 'libcuda.so*' 2>/dev/null | head -n 1)
  if [[ -n "$lib" ]]; then
    mkdir -p /tmp/cuda_link && ln -sf "$lib" /tmp/cuda_link/libcuda.so
    export FLASHINFER_EXTRA_LDFLAGS="-L/tmp/cuda_link"
  fi
fi
do_install() {
  set -e
  ls $WHEELS
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" $WHEELS
  # radixlm itself as a symlink farm of the checkout (pyproject maps radixlm.<folder> to <folder>)
  mkdir -p "$SITE/radixlm"
  for f in _radixlm/*.py; do ln -sf "$PWD/$f" "$SITE/radixlm/"; done
  for d in lang srt radix_cache managers constrained kernels; do ln -sfn "$PWD/$d" "$SITE/radixlm/$d"; done
  PYTHONPATH=$SITE $PY - <<'EOF'
import torch, flashinfer, radixlm.kernels.attention.flashinfer_backend as fb, transformers
cuda = torch.cuda.is_available()
print("gpu", torch.cuda.get_device_name() if cuda else "NONE", "cc", torch.cuda.get_device_capability() if cuda else "-",
      "torch", torch.__version__,
      "cuda", torch.version.cuda, "flashinfer", flashinfer.__version__, "transformers", transformers.__version__)
EOF
  nvcc --version | tail -n 2
  echo "CUDA_HOME=${CUDA_HOME:-} FLASHINFER_EXTRA_CUDAFLAGS=${FLASHINFER_EXTRA_CUDAFLAGS:-} FLASHINFER_EXTRA_LDFLAGS=${FLASHINFER_EXTRA_LDFLAGS:-}"
}
export OUT SITE PY PATH WHEELS
export -f do_install
stage install 120 do_install || { printf '%s\n' "${REPORT[@]}"; exit 1; }
export PYTHONPATH=$SITE:$PWD

# ---- 2. JIT warm-up + the benchmark model, in parallel -------------------------------------------
warm() {  # warm WHAT: build (and smoke-run) one group of FlashInfer modules
  $PY - "$1" <<'EOF'
import sys, time, torch
what = sys.argv[1]
t = time.time()
dev, bf = "cuda", torch.bfloat16
if what in ("prefill", "decode"):
    from radixlm.kernels.attention.flashinfer_backend import FlashInferAttnBackend
    from radixlm.srt.forward_batch import ForwardBatch
    from tests.kernels.paged_batches import cache_prompt, finish_step, make_setup, mixed_prompts, schedule_decode, schedule_extend
    h, kvh = (8, 2) if what == "prefill" else (9, 3)  # group 4: tensor-core decode; 3: CUDA-core decode
    setup = make_setup(16, kv_heads=kvh, head_dim=64, dtype=bf, device=dev)
    earlier, prompts = mixed_prompts(16)
    backend = FlashInferAttnBackend(h, kvh, 64, 0.125)
    batches = []
    if what == "prefill":
        cache_prompt(setup, earlier)
        reqs, b = schedule_extend(setup, prompts)
        batches.append(b)
    else:
        reqs, b = schedule_extend(setup, prompts[1:2])
        finish_step(reqs)
        batches.append(schedule_decode(setup, reqs))
    for b in batches:
        fb = ForwardBatch.init_new(b, setup.req_to_token_pool, setup.kv_pool, backend, torch.device(dev))
        n = len(b.input_ids)
        backend.forward(torch.randn(n, h * 64, device=dev, dtype=bf), torch.randn(n, kvh * 64, device=dev, dtype=bf),
                        torch.randn(n, kvh * 64, device=dev, dtype=bf), 0, fb)
elif what == "cascade":
    import flashinfer
    v, s = torch.randn(4, 8, 64, device=dev, dtype=bf), torch.randn(4, 8, device=dev)
    flashinfer.merge_state(v, s, v, s)
elif what == "sampling":
    import flashinfer.sampling as fs
    probs = torch.softmax(torch.randn(4, 128, device=dev), -1)
    fs.top_k_top_p_sampling_from_probs(probs, torch.full((4,), 5, dtype=torch.int32, device=dev),
                                       torch.full((4,), 0.9, device=dev), filter_apply_order="joint")
    fs.sampling_from_probs(probs)
torch.cuda.synchronize()
print(f"{what}: built and ran in {time.time() - t:.1f} s")
EOF
}
warm_all() {
  local pids=() rc=0
  for w in prefill decode cascade sampling; do warm "$w" > "$OUT/warm_$w.txt" 2>&1 & pids+=($!); done
  $PY -m tests.gpu.helpers make-model --preset smollm2 --out /tmp/smollm2-random > /dev/null 2>&1 & pids+=($!)
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  for w in prefill decode cascade sampling; do tail -n 3 "$OUT/warm_$w.txt"; done
  rm -f "$OUT"/warm_*.txt
  ls /tmp/smollm2-random/config.json
  return $rc
}
export -f warm warm_all
stage jit 270 warm_all

# ---- 3. GPU tests ---------------------------------------------------------------------------------
remaining=$(( 540 - ($(date +%s) - T0) ))
test_limit=$(( remaining > 300 ? 210 : remaining - 90 ))
(( test_limit < 30 )) && test_limit=30
stage pytest "$test_limit" "$PY -m pytest tests/gpu -m gpu -q -rs --durations=8 -p no:cacheprovider"

# ---- 4. benchmark -----------------------------------------------------------------------------------
remaining=$(( 560 - ($(date +%s) - T0) ))
(( remaining < 30 )) && remaining=30
stage bench "$remaining" "$PY benchmarks/bench_one_batch.py --model /tmp/smollm2-random $BENCH_ARGS --page-size 16 \
  --output $OUT/bench_one_batch.json"

# ---- report -----------------------------------------------------------------------------------------
echo
echo "=== gpu_check report ($(( $(date +%s) - T0 )) s)"
grep -E '^gpu |release|^CUDA_HOME' "$OUT/install.log" || true
printf '%s\n' "${REPORT[@]}"
grep -E '^[a-z]+: built and ran' "$OUT/jit.log" || true
grep -E '(passed|failed|error|skipped)' "$OUT/pytest.log" | tail -n 1
grep -A 8 -E '^ *batch' "$OUT/bench.log" | head -n 9
