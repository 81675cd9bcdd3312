// The bf16 pair-panel layout for AVX512-BF16 (vdpbf16ps; Intel Cooper Lake / Sapphire Rapids, AMD Zen 4 / 5).
//
// vdpbf16ps multiplies 32 bf16 pairs and adds each pair's two exact products into one of 16 fp32
// accumulators, 32 multiply-adds per instruction where the widening kernel (microkernel.h) does 16.
// A bf16 weight is then packed in *pair* panels: 16 output columns, k-major in pairs of k,
//   panel[(k / 2) * 32 + 2 * j + (k % 2)] = w[j, k]    (K even),
// so one 64-byte load holds k and k + 1 for the panel's 16 columns, and x[m, k], x[m, k + 1] are one
// 32-bit broadcast. Each output element is still one chain over k = 0, 2, 4, ... in order, in fp32,
// rounded to bf16 once after the bias add: a row's result does not depend on the batch, the tile or
// the thread (batch invariance, as in microkernel.h). The chain differs from the widening kernel's
// (two products per step), so the pair layout is chosen once per CPU and used by pack and multiply alike.
//
// The tiles that multiply these panels are bf16_packed_avx512.h's; they carry target("avx512bf16") and
// run only where the CPU reports the feature (use_bf16_pairs), so the build still runs on AVX-512 CPUs
// without it.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace radixlm_gemm {

// Whether a bf16 weight with K input features in panels of pw columns is packed and multiplied in pairs.
inline bool use_bf16_pairs(int64_t K, int64_t pw) {
#ifdef CPU_CAPABILITY_AVX512
  static const bool has = __builtin_cpu_supports("avx512bf16");
  return has && pw == 16 && K % 2 == 0;
#else
  (void)K, (void)pw;
  return false;
#endif
}

}  // namespace radixlm_gemm
