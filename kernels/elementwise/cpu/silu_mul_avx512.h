// SwiGLU's elementwise half, silu(gate) * up on 16 bf16 lanes (AVX-512), shared by silu_and_mul
// (elementwise.cpp) and the gate-up linear that ends in it (gemm/cpu/swiglu.cpp), so the two give the
// same bits. Arithmetic as torch's two bf16 ops: silu in fp32 (exp2_avx512.h's silu_ps), rounded to
// bf16, times up in fp32, rounded to bf16; rounding to nearest even, NaN to 0x7FC0 (c10::BFloat16).
#pragma once

#ifdef CPU_CAPABILITY_AVX512
#include <ATen/ATen.h>
#include <immintrin.h>

#include "bf16_avx512.h"
#include "exp2_avx512.h"

namespace radixlm_math {

// o[0..16) = bf16(bf16(silu(g)) * u) for 16 lanes.
__attribute__((target("avx512f,avx512bw"))) inline void silu_mul_bf16x16(const at::BFloat16* g, const at::BFloat16* u,
                                                                     at::BFloat16* o) {
  const __m512 s = round_to_bf16(silu_ps(load_bf16x16(g)));
  store_bf16x16(o, _mm512_mul_ps(s, load_bf16x16(u)));
}

}  // namespace radixlm_math
#endif  // CPU_CAPABILITY_AVX512
