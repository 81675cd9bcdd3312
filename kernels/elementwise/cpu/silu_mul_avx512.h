// SwiGLU's elementwise half, silu(gate) * up on 16 bf16 lanes (AVX-512), shared by silu_and_mul
// (elementwise.cpp) and the gate-up linear that ends in it (gemm/cpu/swiglu.cpp), so the two give the
// same bits. Arithmetic as torch's two bf16 ops: silu in fp32 (exp2_avx512.h's silu_ps), rounded to
// bf16, times up in fp32, rounded to bf16; rounding to nearest even, NaN to 0x7FC0 (c10::BFloat16).
#pragma once

#ifdef CPU_CAPABILITY_AVX512
#include <ATen/ATen.h>
#include <immintrin.h>

#include "exp2_avx512.h"

namespace radixlm_math {

__attribute__((target("avx512f"))) inline __m512 widen_bf16x16(__m256i h) {  // exact
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

__attribute__((target("avx512f,avx512bw"))) inline __m256i round_bf16x16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i bias = _mm512_add_epi32(_mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)),
                                        _mm512_set1_epi32(0x7FFF));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
  return _mm512_cvtepi32_epi16(r);
}

// o[0..16) = bf16(bf16(silu(g)) * u) for 16 lanes.
__attribute__((target("avx512f,avx512bw"))) inline void silu_mul_bf16x16(const at::BFloat16* g, const at::BFloat16* u,
                                                                     at::BFloat16* o) {
  const __m512 s = widen_bf16x16(round_bf16x16(silu_ps(widen_bf16x16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g))))));
  const __m512 y = _mm512_mul_ps(s, widen_bf16x16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(u))));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), round_bf16x16(y));
}

}  // namespace radixlm_math
#endif  // CPU_CAPABILITY_AVX512
