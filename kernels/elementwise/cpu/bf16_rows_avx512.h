// The bf16 rows of RoPE and of the residual add + RMSNorm on AVX-512 (elementwise.cpp), with the same
// arithmetic as the at::vec paths beside them, step by step: bf16 widened exactly to fp32, each product
// and sum rounded back to bf16 where torch's bf16 ops round it (round to nearest even, NaN to 0x7FC0
// as c10::BFloat16(float); at::vec's conversion makes a NaN 0xFFFF, so NaN payloads are the one
// difference). What changes is only the cost of a rounding: bf16_avx512.h's round_to_bf16, a few
// integer ops on the fp32 lane, instead of at::vec's convert round trips,
// and RoPE widens a token's cos / sin once for all its heads instead of once per head.
#pragma once

#ifdef CPU_CAPABILITY_AVX512
#include <ATen/ATen.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <immintrin.h>

#include <cmath>

#include "bf16_avx512.h"

namespace radixlm_math {

#define RADIXLM_ROWS_TARGET __attribute__((target("avx512f,avx512bw")))

// RoPE (HF rotate-half layout) of one token's `heads` rows x (row stride xs, head_dim d, d % 32 == 0)
// into o (heads x d, contiguous), cos / sin rows c, s of d: with x1, x2 the halves,
// o1 = bf16(bf16(x1 c1) + bf16(-x2 s1)), o2 = bf16(bf16(x2 c2) + bf16(x1 s2)), as torch's bf16
// `q * cos + rotate_half(q) * sin` computes it.
RADIXLM_ROWS_TARGET inline void rope_token_bf16(const at::BFloat16* x, int64_t xs, int64_t heads,
                                                 const at::BFloat16* c, const at::BFloat16* s, at::BFloat16* o,
                                                 int64_t d) {
  const int64_t half = d / 2;
  const __m512i sign = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  for (int64_t i = 0; i < half; i += 16) {
    const __m512 c1 = load_bf16x16(c + i), c2 = load_bf16x16(c + half + i);
    const __m512 s1 = load_bf16x16(s + i), s2 = load_bf16x16(s + half + i);
    for (int64_t h = 0; h < heads; ++h) {
      const at::BFloat16* xr = x + h * xs;
      const __m512 x1 = load_bf16x16(xr + i), x2 = load_bf16x16(xr + half + i);
      const __m512 nx2 = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x2), sign));
      at::BFloat16* orow = o + h * d;
      store_bf16x16(orow + i, _mm512_add_ps(round_to_bf16(_mm512_mul_ps(x1, c1)),
                                                round_to_bf16(_mm512_mul_ps(nx2, s1))));
      store_bf16x16(orow + half + i, _mm512_add_ps(round_to_bf16(_mm512_mul_ps(x2, c2)),
                                                       round_to_bf16(_mm512_mul_ps(x1, s2))));
    }
  }
}

// One row of add_rms_norm_ in bf16 (n % 32 == 0): x += delta (rounded to bf16, in place; delta may be
// null), then o = bf16(w * bf16(x * inv)) with inv = 1 / sqrt(mean(x^2) + eps), the sum of squares in
// the at::vec path's order (one 16-lane accumulator, the two halves of each 32-element step in turn,
// at::vec's reduction), so the bits are that path's.
RADIXLM_ROWS_TARGET inline void add_rms_norm_row_bf16(at::BFloat16* x, const at::BFloat16* delta,
                                                       const at::BFloat16* w, at::BFloat16* o, int64_t n,
                                                       float eps) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 32) {
    __m512 a = load_bf16x16(x + i), b = load_bf16x16(x + i + 16);
    if (delta != nullptr) {
      a = round_to_bf16(_mm512_add_ps(a, load_bf16x16(delta + i)));
      b = round_to_bf16(_mm512_add_ps(b, load_bf16x16(delta + i + 16)));
      store_bf16x16(x + i, a);
      store_bf16x16(x + i + 16, b);
    }
    acc = _mm512_fmadd_ps(b, b, _mm512_fmadd_ps(a, a, acc));
  }
  using Vec = at::vec::Vectorized<float>;
  const float ss = at::vec::vec_reduce_all<float>([](const Vec& p, const Vec& q) { return p + q; }, Vec(acc));
  const __m512 inv = _mm512_set1_ps(1.f / std::sqrt(ss / static_cast<float>(n) + eps));
  for (int64_t j = 0; j < n; j += 16) {
    const __m512 y = round_to_bf16(_mm512_mul_ps(load_bf16x16(x + j), inv));
    store_bf16x16(o + j, _mm512_mul_ps(load_bf16x16(w + j), y));
  }
}

#undef RADIXLM_ROWS_TARGET

}  // namespace radixlm_math
#endif  // CPU_CAPABILITY_AVX512
