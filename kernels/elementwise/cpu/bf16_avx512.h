// bf16 <-> fp32 on 16 AVX-512 lanes, the one copy the CPU kernels share (elementwise rows, SwiGLU, the
// bf16 GEMMs' output, the attention's output): widening is exact (a bf16 is the top half of an fp32);
// rounding is c10::BFloat16(float)'s, to nearest even with NaN to 0x7FC0.
#pragma once

#ifdef CPU_CAPABILITY_AVX512
#include <ATen/ATen.h>
#include <immintrin.h>

namespace radixlm_math {

__attribute__((target("avx512f"))) inline __m512 widen_bf16x16(__m256i h) {  // exact
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

__attribute__((target("avx512f"))) inline __m512 load_bf16x16(const at::BFloat16* p) {  // 16 bf16, widened
  return widen_bf16x16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// float(c10::BFloat16(v)) for 16 lanes: v rounded to bf16 and widened back, in the fp32 lane.
__attribute__((target("avx512f"))) inline __m512 round_to_bf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i bias = _mm512_add_epi32(_mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)),
                                        _mm512_set1_epi32(0x7FFF));
  __m512i r = _mm512_and_si512(_mm512_add_epi32(u, bias), _mm512_set1_epi32(static_cast<int>(0xFFFF0000u)));
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC00000));
  return _mm512_castsi512_ps(r);
}

// The 16 bf16 of c10::BFloat16(v) for 16 lanes.
__attribute__((target("avx512f,avx512bw"))) inline __m256i round_bf16x16(__m512 v) {
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(round_to_bf16(v)), 16));
}

__attribute__((target("avx512f,avx512bw"))) inline void store_bf16x16(at::BFloat16* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), round_bf16x16(v));
}

}  // namespace radixlm_math
#endif  // CPU_CAPABILITY_AVX512
