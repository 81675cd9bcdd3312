// bf16 GEMM tiles on AVX512-BF16 (vdpbf16ps; Intel Cooper Lake / Sapphire Rapids, AMD Zen 4 / 5).
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
// Compiled for AVX-512 builds only; the tiles carry target("avx512bf16") and run only where the CPU
// reports the feature (use_bf16_pairs), so the build still runs on AVX-512 CPUs without it.
#pragma once

#include <ATen/ATen.h>

#include "microkernel.h"

#include <cstdint>
#include <cstring>

#ifdef CPU_CAPABILITY_AVX512
#include <immintrin.h>
#endif

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

#ifdef CPU_CAPABILITY_AVX512
constexpr int kPairTileRows = 12;

template <int R>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void bf16_pair_tile(
    const at::BFloat16* x, int64_t ldx, const at::BFloat16* panel, int64_t K, at::BFloat16* y, int64_t ldy,
    const at::BFloat16* bias) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 2) {
    const __m512bh b = (__m512bh)_mm512_loadu_si512(panel + k * 16);
    for (int r = 0; r < R; ++r) {
      int32_t pair;
      std::memcpy(&pair, x + r * ldx + k, 4);
      acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)_mm512_set1_epi32(pair), b);
    }
  }
  for (int r = 0; r < R; ++r) {
    alignas(64) float v[16];
    _mm512_store_ps(v, acc[r]);
    at::BFloat16* o = y + r * ldy;
    for (int j = 0; j < 16; ++j) o[j] = static_cast<at::BFloat16>(bias != nullptr ? v[j] + static_cast<float>(bias[j]) : v[j]);
  }
}

// Rows [m0, m1) of x times one pair panel (y offset to the panel's first column), tiles of near-equal height.
inline void bf16_pair_panel_rows(const at::BFloat16* x, int64_t ldx, int64_t m0, int64_t m1, const at::BFloat16* panel,
                                 int64_t K, at::BFloat16* y, int64_t ldy, const at::BFloat16* bias) {
  near_equal_tiles<kPairTileRows>(m0, m1, [&](auto r, int64_t m) {
    bf16_pair_tile<decltype(r)::value>(x + m * ldx, ldx, panel, K, y + m * ldy, ldy, bias);
  });
}
#endif

}  // namespace radixlm_gemm
