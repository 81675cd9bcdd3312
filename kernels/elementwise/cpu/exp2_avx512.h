// Vector exponentials for the AVX-512 kernels, shared by the attention's softmax
// (attention/cpu/pair_tile_attention.h) and the bf16 SiLU (silu_mul_avx512.h).
//
// exp2_ps: 2^t for 16 fp32 lanes, Cephes' single-precision exp2f polynomial on [-1/2, 1/2] (Moshier
// 1989; ~1 ulp) with 2^n applied by vscalefps: about half the instructions of Sleef's u10 expf.
// t below -150 gives 0 (2^-150 rounds to 0 either way); t above 128 gives +inf; NaN stays NaN.
#pragma once

#ifdef CPU_CAPABILITY_AVX512
#include <immintrin.h>

namespace radixlm_math {

__attribute__((target("avx512f"))) inline __m512 exp2_ps(__m512 t) {
  t = _mm512_max_ps(t, _mm512_set1_ps(-150.f));  // keeps n in range
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);  // exact, in [-1/2, 1/2]
  __m512 p = _mm512_set1_ps(1.535336188319500e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887440266574e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357674640e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471162809e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791363012e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028550421e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

// x * sigmoid(x) = x / (1 + 2^(-x log2 e)) for 16 fp32 lanes (SiLU, Elfwing et al. 2018): within a few
// fp32 ulps of x / (1 + expf(-x)) (the exponent's product rounds once more than expf's own range
// reduction); exact division, so x << 0 gives -0 as the reference does.
__attribute__((target("avx512f"))) inline __m512 silu_ps(__m512 x) {
  const __m512 e = exp2_ps(_mm512_mul_ps(x, _mm512_set1_ps(-1.44269504088896341f)));
  return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.f), e));
}

}  // namespace radixlm_math
#endif  // CPU_CAPABILITY_AVX512
